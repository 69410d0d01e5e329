#!/usr/bin/env python3
"""torch_ddp.py - PyTorch DDP on Fashion-MNIST with gradcomp's communication hook.

Trains the same MLP (784-512-256-10, 535k parameters) once per method on 2-4 CPU
processes (gloo on 127.0.0.1) and prints, side by side: test accuracy, bytes each rank
sends per step, the hook's time per step (compression + communication: from the first
bucket's hook call to the last bucket's future completing, the same wrapper around
every hook) and the whole step's time.

    /usr/bin/python3 examples/torch_ddp.py                        # 2 processes, 2 epochs
    /usr/bin/python3 examples/torch_ddp.py --world 4 --methods dense,powersgd,topk
    /usr/bin/python3 examples/torch_ddp.py --json out.json        # also write the numbers
    # by hand, one command per process (a TCP store on 127.0.0.1):
    /usr/bin/python3 examples/torch_ddp.py --world 2 --rank 0 --port 29500 &
    /usr/bin/python3 examples/torch_ddp.py --world 2 --rank 1 --port 29500

Methods: dense (DDP's all_reduce, through default_hooks.allreduce_hook so it is timed
like the others), torch-powersgd (PyTorch's powerSGD_hook, rank 4), and gradcomp specs:
powersgd (powersgd:rank=4), topk (topk:density=0.01,feedback=ef), twobit, sign (1 bit +
EF), int8, or any `name=SPEC`.  Both PowerSGD variants start after --start-iter dense
steps (PyTorch needs >= 2 with error feedback, because DDP rebuilds buckets after step 0)
and send tensors dense where compression would not shrink them 2x (min_compression_rate=2
in both).  Codecs this libgradcomp lacks are skipped with a note.

Data: the Debian package dataset-fashion-mnist (/usr/share/datasets/fashion-mnist).
Threads: torch.set_num_threads(1) and OPENBLAS_NUM_THREADS=1 per process, so N ranks use
N cores.  Torch's matrix products go through whichever libblas.so.3 the system selects
(Debian's reference BLAS is ~20x slower than OpenBLAS: see TORCH.md); gradcomp's
PowerSGD links OpenBLAS directly when it was built with it.
"""

import argparse
import gzip
import json
import os
import socket
import statistics
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks  # noqa: E402
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as torch_psgd  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

try:
    import gradcomp  # noqa: F401
except ImportError:  # running from the source tree
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    import gradcomp  # noqa: F401
import gradcomp.torch as gt  # noqa: E402

DATA = "/usr/share/datasets/fashion-mnist"
RANK = 4

GRADCOMP_METHODS = {
    "powersgd": f"powersgd:rank={RANK}",
    "topk": "topk:density=0.01,feedback=ef",
    "twobit": "twobit:threshold=0.002",
    "sign": "sign:feedback=ef",
    "int8": "int8",
}
DEFAULT_METHODS = "dense,torch-powersgd,powersgd,topk,twobit,sign"


def load(kind):
    with gzip.open(f"{DATA}/{kind}-labels-idx1-ubyte.gz") as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8)
    with gzip.open(f"{DATA}/{kind}-images-idx3-ubyte.gz") as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(len(y), 784)
    x = (x.astype(np.float32) / 255.0 - 0.2860) / 0.3530
    return torch.from_numpy(x), torch.from_numpy(y.astype(np.int64))


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(784, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 10))


def timed(hook, per_step):
    """Wraps a hook and appends, per step, the time its buckets spent in it to `per_step`:
    for each bucket, from the hook's call to the completion of the future it returned,
    summed over the step's buckets.  Time between buckets (the backward pass computing
    the next layers' gradients) is not counted.  DDP wants a plain function."""
    acc = [0.0, 0]

    def timed_hook(state, bucket):
        t0 = time.perf_counter()
        fut = hook(state, bucket)
        last = bucket.is_last()

        def done(f):
            acc[0] += time.perf_counter() - t0
            acc[1] += 1
            if last:
                per_step.append((acc[0], acc[1]))
                acc[0], acc[1] = 0.0, 0
            return f.value()

        return fut.then(done)

    return timed_hook


