"""gradcomp.torch.DistributedOptimizer under mpirun (2 and 4 ranks).

  * dense through the optimizer equals PyTorch DDP on gloo, same model, data and SGD, to
    float rounding, step by step;
  * each codec family trains (the loss falls) and the replicas stay bit-identical after
    every step; DGC's parameters lose the optimizer's momentum;
  * state_dict() after K steps, loaded into fresh objects, continues bit for bit;
  * ranks with another spec, another model shape or another model raise MismatchError on
    every rank; broadcast_parameters / broadcast_optimizer_state make ranks equal;
  * Horovod's contract: backward_passes_per_step, synchronize / skip_synchronize,
    zero_grad between backward and step, unused parameters, a NaN on one rank.
A dead peer is fail_scenario.py's (run by ctest through tests/mpi/run_fail.sh).
"""

import io
import os
import socket

import numpy as np
import pytest

import gradcomp
from conftest import TIMEOUT, digest, nonfinite_step  # noqa: E402
from mpi4py import MPI

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import gradcomp.mpi as gm  # noqa: E402
import gradcomp.torch as gt  # noqa: E402

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.rank, WORLD.size
IN, HID, OUT, BATCH = 32, 64, 4, 64

CODECS = {
    "topk": "topk:density=0.05,feedback=ef",
    "topk@sparse": ("topk:density=0.05,feedback=ef", "sparse"),
    "dgc": "dgc:density=0.05",
    "powersgd": "powersgd:rank=2",
    "twobit": "twobit:threshold=0.05",
    "int8@rsag": ("int8:feedback=ef", "rsag"),
    "sign": "sign:feedback=ef",
    "qsgd@hierarchical": ("qsgd:levels=16", "hierarchical"),
}


def make_model(hidden=HID, extra=False, seed=0):
    torch.manual_seed(seed)
    layers = [torch.nn.Linear(IN, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, HID), torch.nn.ReLU(),
              torch.nn.Linear(HID, OUT)]
    if extra:
        layers += [torch.nn.ReLU(), torch.nn.Linear(OUT, OUT)]
    return torch.nn.Sequential(*layers)


def batches(steps, start=0, rank=RANK):
    teacher = torch.randn(IN, OUT, generator=torch.Generator().manual_seed(7))
    for s in range(start, start + steps):
        g = torch.Generator().manual_seed(1000 * s + rank)
        x = torch.randn(BATCH, IN, generator=g)
        yield x, (x @ teacher).argmax(1)


def policy(spec):
    # Every weight compressed, biases dense.  A C policy string, so that a bad spec fails
    # inside the (collective) constructor, as a user's would.
    return f"spec={spec};min_elements=64"


def wrap(model, spec="none", strategy="auto", **kw):
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    kw.setdefault("timeout", TIMEOUT)
    return gt.DistributedOptimizer(opt, model.named_parameters(), compression=policy(spec), strategy=strategy,
                                   **kw)


def train(model, opt, steps, start=0, epoch_steps=None):
    losses = []
    for s, (x, y) in enumerate(batches(steps, start)):
        if epoch_steps:
            opt.set_epoch((start + s) / epoch_steps)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def same_everywhere(value):
    got = gm.allgather_object(value, WORLD, TIMEOUT)
    return all(v == got[0] for v in got)


def flat_params(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


@pytest.fixture(scope="module")
def gloo():
    port = None
    if RANK == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = gm.allgather_object(port, WORLD, TIMEOUT)[0]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=RANK, world_size=SIZE)
    yield
    dist.destroy_process_group()


def test_dense_equals_ddp_on_gloo(gloo):
    ddp = torch.nn.parallel.DistributedDataParallel(make_model())
    ref_opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    model = make_model()
    opt = wrap(model, "none", bucket_bytes=8 << 10)  # several buckets
    assert len({b for b, *_ in opt.layout()}) > 1
    worst = 0.0
    for step, (x, y) in enumerate(batches(12)):
        for m, o in ((ddp, ref_opt), (model, opt)):
            o.zero_grad()
            torch.nn.functional.cross_entropy(m(x), y).backward()
            o.step()
        a, b = flat_params(ddp.module), flat_params(model)
        err = float((a - b).abs().max()) / (1 + float(a.abs().max()))
        worst = max(worst, err)
        assert err < 1e-5, f"step {step}: DistributedOptimizer and DDP differ by {err:.3g}"
        assert same_everywhere(digest(model)), f"step {step}: replicas differ"
    st = opt.stats()
    assert st["steps"] == 12 and st["message_bytes"] == st["dense_bytes"] > 0
    opt.close()


