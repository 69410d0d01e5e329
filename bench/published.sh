#!/bin/sh
# bench/published.sh [BUILD | GRADCOMP] - the cost model against published measurements of
# someone else's systems: Horovod's scaling efficiency on 32 and 128 servers of 4 Pascal GPUs
# on 25 Gbit/s RoCE (Inception V3, ResNet-101, VGG-16; tf_cnn_benchmarks, batch 64 a GPU,
# synthetic data), then the DGC paper's AlexNet on 64 nodes (bench/published_dgc.py).  Only
# published inputs go in, each named below; what is not published (the per-hop latency, how
# the tensors were fused, whether the exchange overlaps the backward pass, DGC's compute) is
# varied over a range or solved from the one measured figure, and every prediction is printed.
# docs/BENCHMARKS.md, "Someone else's data", reads it.
#
# Published (measured) figures used:
#   Horovod's README and docs/benchmarks: "128 servers with 4 Pascal GPUs each connected by
#     RoCE-capable 25 Gbit/s network: 90 % scaling efficiency for both Inception V3 and
#     ResNet-101, and 68 % for VGG-16"; its earlier README: 32 such servers, 90 / 90 / 79 %.
#   TensorFlow's benchmarks page (tf_cnn_benchmarks, May 2017), one P100 of a DGX-1, batch 64,
#     synthetic data, images/s: InceptionV3 142, ResNet-50 219, ResNet-152 91.8, VGG16 154.
#     ResNet-101 is not on it: its time an image is interpolated between ResNet-50's and
#     ResNet-152's in proportion to multiply-adds (bench/models/*.txt headers).
#   Lin et al., "Deep Gradient Compression" (ICLR 2018): bench/published_dgc.py.
set -eu
B=${1:-build}
G=$B/gradcomp
[ -f "$B" ] && G=$B
M=$(dirname "$0")/models
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT

# A dense decode-add on a P100 moves 12 bytes an element through 732 GB/s of HBM2; NCCL's
# reduction runs on the GPU, so nothing else is charged to the codec.
cat > "$W/p100.cal" <<'EOF'
gradcomp-calibration 2
codec none:values=f32 encode_fixed_s=0 encode_per_elem=0 decode_fixed_s=0 decode_per_elem=1.64e-11
EOF

gmacs() { sed -n 's/.* \([0-9.]*\) G multiply-adds.*/\1/p' "$M/$1.txt"; }
# compute ms for batch 64 from images/s
ms() { awk -v r="$1" 'BEGIN { printf "%.2f", 64000 / r }'; }
R101=$(awk -v a="$(gmacs resnet50)" -v b="$(gmacs resnet101)" -v c="$(gmacs resnet152)" \
    'BEGIN { t50 = 1 / 219; t152 = 1 / 91.8; t = t50 + (t152 - t50) * (b - a) / (c - a);
             printf "%.2f", 64000 * t }')

echo "# predicted scaling efficiency (compute / predicted step) beside Horovod's measured one"
echo "# 25 Gbit/s RoCE at 97 % payload, PCIe inside a server, 4 GPUs a server, overlap 1"
printf "%-11s %7s %5s %9s | %-26s | %-26s\n" model servers meas "compute" \
    "one message a tensor" "64 MiB buckets (Horovod's)"
printf "%-11s %7s %5s %9s | %8s %8s %8s | %8s %8s %8s\n" "" "" "" "ms" \
    "2 us" "5 us" "10 us" "2 us" "5 us" "10 us"
for row in "inception3 $(ms 142) 90 90" "resnet101 $R101 90 90" "vgg16 $(ms 154) 79 68"; do
    set -- $row
    model=$1 compute=$2
    for servers in 32 128; do
        meas=$3
        [ "$servers" = 128 ] && meas=$4
        line=$(printf "%-11s %7s %4s%% %9s |" "$model" "$servers" "$meas" "$compute")
        for fuse in 0 64; do
            for lat in 2 5 10; do
                step=$("$G" plan --model "$M/$model.txt" --compare dense --min-k 0 \
                    --workers $((4 * servers)) --nodes "$servers" --link 25gbit \
                    --efficiency 0.97 --latency "$lat" --intra-link 96gbit --intra-latency 2 \
                    --compute-ms "$compute" --bucket-mb "$fuse" --calibration "$W/p100.cal" --json |
                    python3 -c "import json,sys; print(json.load(sys.stdin)['results'][0]['step_s'])")
                line="$line $(awk -v c="$compute" -v s="$step" 'BEGIN { printf "%7.0f%%", 100 * c / (1000 * s) }')"
            done
            line="$line |"
        done
        echo "$line"
    done
done

# The DGC paper's setting (Lin et al., ICLR 2018): AlexNet on 64 nodes of 4 Titan XP GPUs,
# 1 and 10 Gbit/s Ethernet; bench/published_dgc.py names the published figures. A Titan XP
# streams 547.7 GB/s: the dense decode-add moves 12 bytes an element, DGC's pass over the
# gradient, momentum and accumulation 20 (read g, u, v; write u, v).
cat > "$W/titanxp.cal" <<'CAL'
gradcomp-calibration 2
codec none:values=f32 encode_fixed_s=0 encode_per_elem=0 decode_fixed_s=0 decode_per_elem=2.19e-11
codec dgc:density=0.001 encode_fixed_s=0 encode_per_elem=3.65e-11 decode_fixed_s=0 decode_per_elem=0
CAL
echo
python3 "$(dirname "$0")/published_dgc.py" "$G" "$W/titanxp.cal" "$M"
