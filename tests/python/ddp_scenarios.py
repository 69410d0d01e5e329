"""ddp_scenarios.py - short 2-process gloo DDP runs with the gradcomp hook, for the tests.

    python3 ddp_scenarios.py --out results.json SCENARIO [SCENARIO ...]

A scenario is `train:<spec>`, `resume:<spec>` or `mismatch`.  Both ranks run every
scenario in one process pair (one torch start-up for the whole suite) and write what they
saw to <out>.rank<r>.json; test_torch_hook.py reads and checks it.  Runs are
deterministic: fixed seeds, synthetic teacher data, one thread.

  train:   30 steps; loss per step, parameters' checksum on every rank, the hook's byte
           counters and the C statistics of every compressor.
  resume:  20 uninterrupted steps, and 10 + pickle/restore into a fresh model, optimizer
           and hook state + 10 more; the final parameters of both.
  mismatch: rank 1 uses another spec for one layer; the error each rank gets.
"""

import argparse
import io
import json
import os
import pickle
import socket
import sys
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

import gradcomp
import gradcomp.torch as gt

IN, HID, OUT, BATCH = 32, 64, 4, 64


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(IN, HID), torch.nn.ReLU(), torch.nn.Linear(HID, HID), torch.nn.ReLU(),
        torch.nn.Linear(HID, OUT))


def batches(rank, steps, start=0):
    teacher = torch.randn(IN, OUT, generator=torch.Generator().manual_seed(7))
    for s in range(start, start + steps):
        g = torch.Generator().manual_seed(1000 * s + rank)
        x = torch.randn(BATCH, IN, generator=g)
        yield x, (x @ teacher).argmax(1)


def policy(spec):
    # Every 2-D weight is compressed (the small last layer too), biases go dense.
    return gt.LayerPolicy(spec, min_elements=64)


def setup(spec, state=None, names=True):
    """A fresh DDP model, optimizer and hook state (or `state`, restored from a pickle).
    names: key the compressors by parameter name; else by order of first appearance."""
    model = DDP(make_model())
    if state is None:
        hook, state = gt.hook(policy(spec), model=model if names else None)
    else:
        hook = gt.gradcomp_hook
        if names:
            state.bind(model)
    model.register_comm_hook(state, hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return model, opt, state


def train(model, opt, rank, steps, start=0):
    losses = []
    for x, y in batches(rank, steps, start):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def flat_params(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def replicas_identical(model):
    flat = flat_params(model)
    outs = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(outs, flat)
    return all(torch.equal(outs[0], o) for o in outs)


def scenario_train(rank, spec):
    model, opt, state = setup(spec, names=False)
    losses = train(model, opt, rank, 30)
    comps = state.compressors
    return {
        "losses": losses,
        "identical": replicas_identical(model),
        "stats": dict(state.stats),
        "c_bytes_out": sum(c.stats["bytes_out"] for c in comps.values()),
        "c_messages": sum(c.stats["messages"] for c in comps.values()),
        "c_stats": {k: c.stats for k, c in comps.items()},
        "keys": sorted(comps),
        "steps": state.step,
    }


def scenario_exchanges(rank, spec):
    """The gather path in one exchange (messages padded to their bound, the lengths inside)
    and in two (lengths first): the same training, bit for bit, from the same start."""
    out = {}
    real = gt._ONE_EXCHANGE_SLACK
    try:
        for name, slack in (("one", real), ("two", 0.0)):
            gt._ONE_EXCHANGE_SLACK = slack
            model, opt, state = setup(spec, names=False)
            losses = train(model, opt, rank, 8)
            out[name] = {"losses": losses, "params": flat_params(model).tolist(),
                         "pad": state.stats["pad_bytes"], "message": state.stats["message_bytes"],
                         "identical": replicas_identical(model)}
    finally:
        gt._ONE_EXCHANGE_SLACK = real
    return out


def scenario_resume(rank, spec):
    model, opt, state = setup(spec)
    train(model, opt, rank, 20)
    straight = flat_params(model)

    model, opt, state = setup(spec)
    train(model, opt, rank, 10)
    blob = io.BytesIO()
    torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(),
                "hook": pickle.dumps(state)}, blob)
    blob.seek(0)
    ck = torch.load(blob)
    del model, opt, state
    restored = pickle.loads(ck["hook"])
    # Saved with names, restored without: the i-th parameter seen takes the i-th saved key.
    model2, opt2, restored = setup(spec, restored, names=False)
    model2.module.load_state_dict(ck["model"])
    opt2.load_state_dict(ck["opt"])
    train(model2, opt2, rank, 10, start=10)
    resumed = flat_params(model2)
    diff = (straight - resumed).abs().max().item()
    return {"identical": bool(torch.equal(straight, resumed)), "max_abs_diff": diff,
            "steps": restored.step, "replicas_identical": replicas_identical(model2),
            "keys": sorted(restored.compressors)}


