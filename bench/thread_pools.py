#!/usr/bin/env python3
"""thread_pools.py [RANK] [PAIRS] - PowerSGD's encode and decode inside a PyTorch process:
a 1024 x 1024 gradient, PAIRS (default 200) encode + decode pairs, each after a torch
matmul (256 x 1024 by 1024 x 1024), as in a training step.  Prints the means and medians;
compare the same command under OPENBLAS_NUM_THREADS=1 (docs/PYTHON.md, "On CPUs: PowerSGD
above rank 8 and OpenBLAS's threads"):

  GRADCOMP_LIB=build/libgradcomp.so /usr/bin/python3 bench/thread_pools.py 16
  OPENBLAS_NUM_THREADS=1 GRADCOMP_LIB=build/libgradcomp.so /usr/bin/python3 bench/thread_pools.py 16
"""
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import gradcomp  # noqa: E402


def main():
    rank = int(sys.argv[1]) if len(sys.argv) > 1 else 16
    pairs = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    side = 1024
    torch.manual_seed(0)
    g = torch.randn(side, side)
    out = torch.zeros(side * side)
    c = gradcomp.Compressor(f"powersgd:rank={rank}", shape=(side, side))
    a, w = torch.randn(256, side), torch.randn(side, side)
    te, td = [], []
    for i in range(pairs + 1):  # the first pair is the fresh compressor's, left out
        (a @ w).relu_()
        t0 = time.perf_counter()
        m = c.encode(g)
        t1 = time.perf_counter()
        gradcomp.decode_add(m, out, 0.25)
        t2 = time.perf_counter()
        if i:
            te.append(t1 - t0)
            td.append(t2 - t1)
    ms = lambda v, f: 1e3 * f(v)  # noqa: E731
    print(
        f"powersgd:rank={rank}, torch threads {torch.get_num_threads()}, "
        f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}: "
        f"encode mean {ms(te, statistics.mean):.2f} ms (median {ms(te, statistics.median):.2f}), "
        f"decode mean {ms(td, statistics.mean):.2f} ms (median {ms(td, statistics.median):.2f})"
    )


if __name__ == "__main__":
    main()
