#!/usr/bin/env python3
"""torch_mpi_optimizer.py - PyTorch on Fashion-MNIST under mpirun with gradcomp's
DistributedOptimizer, method by method, as `gradcomp train` does it in C.

    mpirun -np 4 python3 examples/torch_mpi_optimizer.py                 # 5 methods, 2 epochs
    mpirun -np 4 python3 examples/torch_mpi_optimizer.py --loss sum --lr-schedule cosine \\
        --compare "dense,topk:density=0.01,feedback=ef,dgc:density=0.001,values=f16,powersgd:rank=4,twobit:threshold=0.5;min_elements=16384"
    # beside PyTorch DDP (gloo) with torch's powerSGD_hook and with gradcomp's gloo hook:
    mpirun -np 4 python3 examples/torch_mpi_optimizer.py --compare "dense,powersgd:rank=4,ddp,ddp-torch:powersgd:rank=4,ddp-gloo:powersgd:rank=4"
    # across 4 hosts with 1 Gbit/s links (scripts/netsim, root):
    scripts/netsim job 4 1gbit 4 -x PYTHONPATH=$PWD/python -x OPENBLAS_NUM_THREADS=1 -- \\
        /usr/bin/python3 examples/torch_mpi_optimizer.py --compare ... --max-steps 200

It prints the table `gradcomp train` prints - test accuracy, its difference to dense,
bytes each rank sends per step, compression ratio, step / codec / communication time and
the training time to the dense run's final accuracy - and writes OUT/results.json.

Same experiment as `gradcomp train` (src/train), so that the two can be compared method by
method: the same MLP (784-1024-1024-10) or CNN, the same initial weights (splitmix64
He-uniform, zero biases, bit for bit), the same data order (the trainer's Fisher-Yates
shuffle per epoch and its rank-strided shards), batch, SGD with momentum 0.9 and weight
decay 1e-4 on weights only, learning-rate schedules, loss unit (--loss sum: the summed
loss's gradients are exchanged, then divided by the batch before the step, as MXNet does),
evaluation points, and the same per-tensor policy: tensors under --min-elements and 1-D
tensors go as --dense-spec (none:values=f16) in every method but dense, and a density
codec sends at least --min-k (512) values of a tensor a step.  What differs:
torch's kernels (OpenBLAS through torch, float summation orders), and the buckets (the
trainer has one per tensor; here --bucket-bytes, default 4 MiB).

Methods: "dense" (f32 for every tensor), any spec, SPEC@STRATEGY, SPEC;KEY=VALUE (policy
items of this method), "policy:<policy string>"; and for comparison "ddp" (PyTorch DDP on
gloo, its all_reduce), "ddp-torch:powersgd:rank=R" (DDP + torch's powerSGD_hook, start
iteration 2, error feedback and warm start) and "ddp-gloo:SPEC" (DDP + gradcomp's gloo
hook, gradcomp.torch.hook, with the same policy).  --compare splits on commas like the
trainer: a piece without ':' but with '=' continues the previous spec.

Data: Debian's dataset-fashion-mnist (/usr/share/datasets/fashion-mnist).  One thread per
rank (OPENBLAS_NUM_THREADS=1, torch.set_num_threads(1)).
"""

import argparse
import gzip
import hashlib
import json
import math
import os
import socket
import subprocess
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import torch  # noqa: E402

try:
    import gradcomp  # noqa: F401
except ImportError:  # running from the source tree
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    import gradcomp  # noqa: F401
import gradcomp.mpi as gm  # noqa: E402
import gradcomp.torch as gt  # noqa: E402

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.rank, COMM.size
DATA = "/usr/share/datasets/fashion-mnist"
MEAN, STD = np.float32(0.2860), np.float32(0.3530)
M64 = (1 << 64) - 1
DEFAULT_METHODS = ("dense,topk:density=0.01,feedback=ef,dgc:density=0.001,values=f16,powersgd:rank=4,"
                   "twobit:threshold=0.5;min_elements=16384")


# ---- the trainer's random streams (src/train/model.c, data.c), bit for bit ------------------


def splitmix64_block(state, n):
    """n draws of splitmix64 (Steele, Lea, Flood 2014) from `state`; returns (draws, state)."""
    k = np.arange(1, n + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = np.uint64(state) + k * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31)), (state + n * 0x9E3779B97F4A7C15) & M64


