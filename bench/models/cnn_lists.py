#!/usr/bin/env python3
"""Writes the tensor lists of the ImageNet CNNs in bench/models (gradcomp plan's --model FILE).

    python3 bench/models/cnn_lists.py bench/models   # resnet50/101/152, vgg16, inception3.txt

Each line is `name d0 [d1] macs=M`: the tensor's matrix (a conv weight is out x in*kh*kw) and
the multiply-adds per sample of the backward work that must run before the tensor's
gradient is final and after the previous tensor's: for a weight, its layer's forward
multiply-adds (a backward pass costs about twice the forward, so the shares are the same);
for a bias or a batch-norm scale and shift, the elements of the layer's output (one
reduction over them). The cost model spreads the backward time over the tensors by these
shares; without macs= it spreads it by element count, which is right for fully connected
layers and wrong for convolutions (VGG-16's fully connected layers hold 89 % of its
parameters and 1 % of its multiply-adds).

Shapes only: the architectures' arithmetic at their ImageNet input size, no framework needed.
"""
import os
import sys


class Net:
    def __init__(self):
        self.lines = []
        self.params = 0
        self.macs = 0

    def add(self, name, dims, macs):
        n = 1
        for d in dims:
            n *= d
        self.params += n
        self.macs += macs
        self.lines.append("%s %s macs=%d" % (name, " ".join(str(d) for d in dims), macs))

    def conv(self, name, cin, cout, k, hw_out, bias=False):
        self.add(name + ".weight", (cout, cin * k * k), cout * cin * k * k * hw_out * hw_out)
        if bias:
            self.add(name + ".bias", (cout,), cout * hw_out * hw_out)

    def bn(self, name, c, hw):
        self.add(name + ".weight", (c,), c * hw * hw)
        self.add(name + ".bias", (c,), c * hw * hw)

    def fc(self, name, fin, fout):
        self.add(name + ".weight", (fout, fin), fin * fout)
        self.add(name + ".bias", (fout,), fout)


def resnet(blocks):
    """torchvision's ResNet (v1.5: the stride on the 3x3 conv of a bottleneck)."""
    net = Net()
    net.conv("conv1", 3, 64, 7, 112)
    net.bn("bn1", 64, 112)
    cin, hw = 64, 56  # after the 3x3/2 max pool
    for stage, (count, width) in enumerate(zip(blocks, (64, 128, 256, 512))):
        for b in range(count):
            p = "layer%d.%d" % (stage + 1, b)
            stride = 2 if b == 0 and stage > 0 else 1
            out_hw = hw // stride
            net.conv(p + ".conv1", cin, width, 1, hw)
            net.bn(p + ".bn1", width, hw)
            net.conv(p + ".conv2", width, width, 3, out_hw)
            net.bn(p + ".bn2", width, out_hw)
            net.conv(p + ".conv3", width, 4 * width, 1, out_hw)
            net.bn(p + ".bn3", 4 * width, out_hw)
            if b == 0:
                net.conv(p + ".downsample.0", cin, 4 * width, 1, out_hw)
                net.bn(p + ".downsample.1", 4 * width, out_hw)
            cin, hw = 4 * width, out_hw
    net.fc("fc", 2048, 1000)
    return net


def vgg16():
    """VGG-16 (configuration D), no batch norm, as in tf_cnn_benchmarks and torchvision."""
    net = Net()
    cin, hw = 3, 224
    for block, (convs, width) in enumerate(((2, 64), (2, 128), (3, 256), (3, 512), (3, 512))):
        for c in range(convs):
            net.conv("conv%d_%d" % (block + 1, c + 1), cin, width, 3, hw, bias=True)
            cin = width
        hw //= 2
    net.fc("fc6", 512 * 7 * 7, 4096)
    net.fc("fc7", 4096, 4096)
    net.fc("fc8", 4096, 1000)
    return net


