"""A rank that dies or stalls under the DDP hook: what the survivor raises, and when.

    python3 ddp_peer_failure.py --out PREFIX --mode dead|stall --method SPEC [--two-exchanges]
                                [--port P]

Two gloo processes with a 3 s process-group timeout train a small model through
gradcomp's hook; at step 5 rank 1 exits (dead) or sleeps 15 s (stall).  Rank 0 writes
PREFIX.json: the exception's type and message and the seconds from step 5 to it.
--two-exchanges: the gather path always sends its lengths first (a blocking all_gather in
the hook), as it does when a codec's bound is far above what it sends.
"""

import argparse
import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import gradcomp.torch as gt  # noqa: E402

FAIL_AT = 5


def worker(rank, port, mode, method, out, two):
    if two:
        gt._ONE_EXCHANGE_SLACK = 0.0
    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=3)
    store = dist.TCPStore("127.0.0.1", port, None, False, timeout=datetime.timedelta(seconds=30))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=timeout)
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)))
    hook, state = gt.hook(method, model=model, total_steps=40)
    model.register_comm_hook(state, hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    res, t_fail = {"error": None}, None
    try:
        for s in range(20):
            if s == FAIL_AT:
                t_fail = time.monotonic()
                if rank == 1:
                    if mode == "dead":
                        os._exit(3)
                    time.sleep(15)
                    os._exit(0)
            g = torch.Generator().manual_seed(100 * s + rank)
            x, y = torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    except Exception as e:  # DDP re-raises the hook's error from backward()
        res = {"error": f"{type(e).__name__}: {e}", "type": type(e).__name__,
               "seconds": time.monotonic() - t_fail if t_fail else None}
    if rank == 0:
        with open(out + ".json", "w") as f:
            json.dump(res, f)
    os._exit(0)  # no destroy_process_group: the group is broken


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--mode", choices=["dead", "stall"], required=True)
    ap.add_argument("--method", required=True)
    ap.add_argument("--two-exchanges", action="store_true")
    ap.add_argument("--port", type=int, default=0, help="0: a free one")
    a = ap.parse_args()
    # The store lives here and holds its port from the bind to the end: a port found free
    # and closed again before the ranks bind it can be taken by another process meanwhile.
    store = dist.TCPStore("127.0.0.1", a.port, None, True, timeout=datetime.timedelta(seconds=30),
                          wait_for_workers=False)
    ctx = mp.get_context("spawn")
    ps = [ctx.Process(target=worker, args=(r, store.port, a.mode, a.method, a.out, a.two_exchanges))
          for r in range(2)]
    for p in ps:
        p.start()
    for p in ps:
        p.join()
    # Rank 1 exits 3 on purpose; rank 0 exits 0 once it has written its result, so any
    # other status of rank 0 (its traceback is above) must fail the test, not leave it
    # looking for a file that was never written.
    if ps[0].exitcode != 0:
        sys.exit(f"rank 0 exited with status {ps[0].exitcode} before writing {a.out}.json")


if __name__ == "__main__":
    main()