def spec_of(method):
    if "=" in method.split(":", 1)[0]:
        return method.split("=", 1)[1]
    return GRADCOMP_METHODS.get(method)


def label_of(method):
    return method.split("=", 1)[0] if "=" in method.split(":", 1)[0] else method


def run_method(method, args, rank, world, train, test):
    model = DDP(make_model())
    nparams = sum(p.numel() for p in model.parameters())
    state = None
    hook_times = []
    if method == "dense":
        model.register_comm_hook(None, timed(default_hooks.allreduce_hook, hook_times))
    elif method == "torch-powersgd":
        state = torch_psgd.PowerSGDState(
            process_group=None, matrix_approximation_rank=RANK, start_powerSGD_iter=args.start_iter,
            min_compression_rate=2, use_error_feedback=True, warm_start=True, random_seed=0)
        model.register_comm_hook(state, timed(torch_psgd.powerSGD_hook, hook_times))
    else:
        spec = spec_of(method)
        if spec.startswith("powersgd"):
            spec += f",start_iter={args.start_iter},min_compression_rate=2"
        hook, state = gt.hook(gt.LayerPolicy(spec, min_elements=1024), model=model)
        model.register_comm_hook(state, timed(hook, hook_times))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    x, y = train
    steps, step_times, losses = 0, [], []
    for epoch in range(args.epochs):
        perm = torch.from_numpy(np.random.default_rng(1000 + epoch).permutation(len(y)))
        mine = perm[rank::world]
        nb = len(mine) // args.batch
        if args.max_steps:
            nb = min(nb, args.max_steps - steps)
        if state is not None and hasattr(state, "set_epoch"):
            state.set_epoch(epoch)
        for b in range(nb):
            idx = mine[b * args.batch:(b + 1) * args.batch]
            t0 = time.perf_counter()
            loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad(set_to_none=False)
            loss.backward()
            opt.step()
            step_times.append(time.perf_counter() - t0)
            losses.append(loss.item())
            steps += 1
    # Test accuracy of this rank's replica (all replicas are identical: checked below).
    model.eval()
    with torch.no_grad():
        xt, yt = test
        acc = (model.module(xt).argmax(1) == yt).float().mean().item()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    outs = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(outs, flat)
    identical = all(torch.equal(outs[0], o) for o in outs)

    if method == "dense":
        bytes_per_step = 4.0 * nparams
    elif method == "torch-powersgd":
        dense_steps = min(args.start_iter, steps)
        bytes_per_step = 4.0 * (state.total_numel_after_compression + dense_steps * nparams) / steps
    else:
        bytes_per_step = state.stats["bytes_sent"] / max(1, state.stats["steps"])
    skip = min(args.warmup, max(0, steps - 1))  # bucket rebuild, page faults, dense start
    hook_t = [t for t, _ in hook_times[skip:]]
    buckets = max(nb for _, nb in hook_times[skip:])
    step_t = step_times[skip:]
    return {
        "method": label_of(method),
        "spec": None if method in ("dense", "torch-powersgd") else state.policy.text,
        "accuracy": acc,
        "final_loss": statistics.mean(losses[-50:]),
        "bytes_per_step": bytes_per_step,
        "dense_bytes_per_step": 4.0 * nparams,
        "hook_ms_median": 1e3 * statistics.median(hook_t),
        "hook_ms_mean": 1e3 * statistics.mean(hook_t),
        "step_ms_median": 1e3 * statistics.median(step_t),
        "steps": steps,
        "buckets": buckets,
        "c_ms_per_step": (1e-6 * sum(c.stats["encode_ns"] + c.stats["decode_ns"]
                                     for c in state.compressors.values()) / steps
                          if isinstance(state, gt.GradcompState) else None),
        "replicas_identical": identical,
        "gradcomp_stats": dict(state.stats) if isinstance(state, gt.GradcompState) else None,
    }


