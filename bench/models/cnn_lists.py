#!/usr/bin/env python3
"""Writes the tensor lists of the ImageNet CNNs in bench/models (gradcomp plan's --model FILE).

    python3 bench/models/cnn_lists.py bench/models        # resnet50/101/152.txt, vgg16.txt

Each line is `name d0 [d1] macs=M`: the tensor's matrix (a conv weight is out x in*kh*kw) and
the multiply-adds per sample of the backward work that must run before the tensor's
gradient is final and after the previous tensor's: for a weight, its layer's forward
multiply-adds (a backward pass costs about twice the forward, so the shares are the same);
for a bias or a batch-norm scale and shift, the elements of the layer's output (one
reduction over them). The cost model spreads the backward time over the tensors by these
shares; without macs= it spreads it by element count, which is right for fully connected
layers and wrong for convolutions (VGG-16's fully connected layers hold 89 % of its
parameters and 1 % of its multiply-adds).

Shapes only: the architecture's arithmetic at 224 x 224 input, no framework needed.
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


MODELS = {
    "resnet50": (lambda: resnet((3, 4, 6, 3)), "ResNet-50"),
    "resnet101": (lambda: resnet((3, 4, 23, 3)), "ResNet-101"),
    "resnet152": (lambda: resnet((3, 8, 36, 3)), "ResNet-152"),
    "vgg16": (vgg16, "VGG-16"),
}

SOURCES = {
    "ResNet": "He et al. 2016, 'Deep Residual Learning for Image Recognition'; torchvision's "
              "layout (stride on the 3x3 conv)",
    "VGG": "Simonyan and Zisserman 2015, 'Very Deep Convolutional Networks for Large-Scale "
           "Image Recognition', configuration D",
}


def main(out_dir):
    for key, (make, title) in MODELS.items():
        net = make()
        src = SOURCES["ResNet" if key.startswith("resnet") else "VGG"]
        path = os.path.join(out_dir, key + ".txt")
        with open(path, "w") as f:
            f.write("# %s, ImageNet (224 x 224, 1000 classes): %s\n" % (title, src))
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