def scenario_mismatch(rank, spec):
    other = "topk:density=0.5" if rank == 1 else spec

    def pol(key, shape):
        if key == "2.weight":
            return other
        return None

    return first_step_error(rank, pol)


def scenario_mismatchprobe(rank, method):
    """An adaptive method whose ranks were given different link probe sizes: refused at
    the first step, on every rank, before any probe could wait for bytes never sent."""
    return first_step_error(rank, method, total_steps=40, probe_bytes=65536 if rank == 1 else None)


def scenario_mismatchadapt(rank, method):
    """Ranks whose adaptive methods would decide at different steps: another interval on
    rank 1, then another run length under interval=auto.  Refused at the first step, on
    every rank; before, the two entered a decision's collective at different steps and
    waited there for the process group's timeout."""
    other = method.replace("interval=5", "interval=7") if rank == 1 else method
    auto = method.replace(";interval=5", "")
    return {"interval": first_step_error(rank, other, total_steps=40, probe_bytes=0),
            "total_steps": first_step_error(rank, auto, total_steps=400 if rank else 800,
                                            probe_bytes=0)}


def scenario_restoreother(rank, method):
    """A hook state pickled before its first step, restored into a model of other shapes:
    refused at bind, before the controllers (made for the old shapes) read a gradient; it
    segfaulted there."""
    model = DDP(make_model())
    _, state = gt.hook(method, model=model, total_steps=40, probe_bytes=0)
    restored = pickle.loads(pickle.dumps(state))
    torch.manual_seed(0)
    narrow = DDP(torch.nn.Sequential(torch.nn.Linear(IN, HID // 2), torch.nn.ReLU(),
                                     torch.nn.Linear(HID // 2, HID), torch.nn.ReLU(),
                                     torch.nn.Linear(HID, OUT)))
    try:
        restored.bind(narrow)
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}
    return {"error": None}


def scenario_nanone(rank, spec):
    """A NaN gradient on rank 1 only, at the first step (two exchanges: lengths, then
    messages) and at the third (one exchange carries both): every rank raises
    NonFiniteError from that step, rank 0 naming rank 1, instead of rank 0 waiting in
    the exchange for the process group's timeout."""
    out = {}
    for at in (0, 2):
        model = DDP(make_model())
        hook, state = gt.hook(spec, model=model)
        model.register_comm_hook(state, hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        t0 = time.perf_counter()
        err = None
        try:
            for s, (x, y) in enumerate(batches(rank, at + 1)):
                loss = torch.nn.functional.cross_entropy(model(x), y)
                if s == at and rank == 1:
                    loss = loss * float("nan")
                opt.zero_grad()
                loss.backward()
                opt.step()
        except Exception as e:  # DDP re-raises the hook's error from backward()
            err = f"{type(e).__name__}: {e}"
        out[str(at)] = {"error": err, "seconds": time.perf_counter() - t0}
    return out


def scenario_overflowone(rank, spec):
    """A finite gradient on rank 1 whose PowerSGD factor Q = M^T P^ overflows (a column of
    8e37, under begin's FLT_MAX / 4): that rank fails after the P all_reduce, not at begin,
    and every rank raises NonFiniteError from the Q all_reduce."""
    model = DDP(make_model())
    hook, state = gt.hook(spec, model=model)
    model.register_comm_hook(state, hook)
    if rank == 1:
        def big(g):
            g = g.clone()
            g[:, 0] = 8e37
            return g
        model.module[0].weight.register_hook(big)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    t0 = time.perf_counter()
    err = None
    try:
        train(model, opt, rank, 1)
    except Exception as e:  # DDP re-raises the hook's error from backward()
        err = f"{type(e).__name__}: {e}"
    return {"error": err, "seconds": time.perf_counter() - t0}


def first_step_error(rank, policy, **kw):
    """One step of DDP with gradcomp's hook on `policy`: the error it raised, or None."""
    model = DDP(make_model())
    hook, state = gt.hook(policy, model=model, **kw)
    model.register_comm_hook(state, hook)
    try:
        train(model, torch.optim.SGD(model.parameters(), lr=0.1), rank, 1)
    except Exception as e:  # DDP re-raises the hook's error from backward()
        return {"error": f"{type(e).__name__}: {e}"}
    return {"error": None}


def scenario_warmup(rank, spec):
    """A DGC warm-up never given an epoch is refused at the first step, by name; given one,
    the same spec trains.  Both ranks fail alike, before any collective of the hook."""
    model, opt, state = setup(spec)
    try:
        train(model, opt, rank, 1)
        error = None
    except Exception as e:  # DDP re-raises the hook's error from backward()
        error = f"{type(e).__name__}: {e}"
    model, opt, state = setup(spec)
    state.set_epoch(0.0)
    losses = train(model, opt, rank, 3)
    return {"error": error, "losses": losses, "identical": replicas_identical(model)}


def scenario_adaptive(rank, method):
    """An adaptive method through the hook: every rank its own compute timings, the
    decisions (and so the specs) must agree, the replicas stay identical."""
    model = DDP(make_model())
    hook, state = gt.hook(method, model=model, total_steps=40)
    model.register_comm_hook(state, hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    history = []
    for s, (x, y) in enumerate(batches(rank, 40)):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        state.observe_compute(0.001 * (rank + 1), 0.002 * (rank + 2), 0.0001)
        state.observe_link(1e8 * (1 + rank), 5e-5 * (1 + rank))
        history.append({k: c.spec for k, c in sorted(state.compressors.items())})
    return {"identical": replicas_identical(model), "history": history,
            "decisions": state.adapt.report["decisions"], "loss": loss.item()}


def scenario_probe(rank, method):
    """The bandwidth controller through the hook with no link fed from outside: the hook
    probes it at the decisions that ask for one.  Every probe call is counted and what
    it measured kept, beside the link each decision used."""
    model = DDP(make_model())
    hook, state = gt.hook(method, model=model, total_steps=40)
    model.register_comm_hook(state, hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    probes, real = [], gt.link_probe

    def counted(nbytes, group):
        r = real(nbytes, group)
        probes.append({"step": state.step, "nbytes": nbytes, "link": r})
        return r

    gt.link_probe = counted
    links, history = [], []
    try:
        for x, y in batches(rank, 40):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            state.observe_compute(0.001 * (rank + 1), 0.002 * (rank + 2), 0.0001)
            rep = state.adapt.report
            links.append((rep["decisions"], rep["bandwidth"], rep["latency"]))
            history.append({k: c.spec for k, c in sorted(state.compressors.items())})
    finally:
        gt.link_probe = real
    return {"identical": replicas_identical(model), "probes": probes, "links": links,
            "history": history, "decisions": state.adapt.report["decisions"]}


def scenario_groups(rank, method):
    """DDP's buckets as the controllers' exchange groups: a model cut into several buckets
    (the first bucket's 1 MiB floor lowered for it), an adaptive method deciding every 5
    steps: the groups the hook gave after each step, and the decisions taken with them."""
    first = dist._DEFAULT_FIRST_BUCKET_BYTES
    dist._DEFAULT_FIRST_BUCKET_BYTES = 8 << 10
    try:
        model = DDP(make_model(), bucket_cap_mb=8 / 1024)
    finally:
        dist._DEFAULT_FIRST_BUCKET_BYTES = first
    hook, state = gt.hook(method, model=model, total_steps=20)
    model.register_comm_hook(state, hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    groups = []
    for x, y in batches(rank, 12):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        state.observe_compute(0.001, 0.002, 0.0001)
        groups.append(list(state._groups))
    # What the controllers hold: the configuration fingerprint (words 1 and 2 of the
    # statistics) of the same method (with the hook's defaults and its exchanges'
    # strategies, which the fingerprint covers) given those groups, and given none.
    pol = state.policy
    fp = {}
    for name, g in (("hook", None), ("given", groups[-1]), ("none", None)):
        ad = state.adapt if name == "hook" else gradcomp.Adapt(
            gt._with_hook_defaults(method), pol._tensors, total_steps=20, workers=2,
            min_elements=pol.min_elements, strategy=gt._hook_route_strategy)
        if name == "given":
            ad.set_exchanges(g)
        fp[name] = ad.stats()[1:3].tolist()
    return {"identical": replicas_identical(model), "groups": groups, "fp": fp,
            "names": state.adapt.names, "decisions": state.adapt.report["decisions"]}


def scenario_switch(rank, method, quiet=None):
    """An adaptive method that switches every parameter to dense (a link fed as nearly
    free): what each step sent, by path, and the replicas.  quiet: a rank whose
    gradients are all zero (its loss times 0), so that its compressors hold nothing back
    when they switch while the other's do."""
    model = DDP(make_model())
    hook, state = gt.hook(method, model=model, total_steps=40, probe_bytes=0)
    model.register_comm_hook(state, hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sent, losses = [], []
    for x, y in batches(rank, 20):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        (loss * (0.0 if rank == quiet else 1.0)).backward()
        opt.step()
        state.observe_compute(0.2, 0.4, 0.01)  # the loop's own: the hook's measure stops
        state.observe_link(1e12, 1e-6)
        losses.append(loss.item())
        sent.append({"message": state.stats["message_bytes"], "dense": state.stats["dense_bytes"],
                     "specs": sorted({c.spec for c in state.compressors.values()})})
    return {"identical": replicas_identical(model), "sent": sent, "losses": losses,
            "compute_s": state.adapt.report["compute_s"]}


def scenario_psgdflush(rank, method):
    """An adaptive method that moves every weight from PowerSGD rank 2 to a rank at which
    low rank does not pay (so it sends them dense): plain SGD, and beside the DDP model a
    copy that computes each rank's own gradient, so the test can check that nothing held
    back is lost: sum of mean gradients = (start - end parameters) / lr + mean held back."""
    model = DDP(make_model())
    hook, state = gt.hook(method, model=model, total_steps=40, probe_bytes=0)
    model.register_comm_hook(state, hook)
    lr = 0.1
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    ref = make_model()
    start = flat_params(model).clone()
    total = torch.zeros_like(start)
    history = []
    for x, y in batches(rank, 20):
        ref.load_state_dict(model.module.state_dict())
        ref.zero_grad()
        torch.nn.functional.cross_entropy(ref(x), y).backward()
        g = torch.cat([p.grad.reshape(-1) for p in ref.parameters()])
        dist.all_reduce(g)
        total += g / dist.get_world_size()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        state.observe_compute(0.2, 0.4, 0.01)
        state.observe_link(1e12, 1e-6)  # nearly free: the rank that sends everything wins
        history.append(sorted({c.spec.split(",")[0] for c in state.compressors.values()}))
    comps = state.compressors
    held = torch.cat([torch.from_numpy(comps[n].residual) if n in comps and comps[n].residual
                      is not None else torch.zeros(p.numel())
                      for n, p in model.named_parameters()])
    dist.all_reduce(held)
    gap = total - (start - flat_params(model)) / lr - held / dist.get_world_size()
    return {"history": history, "identical": replicas_identical(model),
            "gap": gap.abs().max().item(), "scale": total.abs().max().item()}


def scenario_resumeadapt(rank, method):
    """An adaptive method saved at step 10, with a decision due as the next step begins,
    and restored: the same training as without the break, bit for bit."""

    def start(state=None):
        model = DDP(make_model())
        if state is None:
            hook, state = gt.hook(method, model=model, total_steps=20, probe_bytes=0)
        else:
            hook = gt.gradcomp_hook
            state.bind(model)
        model.register_comm_hook(state, hook)
        return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), state

    def run(model, opt, state, steps, begin=0):
        for x, y in batches(rank, steps, begin):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            state.observe_compute(0.2, 0.4, 0.01)
            state.observe_link(1e12 if state.step > 5 else 1e6, 1e-6)

    model, opt, state = start()
    run(model, opt, state, 20)
    straight = flat_params(model)
    model, opt, state = start()
    run(model, opt, state, 10)
    due, specs = state._adapt_due, sorted({c.spec for c in state.compressors.values()})
    ck = pickle.dumps({"model": model.module.state_dict(), "opt": opt.state_dict(), "hook": state})
    del model, opt, state
    ck = pickle.loads(ck)
    model, opt, state = start(ck["hook"])
    model.module.load_state_dict(ck["model"])
    opt.load_state_dict(ck["opt"])
    run(model, opt, state, 10, 10)
    return {"identical": bool(torch.equal(straight, flat_params(model))), "due": due,
            "decisions": state.adapt.report["decisions"], "specs_at_save": specs,
            "specs_at_end": sorted({c.spec for c in state.compressors.values()}),
            "replicas_identical": replicas_identical(model)}


def scenario_autocompute(rank, method):
    """The hook measures the compute between exchanges itself: each step sleeps 30 ms
    before its forward pass (the loop's compute), and one step in ten 1.5 s more (an
    evaluation, which the measure must leave out).  What each decision saw."""
    model = DDP(make_model())
    hook, state = gt.hook(method, model=model, total_steps=40)
    model.register_comm_hook(state, hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    seen = []
    for s, (x, y) in enumerate(batches(rank, 40)):
        time.sleep(0.03 + (1.5 if s % 10 == 2 else 0.0))
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        rep = state.adapt.report
        if rep["decisions"] and (not seen or seen[-1][0] != rep["decisions"]):
            seen.append((rep["decisions"], rep["step"], rep["compute_s"]))
    return {"identical": replicas_identical(model), "seen": seen}


SCENARIOS = {"train": scenario_train, "resume": scenario_resume, "mismatch": scenario_mismatch,
             "mismatchprobe": scenario_mismatchprobe, "mismatchadapt": scenario_mismatchadapt,
             "restoreother": scenario_restoreother, "nanone": scenario_nanone,
             "overflowone": scenario_overflowone,
             "adaptive": scenario_adaptive, "warmup": scenario_warmup, "probe": scenario_probe,
             "switch": scenario_switch, "switchquiet": lambda r, m: scenario_switch(r, m, quiet=0),
             "resumeadapt": scenario_resumeadapt, "psgdflush": scenario_psgdflush, "autocompute": scenario_autocompute,
             "exchanges": scenario_exchanges, "groups": scenario_groups}


def worker(rank, world, port, scenarios, out):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    results = {}
    for sc in scenarios:
        kind, _, spec = sc.partition(":")
        try:
            results[sc] = SCENARIOS[kind](rank, spec)
        except Exception:
            results[sc] = {"exception": traceback.format_exc()}
            if kind == "mismatch":
                break
        dist.barrier()
    with open(f"{out}.rank{rank}.json", "w") as f:
        json.dump(results, f)
    dist.destroy_process_group()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("scenarios", nargs="+")
    a = ap.parse_args()
    # Mismatch and warmup leave DDP objects in an error state: run them last.
    sc = sorted(a.scenarios, key=lambda s: (s.startswith("mismatch"), s.startswith("warmup")))
    mp.spawn(worker, args=(a.world, free_port(), sc, a.out), nprocs=a.world, join=True)
    print("gradcomp", gradcomp.LIBRARY_PATH, file=sys.stderr)


if __name__ == "__main__":
    main()