def splitmix64(s):
    s = (s + 0x9E3779B97F4A7C15) & M64
    z = s
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31), s


def init_tensor(shape, index, seed, bound, is_bias):
    """gtrain's init_tensor: U(-bound, bound) from the stream keyed by (seed, index)."""
    n = math.prod(shape)
    if is_bias:
        return torch.zeros(shape)
    s = (seed ^ ((0xD1B54A32D192ED03 * (index + 1)) & M64)) & M64
    z, _ = splitmix64_block(s, n)
    u = (z >> np.uint64(11)).astype(np.float64) * 2.0**-53
    return torch.from_numpy(((2.0 * u - 1.0) * bound).astype(np.float32).reshape(shape))


def shuffle(n, seed, epoch):
    """gtrain_shuffle: Fisher-Yates with Lemire's bounded draws."""
    r, _ = splitmix64(seed)
    s = r ^ epoch
    perm = list(range(n))
    for i in range(n, 1, -1):
        z, s = splitmix64(s)
        m = (z >> 32) * i
        lo = m & 0xFFFFFFFF
        if lo < i:
            t = ((1 << 32) - i) % i
            while lo < t:
                z, s = splitmix64(s)
                m = (z >> 32) * i
                lo = m & 0xFFFFFFFF
        j = m >> 32
        perm[i - 1], perm[j] = perm[j], perm[i - 1]
    return np.array(perm, np.int64)


# ---- the models (src/train/model.c) ----------------------------------------------------------


class MLP(torch.nn.Module):
    def __init__(self, hidden, seed):
        super().__init__()
        dims = [784] + hidden + [10]
        self.layers = len(dims) - 1
        for i in range(self.layers):
            lin = torch.nn.Linear(dims[i], dims[i + 1])
            relu = i + 1 < self.layers
            bound = math.sqrt((6.0 if relu else 3.0) / dims[i])
            with torch.no_grad():
                lin.weight.copy_(init_tensor(lin.weight.shape, 2 * i, seed, bound, False))
                lin.bias.zero_()
            setattr(self, f"fc{i + 1}", lin)

    def forward(self, x):
        for i in range(self.layers):
            x = getattr(self, f"fc{i + 1}")(x)
            if i + 1 < self.layers:
                x = torch.relu(x)
        return x


class CNN(torch.nn.Module):
    """LeNet-like: conv 5x5 pad 2 -> pool -> conv 5x5 -> pool -> fc -> fc."""

    def __init__(self, hidden, seed):
        super().__init__()
        c1, c2, f1 = hidden
        self.conv1 = torch.nn.Conv2d(1, c1, 5, padding=2)
        self.conv2 = torch.nn.Conv2d(c1, c2, 5)
        self.fc1 = torch.nn.Linear(c2 * 25, f1)
        self.fc2 = torch.nn.Linear(f1, 10)
        for i, (m, relu) in enumerate(((self.conv1, 1), (self.conv2, 1), (self.fc1, 1), (self.fc2, 0))):
            fan_in = m.weight[0].numel()
            bound = math.sqrt((6.0 if relu else 3.0) / fan_in)
            with torch.no_grad():
                m.weight.copy_(init_tensor(m.weight.shape, 2 * i, seed, bound, False))
                m.bias.zero_()

    def forward(self, x):
        x = x.view(-1, 1, 28, 28)
        x = torch.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


def make_model(args):
    if args.model == "cnn":
        return CNN([int(v) for v in (args.hidden or "16,32,128").split(",")], args.seed)
    hidden = [4096, 4096] if args.model == "mlp-large" else [int(v) for v in (args.hidden or "1024,1024").split(",")]
    return MLP(hidden, args.seed)


# ---- data --------------------------------------------------------------------------------


def load(kind, data_dir):
    with gzip.open(f"{data_dir}/{kind}-labels-idx1-ubyte.gz") as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8)
    with gzip.open(f"{data_dir}/{kind}-images-idx3-ubyte.gz") as f:
        raw = np.frombuffer(f.read(), np.uint8, offset=16).reshape(len(y), 784)
    lut = (np.arange(256, dtype=np.float32) / np.float32(255.0) - MEAN) / STD
    return torch.from_numpy(lut[raw]), torch.from_numpy(y.astype(np.int64))


# ---- methods -----------------------------------------------------------------------------


def split_methods(text):
    out = []
    for piece in text.split(","):
        piece = piece.strip()
        if out and ":" not in piece.split(";")[0] and "=" in piece and not piece.startswith("policy"):
            out[-1] += "," + piece
        elif piece:
            out.append(piece)
    return out


