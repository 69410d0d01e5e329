#!/usr/bin/env python3
"""vs_pytorch.py - one rank of PyTorch DDP training, for bench/vs_pytorch.sh.

Trains the model `gradcomp train` trains (--model mlp-large: 784-4096-4096-10, 20.0 M
parameters; mlp: 784-1024-1024-10) with what users run today, PyTorch 1.13 DDP on gloo:

  ddp           DDP as is (its C++ reducer all_reduces fp32 buckets; no hook)
  ddp-fp16      DDP + default_hooks.fp16_compress_hook
  ddp-powersgd  DDP + powerSGD_hook.powerSGD_hook (rank 4, error feedback, warm start)
  ddp-gradcomp  DDP + gradcomp.torch.hook(--spec), the C codecs behind a DDP hook

with the C trainer's setup, so that the two sides differ only in how gradients travel: the
same initial weights (He-uniform from splitmix64 streams keyed by tensor index, biases 0),
the same data order (the C trainer's Fisher-Yates shuffle per epoch and rank-strided
shards), the same normalisation ((x/255 - 0.2860)/0.3530), mean cross-entropy, SGD with
momentum 0.9 and weight decay 1e-4 on weights only, a constant rate, batch 32 per rank,
one thread per rank.

Time: training time is forward + backward (with DDP's communication) + optimizer step,
summed over steps; evaluations are not counted, as in `gradcomp train`.  A run stops at
the first evaluation after --budget seconds of training on its slowest rank.  Evaluations
(the full 10,000 test images split across ranks) come every --eval-every seconds of
training: after 3 steps the ranks agree on the step time (one all_reduce) and turn the
interval into a step count.

Bytes: each rank reads its network interface's tx_bytes (/sys/class/net/IF/statistics)
before and after every training segment, so "wire bytes/step" is what really left the
host during training steps (TCP/IP headers included, evaluations excluded); on netsim
hosts IF is eth0, the shaped link.  The algorithmic figure is printed beside it.

Launch: one process per rank under mpirun (bench/vs_pytorch.sh runs it on netsim hosts);
the rank and world come from Open MPI's environment (OMPI_COMM_WORLD_RANK/SIZE), the
rendezvous from MASTER_ADDR/MASTER_PORT, gloo's interface from GLOO_SOCKET_IFNAME.
torch.distributed does the communication; MPI only starts the processes.

PowerSGD on gloo (torch 1.13): powerSGD_hook submits its P and Q all_reduces from future
callbacks, which run on gloo's worker threads.  With two or more DDP buckets the buckets'
callbacks race, so ranks can submit collectives in different orders: gloo then pairs one
rank's P all_reduce with another's Q (`EnforceNotMet ... op.preamble.length <= op.nbytes`)
or waits forever.  DDP always has two buckets or more after its first-iteration rebuild:
the first bucket is capped at dist._DEFAULT_FIRST_BUCKET_BYTES (1 MiB) whatever
bucket_cap_mb says.  --powersgd-buckets one (the default) sets that cap and bucket_cap_mb
above the model's size, so there is one bucket, one chain of collectives per step, and the
hook runs; --powersgd-buckets default keeps DDP's buckets (to reproduce the failure).
"""

import argparse
import gzip
import json
import math
import os
import statistics
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks  # noqa: E402
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as torch_psgd  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = "/usr/share/datasets/fashion-mnist"
MASK = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15


# ---- the C trainer's data, init and order (src/train/data.c, model.c) -------------------------

def _idx(path, magic, off):
    with gzip.open(path) as f:
        raw = f.read()
    if int.from_bytes(raw[:4], "big") != magic:
        raise ValueError(f"{path}: not an idx file")
    return np.frombuffer(raw, np.uint8, offset=off)


