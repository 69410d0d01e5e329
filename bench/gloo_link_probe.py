#!/usr/bin/env python3
"""gloo_link_probe.py RATE [N] - gradcomp.torch.link_probe over gloo, N times (default 5),
against a link shaped to RATE bytes per second of payload; rank 0 prints each reading's
error.  Run under mpirun (the ranks come from Open MPI's environment), e.g. on netsim:

  scripts/netsim run 4 -x GLOO_SOCKET_IFNAME=eth0 -x MASTER_ADDR=10.77.0.1 \\
      -x MASTER_PORT=29700 -- /usr/bin/python3 bench/gloo_link_probe.py 119500000

(1 Gbit/s carries 119.5 MB/s of TCP payload, 100 Mbit/s 11.95.)  The C probe's check is
tests/netsim/link_probe.c."""
import os
import sys

import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import gradcomp.torch as gt  # noqa: E402


def main():
    rate = float(sys.argv[1])
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    world = int(os.environ["OMPI_COMM_WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    read = [gt.link_probe()[0] for _ in range(n)]
    if rank == 0:
        print("gloo link probe:", " ".join(f"{b / 1e6:.1f} MB/s ({100 * (b / rate - 1):+.0f} %)"
                                           for b in read), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