def inception3():
    """Inception v3 at 299 x 299 (torchvision's layout, without the auxiliary classifier,
    which training at scale commonly drops): every conv is a BasicConv2d, conv + batch norm
    with scale and shift."""
    net = Net()

    def bconv(name, cin, cout, kh, kw, hw):
        net.add(name + ".conv.weight", (cout, cin * kh * kw), cout * cin * kh * kw * hw * hw)
        net.bn(name + ".bn", cout, hw)

    bconv("Conv2d_1a_3x3", 3, 32, 3, 3, 149)
    bconv("Conv2d_2a_3x3", 32, 32, 3, 3, 147)
    bconv("Conv2d_2b_3x3", 32, 64, 3, 3, 147)
    bconv("Conv2d_3b_1x1", 64, 80, 1, 1, 73)
    bconv("Conv2d_4a_3x3", 80, 192, 3, 3, 71)
    cin = 192
    for name, pool in (("Mixed_5b", 32), ("Mixed_5c", 64), ("Mixed_5d", 64)):  # A, 35 x 35
        bconv(name + ".branch1x1", cin, 64, 1, 1, 35)
        bconv(name + ".branch5x5_1", cin, 48, 1, 1, 35)
        bconv(name + ".branch5x5_2", 48, 64, 5, 5, 35)
        bconv(name + ".branch3x3dbl_1", cin, 64, 1, 1, 35)
        bconv(name + ".branch3x3dbl_2", 64, 96, 3, 3, 35)
        bconv(name + ".branch3x3dbl_3", 96, 96, 3, 3, 35)
        bconv(name + ".branch_pool", cin, pool, 1, 1, 35)
        cin = 64 + 64 + 96 + pool
    bconv("Mixed_6a.branch3x3", cin, 384, 3, 3, 17)  # B: 35 -> 17
    bconv("Mixed_6a.branch3x3dbl_1", cin, 64, 1, 1, 35)
    bconv("Mixed_6a.branch3x3dbl_2", 64, 96, 3, 3, 35)
    bconv("Mixed_6a.branch3x3dbl_3", 96, 96, 3, 3, 17)
    cin = 384 + 96 + cin
    for name, c7 in (("Mixed_6b", 128), ("Mixed_6c", 160), ("Mixed_6d", 160), ("Mixed_6e", 192)):
        bconv(name + ".branch1x1", cin, 192, 1, 1, 17)  # C, 17 x 17
        bconv(name + ".branch7x7_1", cin, c7, 1, 1, 17)
        bconv(name + ".branch7x7_2", c7, c7, 1, 7, 17)
        bconv(name + ".branch7x7_3", c7, 192, 7, 1, 17)
        bconv(name + ".branch7x7dbl_1", cin, c7, 1, 1, 17)
        bconv(name + ".branch7x7dbl_2", c7, c7, 7, 1, 17)
        bconv(name + ".branch7x7dbl_3", c7, c7, 1, 7, 17)
        bconv(name + ".branch7x7dbl_4", c7, c7, 7, 1, 17)
        bconv(name + ".branch7x7dbl_5", c7, 192, 1, 7, 17)
        bconv(name + ".branch_pool", cin, 192, 1, 1, 17)
        cin = 768
    bconv("Mixed_7a.branch3x3_1", cin, 192, 1, 1, 17)  # D: 17 -> 8
    bconv("Mixed_7a.branch3x3_2", 192, 320, 3, 3, 8)
    bconv("Mixed_7a.branch7x7x3_1", cin, 192, 1, 1, 17)
    bconv("Mixed_7a.branch7x7x3_2", 192, 192, 1, 7, 17)
    bconv("Mixed_7a.branch7x7x3_3", 192, 192, 7, 1, 17)
    bconv("Mixed_7a.branch7x7x3_4", 192, 192, 3, 3, 8)
    cin = 320 + 192 + cin
    for name in ("Mixed_7b", "Mixed_7c"):  # E, 8 x 8
        bconv(name + ".branch1x1", cin, 320, 1, 1, 8)
        bconv(name + ".branch3x3_1", cin, 384, 1, 1, 8)
        bconv(name + ".branch3x3_2a", 384, 384, 1, 3, 8)
        bconv(name + ".branch3x3_2b", 384, 384, 3, 1, 8)
        bconv(name + ".branch3x3dbl_1", cin, 448, 1, 1, 8)
        bconv(name + ".branch3x3dbl_2", 448, 384, 3, 3, 8)
        bconv(name + ".branch3x3dbl_3a", 384, 384, 1, 3, 8)
        bconv(name + ".branch3x3dbl_3b", 384, 384, 3, 1, 8)
        bconv(name + ".branch_pool", cin, 192, 1, 1, 8)
        cin = 2048
    net.fc("fc", 2048, 1000)
    return net