@pytest.mark.parametrize("name", list(CODECS))
def test_codec_trains_and_replicas_stay_identical(name):
    spec, strategy = CODECS[name] if isinstance(CODECS[name], tuple) else (CODECS[name], "auto")
    if gradcomp.codec_info(spec.split(":")[0]) is None:
        pytest.skip(f"NOT LANDED: codec {spec.split(':')[0]}")
    comm = gm.Communicator(WORLD, timeout=TIMEOUT, ranks_per_node=2) if "hierarchical" in strategy else None
    model = make_model()
    opt = wrap(model, spec, strategy, comm=comm)
    layout = opt.layout()
    compressed = [x for x in layout if not x[3].startswith("none:")]
    assert [x[1] for x in compressed] == ["4.weight", "2.weight", "0.weight"], layout
    if strategy != "auto":
        assert all(x[4].endswith(strategy.split(":")[-1]) or x[4].startswith(strategy) for x in compressed), layout
    if name == "dgc":  # DGC owns the momentum of its tensors: their group has none
        moms = {id(p): g["momentum"] for g in opt.param_groups for p in g["params"]}
        named = dict(model.named_parameters())
        assert [moms[id(named[k])] for k in ("0.weight", "2.weight", "4.weight", "0.bias")] == [0, 0, 0, 0.9]
    losses, steps = [], 40
    for step, (x, y) in enumerate(batches(steps)):
        opt.set_epoch(step / steps)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        assert same_everywhere(digest(model)), f"{name}: replicas differ after step {step}"
    first, last = np.mean(losses[:5]), np.mean(losses[-5:])
    assert last < 0.85 * first, f"{name}: loss did not fall: {first:.3f} -> {last:.3f}"
    st = opt.stats()
    assert st["steps"] == steps and 0 < st["message_bytes"] < st["dense_bytes"], st
    opt.close()
    if comm is not None:
        comm.close()


def save(model, opt):
    f = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, f)
    return f.getvalue()


@pytest.mark.parametrize("name", ["topk", "dgc", "powersgd", "int8@rsag"])
def test_state_dict_resumes_bit_for_bit(name):
    spec, strategy = CODECS[name] if isinstance(CODECS[name], tuple) else (CODECS[name], "auto")
    if gradcomp.codec_info(spec.split(":")[0]) is None:
        pytest.skip(f"NOT LANDED: codec {spec.split(':')[0]}")
    K, M, E = 6, 6, 8  # steps before the checkpoint, after it; DGC warm-up over E steps
    model = make_model()
    opt = wrap(model, spec, strategy)
    train(model, opt, K, epoch_steps=E)
    blob = save(model, opt)
    train(model, opt, M, start=K, epoch_steps=E)
    ref = digest(model)
    opt.close()

    ck = torch.load(io.BytesIO(blob))
    fresh = make_model(seed=123)  # other weights: everything must come from the checkpoint
    fresh.load_state_dict(ck["model"])
    fopt = wrap(fresh, spec, strategy)
    fopt.load_state_dict(ck["opt"])
    train(fresh, fopt, M, start=K, epoch_steps=E)
    assert digest(fresh) == ref, f"{name}: the resumed run differs from the uninterrupted one"
    fopt.close()

    # Without the buckets' part the residuals start empty: the run must then differ (the
    # state is what made it exact, not luck).
    lost = make_model(seed=123)
    lost.load_state_dict(ck["model"])
    lopt = wrap(lost, spec, strategy)
    lopt.load_state_dict({k: v for k, v in ck["opt"].items() if k != "gradcomp"})
    train(lost, lopt, M, start=K, epoch_steps=E)
    assert digest(lost) != ref
    # another rank's state is refused
    other = torch.load(io.BytesIO(blob))["opt"]
    other["gradcomp"]["rank"] = (RANK + 1) % SIZE
    with pytest.raises(gradcomp.MismatchError):
        lopt.load_state_dict(other)
    # a state whose torch part torch would refuse changes nothing of gradcomp's either (it
    # used to load the buckets' part first, then fail in torch's)
    before = lopt.state_dict()["gradcomp"]["buckets"]
    other = torch.load(io.BytesIO(blob))["opt"]
    other["param_groups"] = other["param_groups"] + [dict(other["param_groups"][0])]
    with pytest.raises(ValueError, match="nothing was loaded"):
        lopt.load_state_dict(other)
    assert lopt.state_dict()["gradcomp"]["buckets"] == before
    lopt.close()