def method_policy(method, args):
    """(policy string, strategy) of a gradcomp method, as src/train/exchange.c builds it."""
    strategy = "auto"
    if "@" in method:
        method, strategy = method.rsplit("@", 1)
    if method == "dense":
        return "spec=none;dense=none", strategy
    if method.startswith("policy:"):
        return method[len("policy:"):], strategy
    spec, _, items = method.partition(";")
    keys = {i.split("=", 1)[0].strip() for i in items.split(";") if "=" in i}
    pol = f"spec={spec}" + (";" + items if items else "")
    if "min_elements" not in keys:
        pol += f";min_elements={args.min_elements}"
    if args.min_k and "min_k" not in keys:
        pol += f";min_k={args.min_k}"
    if "dense" not in keys:
        pol += f";dense={args.dense_spec}"
    return pol, strategy


def lr_at(args, progress):
    p = min(max(progress, 0.0), 1.0)
    if args.lr_schedule == "cosine":
        return args.lr * 0.5 * (1.0 + math.cos(math.pi * p))
    if args.lr_schedule == "step":
        return args.lr if p < 0.5 else args.lr * 0.1 if p < 0.75 else args.lr * 0.01
    return args.lr


def param_groups(model, wd):
    decay = [p for n, p in model.named_parameters() if not n.endswith(".bias")]
    no_decay = [p for n, p in model.named_parameters() if n.endswith(".bias")]
    return [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]


def my_address():
    """This rank's IPv4 address that peers can reach (netsim hosts: their eth0), and the
    interface; 127.0.0.1 on one machine."""
    try:
        out = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            f = line.split()
            if len(f) >= 4 and not f[3].startswith("127."):
                return f[3].split("/")[0], f[1]
    except (OSError, subprocess.SubprocessError):
        pass
    return "127.0.0.1", None


def init_gloo(timeout):
    import datetime

    import torch.distributed as dist

    addr, ifname = my_address()
    port = None
    if RANK == 0:
        with socket.socket() as s:
            s.bind((addr, 0))
            port = s.getsockname()[1]
    addr0, port = gm.allgather_object((addr, port), COMM, timeout)[0]
    if ifname:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", ifname)
    os.environ.update(MASTER_ADDR=addr0, MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=RANK, world_size=SIZE, timeout=datetime.timedelta(seconds=timeout))


# ---- one method ---------------------------------------------------------------------------