def worker(rank, world, port, args):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    train, test = load("train"), load("t10k")
    results = []
    for method in args.methods.split(","):
        spec = spec_of(method)
        if method not in ("dense", "torch-powersgd"):
            if spec is None:
                raise SystemExit(f"unknown method {method!r}")
            name = spec.split(":", 1)[0]
            if gradcomp.codec_info(name) is None:
                if rank == 0:
                    print(f"[skip] {method}: codec {name!r} is not in this libgradcomp", flush=True)
                continue
        r = run_method(method, args, rank, world, train, test)
        results.append(r)
        if rank == 0:
            c = f"  (in C: {r['c_ms_per_step']:.2f} ms)" if r["c_ms_per_step"] is not None else ""
            print(f"[done] {r['method']:<16} acc {100 * r['accuracy']:.2f}%  hook {r['hook_ms_median']:.2f} ms"
                  f"{c}  step {r['step_ms_median']:.2f} ms  buckets {r['buckets']}", flush=True)
        dist.barrier()
    if rank == 0:
        report(results, world, args)
    dist.destroy_process_group()


def human(b):
    for unit in ("B", "KB", "MB", "GB"):
        if b < 1000 or unit == "GB":
            return f"{b:.0f} {unit}" if unit == "B" else f"{b:.1f} {unit}"
        b /= 1000.0


def report(results, world, args):
    print()
    print(f"Fashion-MNIST MLP 784-512-256-10, {world} ranks (gloo, CPU), batch {args.batch}/rank, "
          f"{args.epochs} epochs, SGD lr {args.lr} momentum 0.9")
    print(f"hook/step and step: median over steps after the first {args.warmup}; bytes: per rank per step, "
          f"averaged over all steps")
    hdr = f"{'method':<16} {'test acc':>9} {'bytes/step':>11} {'vs dense':>9} {'hook ms/step':>13} {'step ms':>8}  replicas"
    print(hdr)
    print("-" * len(hdr))
    for r in results:
        print(f"{r['method']:<16} {100 * r['accuracy']:>8.2f}% {human(r['bytes_per_step']):>11} "
              f"{r['dense_bytes_per_step'] / r['bytes_per_step']:>8.1f}x {r['hook_ms_median']:>13.2f} "
              f"{r['step_ms_median']:>8.2f}  {'identical' if r['replicas_identical'] else 'DIFFER'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"world": world, "args": vars(args), "results": results}, f, indent=1)
        print(f"\nwrote {args.json}")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=int, default=2, help="processes (2-4)")
    ap.add_argument("--rank", type=int, default=None, help="run one rank by hand (with --port)")
    ap.add_argument("--port", type=int, default=None)
    ap.add_argument("--methods", default=DEFAULT_METHODS,
                    help="comma-separated: dense, torch-powersgd, " + ", ".join(GRADCOMP_METHODS)
                    + ", or label=SPEC")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--start-iter", type=int, default=10, help="dense steps before PowerSGD starts")
    ap.add_argument("--warmup", type=int, default=20, help="steps left out of the timings")
    ap.add_argument("--max-steps", type=int, default=0, help="stop each method after this many steps")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args()
    if not os.path.exists(f"{DATA}/train-images-idx3-ubyte.gz"):
        raise SystemExit(f"{DATA} is missing: apt-get install dataset-fashion-mnist")
    if args.rank is not None:
        if args.port is None:
            raise SystemExit("--rank needs --port (the same on every rank)")
        worker(args.rank, args.world, args.port, args)
    else:
        mp.spawn(worker, args=(args.world, args.port or free_port(), args), nprocs=args.world, join=True)


if __name__ == "__main__":
    main()