def test_spec_mismatch_raises_on_every_rank():
    spec = "topk:density=0.5,feedback=ef" if RANK == SIZE - 1 else "topk:density=0.05,feedback=ef"
    with pytest.raises(gradcomp.MismatchError) as e:
        wrap(make_model(), spec)
    msg = str(e.value)
    assert "4.weight" in msg and "density=0.5" in msg and "density=0.05" in msg, msg


def test_model_shape_mismatch_raises_on_every_rank():
    with pytest.raises(gradcomp.MismatchError) as e:
        wrap(make_model(hidden=HID + (RANK == SIZE - 1)), "topk:density=0.05,feedback=ef")
    assert "shape" in str(e.value) and ".weight" in str(e.value), str(e.value)


def test_other_model_raises_on_every_rank():
    with pytest.raises(gradcomp.MismatchError) as e:
        wrap(make_model(extra=RANK == 0), "none")
    assert "parameters" in str(e.value), str(e.value)


def test_extra_first_parameter_raises_on_every_rank():
    # One bucket per parameter, buckets in reverse registration order: a parameter
    # registered first on one rank only would be that rank's last bucket, which no peer
    # ever creates - caught before any bucket is made, by comparing the parameter lists.
    model = make_model()
    named = list(model.named_parameters())
    if RANK == 0:
        named = [("pre.weight", torch.nn.Parameter(torch.zeros(8, 8)))] + named
    opt = torch.optim.SGD([p for _, p in named], lr=0.1)
    with pytest.raises(gradcomp.MismatchError) as e:
        gt.DistributedOptimizer(opt, named, bucket_bytes=0, timeout=TIMEOUT, setup_timeout=TIMEOUT)
    assert "pre.weight" in str(e.value), str(e.value)


def test_local_setup_error_fails_every_rank():
    spec = "topk:densty=0.05" if RANK == 0 else "topk:density=0.05"
    with pytest.raises(gradcomp.Error) as e:
        wrap(make_model(), spec)
    if RANK == 0:
        assert isinstance(e.value, gradcomp.SpecError)
    else:
        assert "rank 0" in str(e.value) and "densty" in str(e.value), str(e.value)


def test_broadcast_parameters_and_optimizer_state():
    model = make_model(seed=RANK)  # every rank its own weights
    assert same_everywhere(digest(model)) == (SIZE == 1)
    gt.broadcast_parameters(model.state_dict(), root_rank=0)
    assert same_everywhere(digest(model))
    assert digest(model) == digest(make_model(seed=0))
    opt = wrap(model, "topk:density=0.05,feedback=ef")
    if RANK == 0:  # momentum buffers on rank 0 only, and another lr
        for g in opt.param_groups:
            g["lr"] = 0.05
        for p in model.parameters():
            opt.state[p]["momentum_buffer"] = torch.full_like(p, 0.25)
    gt.broadcast_optimizer_state(opt, root_rank=0)
    assert all(g["lr"] == 0.05 for g in opt.param_groups)
    assert all(torch.equal(opt.state[p]["momentum_buffer"], torch.full_like(p, 0.25)) for p in model.parameters())
    # ranks that name other tensors are refused on every rank
    named = {("x" if RANK == 0 else "y"): torch.zeros(3)}
    with pytest.raises(gradcomp.MismatchError):
        gt.broadcast_parameters(named)
    opt.close()