def alexnet():
    """AlexNet as trained by Caffe's BVLC reference (227 x 227 input; conv2, conv4 and conv5
    in two groups, as in Krizhevsky et al.'s two-GPU net): 60,965,224 parameters, 232.56 MiB
    of f32 gradient, the size the DGC paper gives for its AlexNet."""
    net = Net()
    # conv(name, input channels a group, output channels, kernel, output side)
    net.conv("conv1", 3, 96, 11, 55, bias=True)
    net.conv("conv2", 48, 256, 5, 27, bias=True)
    net.conv("conv3", 256, 384, 3, 13, bias=True)
    net.conv("conv4", 192, 384, 3, 13, bias=True)
    net.conv("conv5", 192, 256, 3, 13, bias=True)
    net.fc("fc6", 256 * 6 * 6, 4096)
    net.fc("fc7", 4096, 4096)
    net.fc("fc8", 4096, 1000)
    return net


MODELS = {
    "resnet50": (lambda: resnet((3, 4, 6, 3)), "ResNet-50"),
    "resnet101": (lambda: resnet((3, 4, 23, 3)), "ResNet-101"),
    "resnet152": (lambda: resnet((3, 8, 36, 3)), "ResNet-152"),
    "vgg16": (vgg16, "VGG-16"),
    "inception3": (inception3, "Inception v3"),
    "alexnet": (alexnet, "AlexNet"),
}

SOURCES = {
    "AlexNet": "Krizhevsky et al. 2012, 'ImageNet Classification with Deep Convolutional Neural "
               "Networks'; Caffe's bvlc_alexnet layout (two groups in conv2, conv4, conv5)",
    "ResNet": "He et al. 2016, 'Deep Residual Learning for Image Recognition'; torchvision's "
              "layout (stride on the 3x3 conv)",
    "Inception": "Szegedy et al. 2016, 'Rethinking the Inception Architecture for Computer "
                 "Vision'; torchvision's layout without the auxiliary classifier",
    "VGG": "Simonyan and Zisserman 2015, 'Very Deep Convolutional Networks for Large-Scale "
           "Image Recognition', configuration D",
}


def main(out_dir):
    for key, (make, title) in MODELS.items():
        net = make()
        src = SOURCES[next(k for k in SOURCES if title.startswith(k))]
        path = os.path.join(out_dir, key + ".txt")
        with open(path, "w") as f:
            side = {"inception3": 299, "alexnet": 227}.get(key, 224)
            f.write("# %s, ImageNet (%d x %d, 1000 classes): %s\n" % (title, side, side, src))
            f.write("# %d tensors, %d parameters (%.1f MiB of f32 gradient), %.2f G multiply-adds "
                    "a sample forward\n" % (len(net.lines), net.params, net.params * 4 / 2**20,
                                           net.macs / 1e9))
            f.write("# one tensor a line: name d0 [d1] macs=M; a conv weight out x in*kh*kw is the "
                    "matrix the optimizer sees;\n# macs: the backward work before the gradient is "
                    "final (bench/models/cnn_lists.py, which wrote this file)\n")
            for line in net.lines:
                f.write(line + "\n")
        print("%s: %d tensors, %d parameters, %.2f GMACs" % (path, len(net.lines), net.params,
                                                               net.macs / 1e9))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__)))