def load(kind):
    y = _idx(f"{DATA}/{kind}-labels-idx1-ubyte.gz", 0x801, 8)
    x = _idx(f"{DATA}/{kind}-images-idx3-ubyte.gz", 0x803, 16).reshape(len(y), 784)
    lut = (np.arange(256, dtype=np.float32) / np.float32(255.0) - np.float32(0.2860)) / np.float32(0.3530)
    return torch.from_numpy(lut[x]), torch.from_numpy(y.astype(np.int64))


def _splitmix_block(s0, n):
    """The n outputs of splitmix64 from state s0, vectorised (numpy wraps uint64)."""
    with np.errstate(over="ignore"):
        z = np.uint64(s0) + np.uint64(GAMMA) * np.arange(1, n + 1, dtype=np.uint64)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def c_init(index, n, bound, seed):
    s0 = (seed ^ ((0xD1B54A32D192ED03 * (index + 1)) & MASK)) & MASK
    out = np.empty(n, np.float32)
    step = 1 << 22
    for lo in range(0, n, step):  # the stream continues across blocks
        z = _splitmix_block((s0 + GAMMA * lo) & MASK, min(step, n - lo))
        u = (z >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
        out[lo:lo + len(z)] = ((2.0 * u - 1.0) * bound).astype(np.float32)
    return out


def _mix(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


class _Stream:
    def __init__(self, s):
        self.s = s

    def next(self):
        self.s = (self.s + GAMMA) & MASK
        return _mix(self.s)


def c_shuffle(n, seed, epoch):
    """gtrain_shuffle: Fisher-Yates with Lemire's bounded draws from the top 32 bits."""
    st = _Stream(seed)
    st = _Stream(st.next() ^ epoch)
    perm = list(range(n))
    for i in range(n, 1, -1):
        m = (st.next() >> 32) * i
        low = m & 0xFFFFFFFF
        if low < i:
            t = ((1 << 32) - i) % i
            while low < t:
                m = (st.next() >> 32) * i
                low = m & 0xFFFFFFFF
        j = m >> 32
        perm[i - 1], perm[j] = perm[j], perm[i - 1]
    return perm


HIDDEN = {"mlp": [1024, 1024], "mlp-large": [4096, 4096],
          # many tensors, so that how they travel (a message each or DDP's few buckets)
          # shows in the latencies: 50 tensors, 6.7 M parameters (bench only)
          "mlp-deep": [512] * 24}


def build_model(kind, seed):
    hidden = HIDDEN[kind]
    dims = [784] + hidden + [10]
    layers = []
    for i in range(len(dims) - 1):
        lin = torch.nn.Linear(dims[i], dims[i + 1])
        relu = i + 1 < len(dims) - 1
        bound = math.sqrt((6.0 if relu else 3.0) / dims[i])
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(c_init(2 * i, dims[i] * dims[i + 1], bound, seed))
                             .view(dims[i + 1], dims[i]))
            lin.bias.zero_()
        layers.append(lin)
        if relu:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def keep_freed_memory():
    """What GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=... does, at
    run time: blocks of any size come from the heap and freed memory stays mapped, so a
    tensor allocated every step reuses pages that are already there."""
    import ctypes
    libc = ctypes.CDLL(None)
    M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
    if not (libc.mallopt(M_MMAP_MAX, 0) and libc.mallopt(M_TRIM_THRESHOLD, 1 << 30)):
        raise OSError("mallopt refused")


# ---- measurement ------------------------------------------------------------------------------

def tx_bytes(iface):
    try:
        with open(f"/sys/class/net/{iface}/statistics/tx_bytes") as f:
            return int(f.read())
    except OSError:
        return 0


def evaluate(model, xt, yt, rank, world):
    per = (len(yt) + world - 1) // world
    lo, hi = rank * per, min(len(yt), (rank + 1) * per)
    with torch.no_grad():
        correct = 0
        for a in range(lo, hi, 500):
            b = min(hi, a + 500)
            correct += int((model(xt[a:b]).argmax(1) == yt[a:b]).sum())
    t = torch.tensor([correct, hi - lo], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t[0] / t[1])


def gc_totals(state):
    """(hook ns, C ns of every compressor, steps) of a gradcomp hook state so far."""
    c_ns = sum(c.stats["encode_ns"] + c.stats.get("decode_ns", 0) for c in state.compressors.values())
    return state.stats["hook_ns"], c_ns, state.stats["steps"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--method", required=True,
                    help="ddp, ddp-fp16, ddp-powersgd or ddp-gradcomp; +keepmem and +view add "
                         "--keep-memory and --bucket-view (ddp-gradcomp+keepmem+view)")
    ap.add_argument("--model", default="mlp-large", choices=sorted(HIDDEN))
    ap.add_argument("--budget", type=float, default=90.0, help="seconds of training")
    ap.add_argument("--eval-every", type=float, default=10.0, help="seconds of training between evaluations")
    ap.add_argument("--max-steps", type=int, default=0)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--spec", default="powersgd:rank=4", help="gradcomp spec for ddp-gradcomp")
    ap.add_argument("--min-elements", type=int, default=8192, help="gradcomp: smaller and 1-D tensors go dense")
    ap.add_argument("--powersgd-rank", type=int, default=4)
    ap.add_argument("--powersgd-start", type=int, default=10)
    ap.add_argument("--powersgd-buckets", choices=["one", "default"], default="one")
    ap.add_argument("--one-bucket", action="store_true",
                    help="one DDP bucket for the whole model with any method (what "
                         "--powersgd-buckets one does for ddp-powersgd)")
    ap.add_argument("--bucket-view", action="store_true",
                    help="DDP(gradient_as_bucket_view=True): gradients live in the buckets (no copies)")
    ap.add_argument("--keep-memory", action="store_true",
                    help="mallopt: glibc keeps freed blocks instead of unmapping them, so "
                         "torch's per-step 64 MB temporaries stop faulting in fresh pages")
    ap.add_argument("--per-parameter-model", action="store_true",
                    help="adaptive methods: do not give the controllers DDP's buckets, so their "
                         "cost model sees a message a parameter (the hook before it gave them)")
    ap.add_argument("--profile", default="", help="write a cProfile of the training loop (rank 0) here")
    ap.add_argument("--out", required=True, help="JSON written by rank 0")
    a = ap.parse_args()
    base, *mods = a.method.split("+")
    if base not in ("ddp", "ddp-fp16", "ddp-powersgd", "ddp-gradcomp") or set(mods) - {"keepmem", "view"}:
        ap.error(f"--method {a.method}: unknown")
    a.keep_memory |= "keepmem" in mods
    a.bucket_view |= "view" in mods

    if a.keep_memory:
        keep_freed_memory()
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("RANK", "0")))
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    iface = os.environ.get("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)

    x, y = load("train")
    xt, yt = load("t10k")
    model = build_model(a.model, a.seed)
    nparams = sum(p.numel() for p in model.parameters())
    algo = None  # algorithmic bytes per step and rank, where the method says
    if a.one_bucket or (base == "ddp-powersgd" and a.powersgd_buckets == "one"):
        dist._DEFAULT_FIRST_BUCKET_BYTES = 8 * nparams
        ddp = DDP(model, bucket_cap_mb=8 * nparams / 2**20, gradient_as_bucket_view=a.bucket_view)
    else:
        ddp = DDP(model, gradient_as_bucket_view=a.bucket_view)
    psgd_state = gc_state = policy = None
    if base == "ddp-fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif base == "ddp-powersgd":
        psgd_state = torch_psgd.PowerSGDState(
            process_group=None, matrix_approximation_rank=a.powersgd_rank,
            start_powerSGD_iter=a.powersgd_start, min_compression_rate=2,
            use_error_feedback=True, warm_start=True)
        ddp.register_comm_hook(psgd_state, torch_psgd.powerSGD_hook)
    elif base == "ddp-gradcomp":
        sys.path.insert(0, os.path.join(HERE, "..", "python"))
        import gradcomp.torch as gt
        from gradcomp.core import _keeps_momentum as keeps_momentum
        if a.spec.startswith("adapt:"):
            # An adaptive method: its controllers decide each parameter's spec (the hook
            # probes the link itself); interval=auto reads the run's length as 2 epochs,
            # the length of bench/adapt_bandwidth.sh's runs.
            spe = (len(y) // world) // a.batch
            if a.per_parameter_model:
                import gradcomp.adapt
                gradcomp.adapt.Adapt.set_exchanges = lambda self, groups: None
            hook, gc_state = gt.hook(a.spec, model=ddp, total_steps=2 * spe)
            policy = gc_state.policy
        else:
            policy = gt.LayerPolicy(a.spec, min_elements=a.min_elements)
            hook, gc_state = gt.hook(policy, model=ddp)
        ddp.register_comm_hook(gc_state, hook)
    # A spec that keeps the momentum in the compressor (DGC's momentum correction) steps its
    # parameters without the optimizer's, as gradcomp train and DistributedOptimizer do.
    groups = {}
    for n, p in model.named_parameters():
        spec = policy(n, tuple(p.shape)) if policy is not None else None
        own = spec is not None and keeps_momentum(spec)
        g = groups.setdefault((n.endswith("bias"), own), {
            "params": [], "weight_decay": 0.0 if n.endswith("bias") else 1e-4, "momentum": 0.0 if own else 0.9})
        g["params"].append(p)
    opt = torch.optim.SGD(list(groups.values()), lr=a.lr)

    n = len(y)
    steps_per_epoch = (n // world) // a.batch
    prof = None
    if a.profile and rank == 0:
        import cProfile
        prof = cProfile.Profile()
    train_s, step_times, curve, tx_total, steps, phases = 0.0, [], [], 0, 0, []
    gc_mark = None
    decisions = []
    eval_every = None
    acc0 = evaluate(ddp.module, xt, yt, rank, world)
    curve.append({"train_s": 0.0, "step": 0, "acc": acc0})
    stopped = False
    epoch = 0
    seg_tx = tx_bytes(iface)
    while not stopped:
        perm = c_shuffle(n, a.seed, epoch)
        mine = perm[rank::world][: n // world]
        for s in range(steps_per_epoch):
            idx = torch.tensor(mine[s * a.batch:(s + 1) * a.batch])
            xb, yb = x[idx], y[idx]
            if prof is not None:
                prof.enable()
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=False)
            loss = F.cross_entropy(ddp(xb), yb)
            t1 = time.perf_counter()
            loss.backward()  # DDP's exchange (and the hook) finish inside
            t2 = time.perf_counter()
            opt.step()
            t3 = time.perf_counter()
            dt = t3 - t0
            phases.append((t1 - t0, t2 - t1, t3 - t2))
            if gc_state is not None and gc_state.adapt is not None:
                # The bandwidth controller's link and compute are the hook's own measures
                # (what a user of hook("adapt:...") gets); this records what it decided.
                decisions.append(dict(gc_state.adapt.report, specs=sorted(set(
                    c.spec for c in gc_state.compressors.values())),
                    ladder=gc_state.adapt.ladder, predicted=gc_state.adapt.predicted()))
            if prof is not None:
                prof.disable()
            train_s += dt
            step_times.append(dt)
            steps += 1
            if not math.isfinite(float(loss)):
                raise SystemExit(f"{a.method}: loss {float(loss)} at step {steps}")
            if steps == 3 and gc_state is not None:  # the hook's steady state starts here
                gc_mark = gc_totals(gc_state)
            if eval_every is None and steps == 3:
                t = torch.tensor([train_s / 3])
                dist.all_reduce(t, op=dist.ReduceOp.MAX)
                eval_every = max(1, round(a.eval_every / float(t)))
            due = eval_every is not None and steps % eval_every == 0
            last = a.max_steps and steps >= a.max_steps
            if not (due or last):
                continue
            now_tx = tx_bytes(iface)
            tx_total += now_tx - seg_tx
            acc = evaluate(ddp.module, xt, yt, rank, world)
            t = torch.tensor([train_s])
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            curve.append({"train_s": train_s, "step": steps, "acc": acc, "epoch": epoch + (s + 1) / steps_per_epoch})
            if rank == 0:
                print(f"{a.method:14s} step {steps:5d}  {train_s:7.1f} s  acc {100 * acc:6.2f}%  "
                      f"{1e3 * train_s / steps:8.1f} ms/step", flush=True)
            seg_tx = tx_bytes(iface)
            if float(t) >= a.budget or last:
                stopped = True
                break
        epoch += 1

    if gc_state is not None:
        algo = gc_state.stats["bytes_sent"] / max(1, gc_state.stats["steps"])
    elif base == "ddp":
        algo = 2 * (world - 1) / world * 4 * nparams
    elif base == "ddp-fp16":
        algo = 2 * (world - 1) / world * 2 * nparams
    mine_stats = torch.tensor([tx_total / steps, statistics.median(step_times[3:] or step_times)], dtype=torch.float64)
    allv = [torch.empty_like(mine_stats) for _ in range(world)]
    dist.all_gather(allv, mine_stats)
    if prof is not None:
        prof.dump_stats(a.profile)
    if rank == 0:
        res = {
            "method": a.method, "model": a.model, "params": nparams, "world": world, "batch": a.batch,
            "spec": a.spec if base == "ddp-gradcomp" else None, "keep_memory": a.keep_memory, "bucket_view": a.bucket_view,
            "steps": steps, "train_s": train_s, "step_ms": 1e3 * train_s / steps,
            "step_ms_median": 1e3 * statistics.median(float(v[1]) for v in allv),
            "wire_bytes_per_step": statistics.mean(float(v[0]) for v in allv), "iface": iface,
            "algo_bytes_per_step": algo, "final_acc": curve[-1]["acc"],
            "best_acc": max(p["acc"] for p in curve), "curve": curve, "budget_s": a.budget,
            "torch": torch.__version__,
            "powersgd_buckets": a.powersgd_buckets if base == "ddp-powersgd" else None,
            "one_bucket": a.one_bucket or (base == "ddp-powersgd" and a.powersgd_buckets == "one"),
        }
        ph = phases[3:] or phases
        res["phase_ms_median"] = {k: 1e3 * statistics.median(p[i] for p in ph)
                                  for i, k in enumerate(("forward", "backward", "optimizer"))}
        if decisions:  # an adaptive method: what each decision saw and chose (rank 0)
            res["adapt_decisions"] = [d for i, d in enumerate(decisions)
                                      if d["decisions"] and (i == 0 or d["decisions"] != decisions[i - 1]["decisions"])]
        if gc_state is not None:
            # Per step after the third, like the phases: the hook creates its compressors at
            # the first step it sees a parameter, and their first encodes fault in fresh
            # workspaces (one PowerSGD call of mlp-large's 4096 x 4096 took 165-175 ms on
            # the 2-vCPU VM against 11 ms after), which in a 40-step run doubled the mean.
            tot = gc_totals(gc_state)
            base = gc_mark if gc_mark is not None and tot[2] > gc_mark[2] else (0, 0, 0)
            n = max(1, tot[2] - base[2])
            res["gradcomp_hook_ms_per_step"] = (tot[0] - base[0]) / 1e6 / n
            res["gradcomp_c_ms_per_step"] = (tot[1] - base[1]) / 1e6 / n
            res["gradcomp_c_ms_per_step_all"] = tot[1] / 1e6 / max(1, tot[2])
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