def test_backward_passes_per_step_accumulates():
    data = list(batches(2))
    a = make_model()
    oa = wrap(a, "none", backward_passes_per_step=2)
    oa.zero_grad()
    for x, y in data:
        torch.nn.functional.cross_entropy(a(x), y).backward()
    with pytest.raises(AssertionError):  # a third pass before step
        torch.nn.functional.cross_entropy(a(data[0][0]), data[0][1]).backward()
    oa.synchronize()
    b = make_model()
    ob = wrap(b, "none")
    ob.zero_grad()
    sum(torch.nn.functional.cross_entropy(b(x), y) for x, y in data).backward()
    ob.synchronize()
    for (n, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert torch.allclose(pa.grad, pb.grad, rtol=1e-5, atol=1e-7), n
    oa.close()
    ob.close()


def test_synchronize_skip_synchronize_zero_grad():
    model = make_model()
    opt = wrap(model, "topk:density=0.05,feedback=ef")
    x, y = next(batches(1))
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    with pytest.raises(AssertionError):
        opt.zero_grad()
    with pytest.raises(gradcomp.ProtocolError):
        opt.state_dict()
    opt.synchronize()
    grads = [p.grad.clone() for p in model.parameters()]
    opt.synchronize()  # idempotent: no second exchange
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters()))
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
    assert isinstance(opt, torch.optim.SGD)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)  # wraps opt.step: still ours
    with opt.skip_synchronize():
        opt.step()
    sched.step()
    assert opt.stats()["steps"] == 1 and opt.param_groups[0]["lr"] == 0.05
    assert same_everywhere(digest(model))
    opt.close()


def test_unused_parameter_gets_zeros():
    model = make_model(extra=True)  # the last layer is never used below
    opt = wrap(model, "none")
    x, y = next(batches(1))
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model[:5](x), y).backward()
    opt.step()
    assert torch.count_nonzero(model[6].weight.grad) == 0
    assert same_everywhere(digest(model))
    opt.close()


def test_a_rank_without_backward_takes_part_with_zeros():
    # A rank whose backward did not run this step (no batch, a skipped loss) still calls
    # step(): it takes part in the exchange with zeros, as in Horovod, which is what a zero
    # loss's backward sends (the twin).  It used to return at once while the others waited,
    # then start its next backward's exchange against their pending one: a step apart.
    model, twin = make_model(), make_model()
    opt = wrap(model, "topk:density=0.05,feedback=ef")
    ref = wrap(twin, "topk:density=0.05,feedback=ef")
    for s, (x, y) in enumerate(batches(4)):
        skip = s == 1 and RANK == SIZE - 1
        opt.zero_grad()
        if not skip:
            torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        ref.zero_grad()
        loss = torch.nn.functional.cross_entropy(twin(x), y)
        (loss * 0 if skip else loss).backward()
        ref.step()
    assert same_everywhere(digest(model))
    assert digest(model) == digest(twin)
    opt.close()
    ref.close()


def test_a_parameter_unfrozen_later_is_refused_on_every_rank():
    # Frozen when the optimizer was built, a parameter has no bucket; unfrozen later, its
    # gradient would be each rank's own and the replicas would drift apart without a word.
    model = make_model()
    model[0].weight.requires_grad_(False)
    opt = wrap(model, "topk:density=0.05,feedback=ef")
    train(model, opt, 1)  # frozen: fine
    model[0].weight.requires_grad_(True)
    x, y = next(batches(1, start=1))
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    with pytest.raises(gradcomp.ArgumentError, match=r"needed no gradient.*Build the DistributedOptimizer again"):
        opt.step()
    opt.close()


def test_warmup_without_an_epoch_raises_on_every_rank():
    # A DGC warm-up follows the epoch the caller gives; never given one, it would stay at its
    # first density for good: the first step refuses, by name, before any exchange starts.
    model = make_model()
    opt = wrap(model, "dgc:density=0.05,warmup=1")
    x, y = next(batches(1))
    torch.nn.functional.cross_entropy(model(x), y).backward()
    with pytest.raises(gradcomp.ArgumentError, match=r"warm-up of 1 epochs.*optimizer.set_epoch\(epoch\)"):
        opt.step()
    opt.close()
    model = make_model()
    opt = wrap(model, "dgc:density=0.05,warmup=1")
    before = digest(model)
    train(model, opt, 4, epoch_steps=4)
    assert digest(model) != before and same_everywhere(digest(model))
    opt.close()


def test_nonfinite_gradient_raises_on_every_rank():
    model = make_model()
    # one bucket per parameter: the later hooks of this backward poke the buckets already in
    # flight, and the NaN comes back there first - step() must be where it is raised
    opt = wrap(model, "topk:density=0.05,feedback=ef", bucket_bytes=0)
    nonfinite_step(model, opt, *next(batches(1)))
    before = digest(model)
    train(model, opt, 2, start=1)  # the next steps work
    assert digest(model) != before and same_everywhere(digest(model))
    opt.close()