class Run:
    """One method's training: returns the trainer's result fields."""

    def __init__(self, method, args, train, test):
        self.method, self.args, self.train, self.test = method, args, train, test

    def setup(self):
        args, method = self.args, self.method
        model = make_model(args)
        base = torch.optim.SGD(param_groups(model, args.wd), lr=args.lr, momentum=args.momentum)
        self.kind = method.split(":", 1)[0] if method.startswith("ddp") else "gradcomp"
        self.detail = ""
        self.hook_state = None
        if self.kind == "gradcomp":
            pol, strategy = method_policy(method, args)
            opt = gt.DistributedOptimizer(base, model.named_parameters(), compression=pol, strategy=strategy,
                                          timeout=args.timeout, bucket_bytes=args.bucket_bytes)
            specs = {}
            for _, name, _, spec, strat in opt.layout():
                specs.setdefault(f"{spec}@{strat}", []).append(name)
            self.detail = "; ".join(f"{','.join(n)}: {s}" for s, n in specs.items())
            self.net = model
        else:
            from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
            from torch.nn.parallel import DistributedDataParallel as DDP

            rest = method.split(":", 1)[1] if ":" in method else ""
            if self.kind == "ddp-torch":
                # torch's powerSGD_hook submits its Q allreduce from a gloo callback: with
                # several buckets the ranks submit them in different orders and gloo fails
                # ("enforce fail ... op.preamble.length <= op.nbytes").  One bucket avoids it.
                import torch.distributed as dist

                dist._DEFAULT_FIRST_BUCKET_BYTES = 1 << 40
                ddp = DDP(model, bucket_cap_mb=1 << 20)
            else:
                ddp = DDP(model)
            if self.kind == "ddp-torch":
                rank_r = 4
                if rest.startswith("powersgd"):
                    for kv in rest.partition(":")[2].split(","):
                        if kv.startswith("rank="):
                            rank_r = int(kv[5:])
                state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=rank_r,
                                           start_powerSGD_iter=2, use_error_feedback=True, warm_start=True)
                ddp.register_comm_hook(state, psgd.powerSGD_hook)
                self.detail = f"torch powerSGD_hook rank {rank_r}, one DDP bucket"
            elif self.kind == "ddp-gloo":
                pol, _ = method_policy(rest, args)
                hook, self.hook_state = gt.hook(pol, model=ddp)
                ddp.register_comm_hook(self.hook_state, hook)
                self.detail = f"gradcomp gloo hook, {pol}"
            elif self.kind != "ddp":
                raise SystemExit(f"unknown method {method!r}")
            else:
                self.detail = "DDP all_reduce (gloo)"
            opt = base
            self.net = ddp
        self.model, self.opt = model, opt

    def shard(self):
        """This rank's share [lo, hi) of the test set, as the C trainer splits it."""
        n = len(self.test[1])
        per = (n + SIZE - 1) // SIZE
        return min(n, RANK * per), min(n, (RANK + 1) * per)

    def evaluate(self):
        x, y = self.test
        lo, hi = self.shard()
        sums = np.zeros(3)
        if hi > lo:
            with torch.no_grad():
                logits = self.model(x[lo:hi])
                sums[0] = float((logits.argmax(1) == y[lo:hi]).sum())
                sums[1] = float(torch.nn.functional.cross_entropy(logits, y[lo:hi], reduction="sum"))
                sums[2] = hi - lo
        out = np.zeros(3)
        COMM.Allreduce(sums, out)
        return out[0] / out[2], out[1] / out[2]

    def verdicts(self):
        """The model's verdict on each test sample (1: it predicts the label), every rank's
        share gathered as evaluate() splits the set."""
        x, y = self.test
        lo, hi = self.shard()
        mine = np.zeros(len(y), np.uint8)
        if hi > lo:
            with torch.no_grad():
                mine[lo:hi] = (self.model(x[lo:hi]).argmax(1) == y[lo:hi]).numpy()
        right = np.zeros_like(mine)
        COMM.Allreduce(mine, right)
        return right

    def same_weights(self):
        h = hashlib.sha256()
        for p in self.model.parameters():
            h.update(p.detach().numpy().tobytes())
        return len(set(COMM.allgather(h.hexdigest()))) == 1

    def run(self):
        args = self.args
        self.setup()
        xs, ys = self.train
        n = len(ys)
        steps_per_epoch = (n // SIZE) // args.batch
        if args.max_steps:
            steps_per_epoch = min(steps_per_epoch, args.max_steps)
        eval_every = max(1, steps_per_epoch // max(args.evals, 1))
        acc0, loss0 = self.evaluate()
        points = [dict(epoch=0.0, wall_s=0.0, bytes=0, train_loss=None, test_acc=acc0, test_loss=loss0)]
        wall = compute = wait = 0.0
        loss_sum, loss_n, step = 0.0, 0, 0
        summed = args.loss == "sum"
        total_steps = steps_per_epoch * args.epochs
        gradcomp_opt = self.kind == "gradcomp"
        for epoch in range(args.epochs):
            perm = shuffle(n, args.seed, epoch)
            mine = perm[RANK::SIZE][: n // SIZE]
            for s in range(steps_per_epoch):
                t0 = time.perf_counter()
                if gradcomp_opt:
                    self.opt.set_epoch(epoch + s / steps_per_epoch)
                idx = torch.from_numpy(mine[s * args.batch:(s + 1) * args.batch])
                x, y = xs[idx], ys[idx]
                self.opt.zero_grad()
                out = self.net(x)
                loss = torch.nn.functional.cross_entropy(out, y, reduction="sum" if summed else "mean")
                loss.backward()
                t1 = time.perf_counter()
                if gradcomp_opt:
                    self.opt.synchronize()
                t2 = time.perf_counter()
                if summed:  # MXNet's unit: the optimizer divides by the batch
                    for p in self.model.parameters():
                        p.grad.mul_(1.0 / args.batch)
                for g in self.opt.param_groups:
                    g["lr"] = lr_at(args, step / total_steps)
                if gradcomp_opt:
                    with self.opt.skip_synchronize():
                        self.opt.step()
                else:
                    self.opt.step()
                t3 = time.perf_counter()
                compute += t1 - t0
                wait += t2 - t1
                wall += t3 - t0
                lv = loss.item() / (args.batch if summed else 1)
                if not math.isfinite(lv):
                    raise SystemExit(f"{self.method}: step {step}: loss is {lv}: training diverged")
                loss_sum += lv
                loss_n += 1
                step += 1
                if (s + 1) % eval_every == 0 or s + 1 == steps_per_epoch:
                    ls = COMM.allreduce(np.array([loss_sum, loss_n]))
                    loss_sum, loss_n = 0.0, 0
                    acc, tl = self.evaluate()
                    if not self.same_weights():
                        raise SystemExit(f"{self.method}: the ranks' weights differ after step {step}")
                    sent = self.bytes_sent(step)
                    p = dict(epoch=epoch + (s + 1) / steps_per_epoch, wall_s=wall, bytes=sent,
                             train_loss=ls[0] / ls[1], test_acc=acc, test_loss=tl)
                    points.append(p)
                    if RANK == 0 and not args.quiet:
                        print(f"  {self.method[:40]:40s} epoch {p['epoch']:5.2f}  loss {p['train_loss']:.4f}  "
                              f"acc {100 * acc:6.2f}%  {sent / step:9.0f} B/step  {1e3 * wall / step:7.2f} ms/step",
                              file=sys.stderr, flush=True)
        return self.finish(points, step, wall, compute, wait)

    def bytes_sent(self, steps):
        """What this rank handed to the network so far, as the algorithm counts it (DDP: a
        ring allreduce of every gradient; torch's powerSGD_hook: not counted, NaN)."""
        if self.kind == "gradcomp":
            return self.opt.stats()["bytes_sent"]
        if self.hook_state is not None:
            return self.hook_state.stats["bytes_sent"]
        if self.kind == "ddp":
            dense = 4.0 * sum(p.numel() for p in self.model.parameters())
            return steps * (2.0 * (SIZE - 1) / SIZE * dense if SIZE > 1 else dense)
        return float("nan")

    def finish(self, points, steps, wall, compute, wait):
        params = sum(p.numel() for p in self.model.parameters())
        dense = 4.0 * params
        if self.kind == "gradcomp":
            st = self.opt.stats()
            sent, msg, codec = st["bytes_sent"], st["message_bytes"], st["codec_ns"] * 1e-9
        elif self.kind == "ddp":
            sent, msg, codec = self.bytes_sent(steps), steps * dense, 0.0
        elif self.hook_state is not None:
            sent = self.hook_state.stats["bytes_sent"]
            msg = self.hook_state.stats["message_bytes"] + self.hook_state.stats["dense_bytes"]
            codec = 0.0
        else:
            sent = msg = float("nan")
            codec = 0.0
        v = COMM.allreduce(np.array([wall / steps, codec / steps, wait / steps, compute / steps, sent / steps, wall,
                                     msg / steps])) / SIZE
        same = self.same_weights()
        right = self.verdicts()
        if abs(int(right.sum()) - points[-1]["test_acc"] * len(right)) > 0.5:
            raise SystemExit(f"{self.method}: the final model is right on {int(right.sum())} of {len(right)} "
                             f"test samples, its last evaluation said {points[-1]['test_acc']:.4f}")
        if self.kind == "gradcomp":
            self.opt.close()
        return dict(method=self.method, detail=self.detail, params=params, steps=steps,
                    step_ms=1e3 * v[0], codec_ms=1e3 * v[1], comm_ms=1e3 * v[2], compute_ms=1e3 * v[3],
                    bytes_per_step=v[4], wall_s=v[5], ratio=dense / v[6] if v[6] else float("nan"),
                    traffic_ratio=(2.0 * (SIZE - 1) / SIZE * dense / v[4]) if SIZE > 1 and v[4] else 1.0,
                    final_acc=points[-1]["test_acc"], best_acc=max(p["test_acc"] for p in points),
                    weights_identical=same, points=points, verdicts=right)


def paired_se(a, b):
    """The standard error of accuracy a minus accuracy b from the two models' verdicts on the
    same samples (paired: only the samples they disagree on count), as gradcomp train gives
    it (src/train/trainer.c)."""
    d = a.astype(np.float64) - b.astype(np.float64)
    return float(np.std(d, ddof=1) / math.sqrt(len(d)))


def time_to(r, target):
    for p in r["points"]:
        if p["test_acc"] >= target - 1e-12:
            return p["wall_s"]
    return None


def compare_with_dense(results):
    """Each result's difference to the first dense run, with its paired standard error (None
    for that run itself and without one), in percentage points; the verdicts are dropped."""
    dense = next((r for r in results if r["method"] == "dense"), results[0])
    for r in results:
        r["delta_vs_dense_pp"] = 100 * (r["final_acc"] - dense["final_acc"])
        r["delta_vs_dense_se_pp"] = None if r is dense else 100 * paired_se(r["verdicts"], dense["verdicts"])
    for r in results:
        del r["verdicts"]


def table(results, target, args):
    print(f"\n{'method':36s} {'test acc':>8s} {'Δ dense ±SE':>12s} {'bytes/step':>12s} {'ratio':>9s} "
          f"{'traffic':>8s} {'step ms':>8s} {'codec ms':>8s} {'comm ms':>8s} {'t→target':>9s}")
    for r in results:
        t = time_to(r, target)
        se = r["delta_vs_dense_se_pp"]
        delta = f"{r['delta_vs_dense_pp']:+.2f}" + (f" ±{se:.2f}" if se is not None else "")
        print(f"{r['method'][:36]:36s} {100 * r['final_acc']:7.2f}% {delta:>12s} "
              f"{r['bytes_per_step']:12.0f} {r['ratio']:8.1f}x {r['traffic_ratio']:7.1f}x {r['step_ms']:8.2f} "
              f"{r['codec_ms']:8.2f} {r['comm_ms']:8.2f} {('%.1f s' % t) if t is not None else 'never':>9s}")
    print(f"target accuracy {100 * target:.2f}% (the dense run's final accuracy unless --target-acc); "
          f"±SE: the standard error of the difference to dense from the test samples the two models "
          f"disagree on (paired; another seed moves it further)")
    print(f"{SIZE} ranks, model {args.model}, {args.epochs} epochs x {results[0]['steps'] // args.epochs} steps, "
          f"batch {args.batch}, lr {args.lr} ({args.lr_schedule}), loss {args.loss}; "
          f"step ms: forward+backward+exchange+SGD, comm ms: waiting for the exchange after backward "
          f"(DDP: inside backward)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--compare", default=DEFAULT_METHODS)
    ap.add_argument("--model", default="mlp", choices=["mlp", "mlp-large", "cnn"])
    ap.add_argument("--hidden")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--wd", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--evals", type=int, default=4, help="evaluations per epoch")
    ap.add_argument("--min-elements", type=int, default=8192)
    ap.add_argument("--min-k", type=int, default=512,
                    help="a density codec sends at least K values of a tensor a step (0: exactly ceil(density * n))")
    ap.add_argument("--dense-spec", default="none:values=f16")
    ap.add_argument("--lr-schedule", default="const", choices=["const", "cosine", "step"])
    ap.add_argument("--loss", default="mean", choices=["mean", "sum"])
    ap.add_argument("--max-steps", type=int, default=0, help="at most N steps per epoch")
    ap.add_argument("--target-acc", type=float)
    ap.add_argument("--bucket-bytes", type=int, help="DistributedOptimizer buckets (default 4 MiB; 0: per tensor)")
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--data", default=DATA)
    ap.add_argument("--out", default="out-torch")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    methods = split_methods(args.compare)
    train, test = load("train", args.data), load("t10k", args.data)
    if any(m.startswith("ddp") for m in methods):
        init_gloo(args.timeout)
    if RANK == 0 and not args.quiet:
        print(f"{SIZE} ranks, torch {torch.__version__}, {MPI.Get_library_version().splitlines()[0]}, "
              f"host {socket.gethostname()}, load {os.getloadavg()[0]:.2f}", file=sys.stderr)
    results = []
    for m in methods:
        COMM.Barrier()
        results.append(Run(m, args, train, test).run())
    target = args.target_acc / (100 if args.target_acc > 1 else 1) if args.target_acc else \
        next((r["final_acc"] for r in results if r["method"] == "dense"), results[0]["final_acc"])
    compare_with_dense(results)
    if RANK == 0:
        table(results, target, args)
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump(dict(ranks=SIZE, args=vars(args), target_accuracy=target, load=os.getloadavg(),
                           results=results), f, indent=1)
        print(f"wrote {args.out}/results.json")
    bad = [r["method"] for r in results if not r["weights_identical"]]
    if bad:
        raise SystemExit(f"weights differ across ranks: {bad}")


if __name__ == "__main__":
    main()
