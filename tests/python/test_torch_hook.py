"""The DDP communication hook on 2 gloo processes (CPU): training, replicas, bytes, resume.

One process pair runs every scenario (tests/python/ddp_scenarios.py), so torch starts
once; each test below checks one property of what the ranks reported.  Codecs that have
not landed in C yet are skipped by name (NOT LANDED in the skip reason).
"""

import json
import math
import os
import pickle
import re
import subprocess
import sys

import pytest

import gradcomp
from conftest import HAVE_TORCH, HERE, REPO, has_codec, needs_codec, needs_torch

pytestmark = needs_torch

TOPK = "topk:density=0.05,feedback=ef"
TWOBIT = "twobit:threshold=0.05"
POWERSGD = "powersgd:rank=2"
SPECS = {"topk": TOPK, "twobit": TWOBIT, "powersgd": POWERSGD}
WARMUP = "dgc:density=0.05,warmup=1"
# Every controller that needs no outside measurement, deciding every 5 steps.
ADAPTIVE = ("adapt:bandwidth+layers+norm;base=topk:density=0.05,feedback=ef;min_elements=64;"
            "interval=5;measure=5;confirm=1")
# The bandwidth controller alone, its link measured by the hook's own probe.
PROBED = "adapt:bandwidth;min_elements=64;interval=5;measure=5;confirm=1"
# PowerSGD rank 2, or rank 24, where low rank does not pay for these weights (dense): on a
# nearly free link the controller takes rank 24, and what rank 2 held back must go out.
PSGD_FLUSH = ("adapt:bandwidth;base=powersgd:rank=2;ladder=powersgd:rank=24/powersgd:rank=2;with_dense=0;"
              "min_elements=64;interval=5;measure=5;confirm=1")
# Top-k, or dense on a link fed as nearly free: the controller takes dense.
SWITCH = ("adapt:bandwidth;base=topk:density=0.05,feedback=ef;ladder=dense/topk:density=0.05,feedback=ef;"
          "min_elements=64;interval=5;measure=5;confirm=1")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    if not HAVE_TORCH:
        pytest.skip("PyTorch is not installed")
    scen = []
    for name, spec in SPECS.items():
        if has_codec(name):
            scen += [f"train:{spec}", f"resume:{spec}"]
    scen.append(f"adaptive:{ADAPTIVE}")
    scen.append(f"probe:{PROBED}")
    scen.append(f"switch:{SWITCH}")
    scen.append(f"switchquiet:{SWITCH}")
    scen.append(f"resumeadapt:{SWITCH}")
    scen.append(f"psgdflush:{PSGD_FLUSH}")
    scen.append(f"autocompute:{PROBED}")
    scen.append(f"groups:{PROBED}")
    scen.append(f"exchanges:{TOPK}")
    scen.append(f"mismatch:{TOPK}")
    scen.append(f"mismatchprobe:{PROBED}")
    scen.append(f"mismatchadapt:{PROBED}")
    scen.append(f"restoreother:{PROBED}")
    scen.append(f"nanone:{TOPK}")
    if has_codec("powersgd"):
        scen.append(f"nanone:{POWERSGD}")  # the factors' all_reduce, fp32 with the dense ones
        scen.append(f"nanone:{POWERSGD},values=f16")  # fp16 factors, the dense ones apart
        scen.append(f"overflowone:{POWERSGD}")
    scen.append(f"warmup:{WARMUP}")
    out = str(tmp_path_factory.mktemp("ddp") / "r")
    pkg = os.path.join(REPO, "python")
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [pkg, os.environ.get("PYTHONPATH")])))
    p = subprocess.run([sys.executable, os.path.join(HERE, "ddp_scenarios.py"), "--out", out, *scen],
                       env=env, capture_output=True, text=True, timeout=400)
    assert p.returncode == 0, p.stdout + p.stderr
    res = []
    for r in range(2):
        with open(f"{out}.rank{r}.json") as f:
            res.append(json.load(f))
    return res


def get(runs, key):
    out = []
    for r in runs:
        v = r[key]
        assert "exception" not in v, v["exception"]
        out.append(v)
    return out


def check_training(runs, spec):
    r0, r1 = get(runs, f"train:{spec}")
    for r in (r0, r1):
        first, last = sum(r["losses"][:5]) / 5, sum(r["losses"][-5:]) / 5
        assert last < 0.85 * first, f"loss did not go down: {first:.3f} -> {last:.3f}"
        assert r["identical"], "parameters differ across ranks"
        assert r["steps"] == 30
        assert r["stats"]["steps"] == 30
        assert r["keys"] == ["#0", "#2", "#4"]  # the three weights; biases dense
        assert r["stats"]["dense_bytes"] == 30 * 4 * (64 + 64 + 4)
    return r0, r1


def check_message_bytes(runs, spec):
    for r in get(runs, f"train:{spec}"):
        st = r["stats"]
        assert st["message_bytes"] == r["c_bytes_out"] > 0
        assert r["c_messages"] == 3 * 30
        assert st["bytes_sent"] == st["message_bytes"] + st["dense_bytes"]
        if spec != POWERSGD:  # PowerSGD decodes nothing: it sums factors
            for k, c in r["c_stats"].items():
                assert c["decoded"] == 2 * c["messages"], k  # own and the peer's message


def check_resume(runs, spec):
    for r in get(runs, f"resume:{spec}"):
        assert r["identical"], f"resumed run differs from the uninterrupted one by {r['max_abs_diff']}"
        assert r["replicas_identical"]
        assert r["steps"] == 20
        assert r["keys"] == ["0.weight", "2.weight", "4.weight"]


@needs_codec("topk")
def test_topk_ef(runs):
    check_training(runs, TOPK)
    check_message_bytes(runs, TOPK)


@needs_codec("topk")
def test_topk_ef_resume(runs):
    check_resume(runs, TOPK)


@needs_codec("twobit")
def test_twobit(runs):
    check_training(runs, TWOBIT)
    check_message_bytes(runs, TWOBIT)


@needs_codec("twobit")
def test_twobit_resume(runs):
    check_resume(runs, TWOBIT)


@needs_codec("powersgd")
def test_powersgd(runs):
    check_training(runs, POWERSGD)
    check_message_bytes(runs, POWERSGD)
    for r in get(runs, f"train:{POWERSGD}"):
        st = r["stats"]
        # rank 2, fp32: P (rows x 2) and Q (2 x cols) per step for the 64x32 and 64x64
        # weights; the 4x64 one would not shrink 2x ((4+64)*2*2 >= 256): dense steps.
        assert st["lowrank_bytes"] == 30 * 4 * 2 * ((64 + 32) + (64 + 64)), st
        assert r["c_stats"]["#4"]["bytes_out"] == 30 * 4 * 4 * 64
        assert st["message_bytes"] == st["lowrank_bytes"] + 30 * 4 * 4 * 64


@needs_codec("powersgd")
def test_powersgd_resume(runs):
    check_resume(runs, POWERSGD)


def test_spec_mismatch_names_the_parameter(runs):
    for rank, r in enumerate(runs):
        err = r[f"mismatch:{TOPK}"].get("error") or ""
        assert "MismatchError" in err and "2.weight" in err, err
        assert "density=0.5" in err and "density=0.05" in err, err


def test_mismatched_probe_sizes_are_refused(runs):
    for r in runs:
        err = r[f"mismatchprobe:{PROBED}"].get("error") or ""
        assert "MismatchError" in err and "probe_bytes=" in err, err
        assert "524288" in err and "65536" in err, err


def test_adaptive_ranks_that_would_decide_apart_are_refused(runs):
    for rank, r in enumerate(runs):
        v = r[f"mismatchadapt:{PROBED}"]
        for case in ("interval", "total_steps"):
            err = v[case].get("error") or ""
            assert "MismatchError" in err and "another adaptive configuration" in err, (case, err)


def test_restored_controllers_of_another_model_are_refused(runs):
    for r in runs:
        err = r[f"restoreother:{PROBED}"].get("error") or ""
        assert "StateError" in err and "0.weight" in err and "restore a state saved" in err, err


@pytest.mark.parametrize("spec", [TOPK, POWERSGD, POWERSGD + ",values=f16"])
def test_a_nan_on_one_rank_raises_on_every_rank(runs, spec):
    # the process group's timeout is torch's default (30 min): seconds mean nobody waited
    if not has_codec(spec.split(":")[0]):
        pytest.skip(f"{spec} is not built")
    for rank, r in enumerate(runs):
        for at, v in r[f"nanone:{spec}"].items():
            err = v["error"] or ""
            assert "NonFiniteError" in err, (rank, at, err)
            assert rank == 1 or "rank 1's gradient holds NaN or Inf" in err, (at, err)
            assert v["seconds"] < 60, (rank, at, v)


def test_an_overflowing_factor_on_one_rank_raises_on_every_rank(runs):
    if not has_codec("powersgd"):
        pytest.skip("powersgd is not built")
    for rank, r in enumerate(runs):
        v = r[f"overflowone:{POWERSGD}"]
        err = v["error"] or ""
        assert "NonFiniteError" in err, (rank, err)
        assert rank == 1 or "rank 1's gradient holds NaN or Inf" in err, err
        assert v["seconds"] < 60, (rank, v)


def test_warmup_without_an_epoch_is_refused(runs):
    for r in get(runs, f"warmup:{WARMUP}"):
        assert r["error"] and "ArgumentError" in r["error"], r["error"]
        assert "warm-up of 1 epochs" in r["error"] and "state.set_epoch(epoch)" in r["error"]
        assert r["identical"] and len(r["losses"]) == 3


def test_state_pickles_without_process_group():
    import gradcomp.torch as gt

    hook, state = gt.hook(TOPK)
    s2 = pickle.loads(pickle.dumps(state))
    assert s2.process_group is None and isinstance(s2.policy, gt.LayerPolicy)
    assert s2.policy.spec == gradcomp.canonical(TOPK)


def test_layer_policy():
    import gradcomp.torch as gt

    p = gt.LayerPolicy(TOPK, min_elements=100)
    # A floor of 512 values a step by default (min_k): all 100 here; min_k=0 takes it away.
    assert p("w", (10, 10)) == gradcomp.spec_set(TOPK, "min_k", "512")
    assert gt.LayerPolicy(TOPK, min_elements=100, min_k=0)("w", (10, 10)) == gradcomp.canonical(TOPK)
    assert gt.LayerPolicy("powersgd:rank=2", min_elements=100)("w", (10, 10)) == \
        gradcomp.canonical("powersgd:rank=2")  # no density=, no floor
    assert p("w", (9, 10)) is None
    assert p("b", (1000,)) is None
    assert gt.LayerPolicy(TOPK, min_elements=100, vectors=True)("b", (1000,))
    assert gt.LayerPolicy("none")("w", (100, 100)) is None  # plain fp32: an all_reduce
    with pytest.raises(gradcomp.SpecError):
        gt.LayerPolicy("topk:density=7")
    # A full C policy string, with a glob on the parameter key.
    q = gt.LayerPolicy("spec=topk:density=0.01;min_elements=10;fc*=topk:density=0.5")
    assert "density=0.5" in q("fc.weight", (10, 10)) and "density=0.01" in q("w", (10, 10))
    assert q.plan("w", (10, 10))["reason"] == "default"
    assert pickle.loads(pickle.dumps(q))("fc.weight", (10, 10)) == q("fc.weight", (10, 10))


def test_adaptive_method_agrees_across_ranks(runs):
    r0, r1 = get(runs, f"adaptive:{ADAPTIVE}")
    assert r0["identical"] and r1["identical"]
    # Due after steps 5, 10, ... 40; each taken as the next step begins: 7 in 40 steps.
    assert r0["decisions"] == r1["decisions"] == 7
    # Both ranks switched every parameter to the same spec at the same step, although their
    # timings and link measurements differed, and the controllers did switch.
    assert r0["history"] == r1["history"]
    assert len({tuple(h.values()) for h in r0["history"]}) > 1
    assert r0["loss"] < 1.3


def test_adaptive_hook_probes_the_link_itself(runs):
    r0, r1 = get(runs, f"probe:{PROBED}")
    assert r0["identical"] and r1["identical"]
    assert r0["decisions"] == r1["decisions"] == 7
    # Both ranks probed at the same decisions (a collective: one alone would hang), with
    # the default 512 KiB, and measured a link; the first decision probed.
    assert [p["step"] for p in r0["probes"]] == [p["step"] for p in r1["probes"]]
    assert r0["probes"] and r0["probes"][0]["step"] == 5
    assert all(p["nbytes"] == 512 << 10 for p in r0["probes"])
    for r in (r0, r1):
        for p in r["probes"]:
            bw, lat = p["link"]
            assert bw > 0 and math.isfinite(bw) and lat > 0, p
    # Every decision used a link (the median over ranks: the same on both), and the
    # probes' link, not nothing: without one the controller never leaves its base.
    used = [(d, bw, lat) for d, bw, lat in r0["links"] if d > 0]
    assert used and used == [(d, bw, lat) for d, bw, lat in r1["links"] if d > 0]
    assert all(bw > 0 for _, bw, _ in used)
    assert r0["history"] == r1["history"]


def test_adaptive_dense_joins_the_all_reduce(runs):
    r0, r1 = get(runs, f"switch:{SWITCH}")
    assert r0["identical"] and r1["identical"]
    sent = r0["sent"]
    dense_from = next(i for i, s in enumerate(sent) if all(x.startswith("none:") for x in s["specs"]))
    assert 0 < dense_from < len(sent) - 3
    # Top-k's messages until the switch; the step that switches (it decides as it
    # begins) sends one message more, the flush of what error feedback held back (the
    # gradient plus the carry, as a dense message) ...
    grew = [b["message"] > a["message"] for a, b in zip(sent, sent[1:])]  # step i + 1 sent
    assert sent[0]["message"] > 0 and all(grew[:dense_from])
    # ... and from the step after, no message at all: every parameter rides the fp32
    # all_reduce, as plain dense does (an all-gather of P messages and a decode of each
    # made the hook's dense 5x slower than its PowerSGD on two netsim hosts).
    assert not any(grew[dense_from:])
    assert all(b["dense"] - a["dense"] > 20000 for a, b in zip(sent[dense_from:], sent[dense_from + 1:]))
    assert r0["sent"] == r1["sent"]
    assert all(math.isfinite(v) for v in r0["losses"]) and r0["losses"][-1] < r0["losses"][0]
    # The loop gave its own compute (0.61 s a step): the hook did not mix its measure in.
    assert r0["compute_s"] == r1["compute_s"] and r0["compute_s"] > 0.5


def test_adaptive_dense_switch_is_the_same_on_every_rank(runs):
    # Rank 0's gradients are all zero: its compressors hold nothing back when they switch
    # to dense, rank 1's do.  Both still flush through the gather once and join the
    # all_reduce together (a path chosen by what a rank holds would send rank 0 into the
    # all_reduce while rank 1 all-gathers: gloo aborts, or the ranks add wrong buffers).
    r0, r1 = get(runs, f"switchquiet:{SWITCH}")
    assert r0["identical"] and r1["identical"]
    assert r0["sent"] == r1["sent"]
    sent = r0["sent"]
    dense_from = next(i for i, s in enumerate(sent) if all(x.startswith("none:") for x in s["specs"]))
    grew = [b["message"] > a["message"] for a, b in zip(sent, sent[1:])]
    assert 0 < dense_from < len(sent) - 3 and all(grew[:dense_from]) and not any(grew[dense_from:])


def test_adaptive_switch_to_a_dense_powersgd_sends_what_was_held_back(runs):
    # The retune used to be refused (nowhere to keep the residual); now the next dense step
    # carries it, and the hook reduces that instead of the bare gradient: over the run,
    # sum of mean gradients = what SGD applied + what is still held back.
    r0, r1 = get(runs, f"psgdflush:{PSGD_FLUSH}")
    assert r0["identical"] and r1["identical"] and r0["history"] == r1["history"]
    specs = [set(h) for h in r0["history"]]
    switched = next(i for i, h in enumerate(specs) if h == {"powersgd:rank=24"})
    assert specs[0] == {"powersgd:rank=2"} and 0 < switched < len(specs) - 2, r0["history"]
    assert r0["gap"] <= 1e-4 * r0["scale"], r0


def test_adaptive_resume(runs):
    # Saved at step 10 with every parameter switched to dense and a decision due: the
    # restored hook takes that decision, flushes what it restored once, and trains as the
    # run without the break did, to the bit.
    r0, r1 = get(runs, f"resumeadapt:{SWITCH}")
    assert r0 == r1 and r0["identical"] and r0["replicas_identical"] and r0["due"]
    assert r0["decisions"] == 3 and all(s.startswith("none:") for s in r0["specs_at_save"])


def test_adaptive_hook_measures_the_compute(runs):
    r0, r1 = get(runs, f"autocompute:{PROBED}")
    assert r0["identical"] and r1["identical"]
    assert r0["seen"] == r1["seen"] and len(r0["seen"]) == 7
    # Every decision saw a compute time (the slowest rank's), at least the 30 ms each step
    # slept before its forward pass.  The decisions at steps 15, 25 and 35 cover an
    # interval with a 1.5 s "evaluation" in it: left out, as an outlier; had it counted,
    # their mean would exceed 0.3 s.
    for d, step, c in r0["seen"]:
        assert c >= 0.03, (d, step, c)
    late = [c for d, step, c in r0["seen"] if step >= 15]
    assert late and all(c < 0.15 for c in late), r0["seen"]


def test_adaptive_hook_gives_ddp_buckets_as_exchange_groups(runs):
    r0, r1 = get(runs, f"groups:{PROBED}")
    assert r0["identical"] and r1["identical"]
    # Every step ends with the groups of the buckets DDP used, the same on both ranks (they
    # enter the fingerprint: a rank with others would have made the decisions fail); the
    # model is cut into several buckets, filled from the end, so each weight shares its
    # bias's.
    assert r0["groups"] == r1["groups"]
    last = r0["groups"][-1]
    assert len(last) == 6 and all(g > 0 for g in last) and len(set(last)) >= 2
    names = r0["names"]
    for w in ("0.weight", "2.weight", "4.weight"):
        assert last[names.index(w)] == last[names.index(w.replace("weight", "bias"))]
    assert r0["groups"][2:] == [last] * (len(r0["groups"]) - 2)  # settled after the rebuild
    assert r0["decisions"] == r1["decisions"] == 2
    # and the controllers hold them: their fingerprint is that of the method given them
    assert r0["fp"]["hook"] == r0["fp"]["given"] != r0["fp"]["none"]


@pytest.mark.parametrize("mode,method,two,where", [
    ("dead", "adapt:bandwidth;min_elements=16;interval=5;confirm=1", False, "link probe:"),  # the decision's probe
    ("stall", "topk:density=0.1,feedback=ef", True, "step 5, bucket 0:"),  # the gather path's lengths
    ("stall", "topk:density=0.1,feedback=ef", False, "step 5, bucket 0's exchange:"),  # in one exchange
    ("dead", "none", False, "step 5, bucket 0's exchange:"),  # the dense all_reduce, in its future
])
def test_a_dead_or_stalled_rank_is_named(tmp_path, mode, method, two, where):
    # Rank 1 exits, or sleeps past the 3 s process-group timeout, at step 5: rank 0 gets
    # gradcomp's error (through DDP, which re-raises it as RuntimeError with its text),
    # at once for a closed connection, after the timeout for a silent rank; never a hang.
    # The gather path exchanges its lengths first (blocking, in the hook) when told to
    # (--two-exchanges), else sends them with the messages (one exchange, in the future).
    out = str(tmp_path / "r")
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    p = subprocess.run([sys.executable, os.path.join(HERE, "ddp_peer_failure.py"), "--out", out,
                        "--mode", mode, "--method", method] + (["--two-exchanges"] if two else []),
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    with open(out + ".json") as f:
        r = json.load(f)
    want = "CommunicatorFailed" if mode == "dead" else "CollectiveTimeout"
    assert r["error"] and f"{want}: gradcomp.torch: {where}" in r["error"], r["error"]
    # gloo's own words stay in the message: its source location, or its pair closure
    assert re.search(r"\[[^\]\s]*gloo/|Application timeout caused pair closure", r["error"]), r["error"]
    if mode == "dead":
        assert r["seconds"] < 2.5, r
    else:
        assert 2.5 < r["seconds"] < 12, r


def test_gather_in_one_exchange_is_the_same_training(runs):
    for r in get(runs, f"exchanges:{TOPK}"):
        one, two = r["one"], r["two"]
        assert one["identical"] and two["identical"]
        # The same numbers to the bit, and the same messages ...
        assert one["losses"] == two["losses"] and one["params"] == two["params"]
        assert one["message"] == two["message"]
        # ... but from the second step on the messages went at their bound in one exchange
        # (padding to the bound, not to the longest rank's message).
        assert one["pad"] > two["pad"]


def test_gloo_errors_read_as_what_they_mean():
    import gradcomp.torch as gt

    wrap = "Got the following error when running the callback: RuntimeError: "
    cases = [
        ("[/src/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 3000ms for recv", gradcomp.CollectiveTimeout),
        ("Application timeout caused pair closure", gradcomp.CollectiveTimeout),
        ("[../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed by peer", gradcomp.CommunicatorFailed),
    ]
    for text, kind in cases:
        e = gt._gloo_failure(RuntimeError(wrap + text + "\n\nAt:\n  torch.py(1): done\n"), "step 3, bucket 1's exchange")
        assert type(e) is kind, (text, e)
        # where, then gloo's line from its source location on, without torch's wrapping
        assert str(e).startswith("gradcomp.torch: step 3, bucket 1's exchange: "), e
        assert str(e).endswith(": " + text[text.find("["):] if "[" in text else text), e
    assert gt._gloo_failure(RuntimeError("expected scalar type Float"), "x") is None


def test_hook_probe_bytes_checked():
    import gradcomp.torch as gt
    for bad in (1, 1023, (1 << 30) + 1, -5):
        with pytest.raises(ValueError, match="probe_bytes"):
            gt.hook("topk:density=0.01", probe_bytes=bad)
    with pytest.raises(ValueError, match="nbytes"):
        gt.link_probe(100)
    gt.hook("topk:density=0.01", probe_bytes=0)  # no probe: the caller feeds the link


def test_adaptive_candidates_priced_by_the_hooks_routes():
    # The controllers' cost model sees each candidate as the hook sends it: plain fp32 and
    # PowerSGD's factors by all_reduce, the rest gathered -- an fp16 dense spec included,
    # which the library's default strategy would price as an all-reduce.  Messages of a
    # fixed size go in one all_gather with their lengths in front (| 0x200, one exchange);
    # a threshold's, whose size depends on the data, after an exchange of the lengths.
    gt = pytest.importorskip("gradcomp.torch")
    route = {s: gt._hook_route_strategy(gradcomp.canonical(s))
             for s in ("none", "powersgd:rank=4", "none:values=f16", "int8", "topk:density=0.01",
                       "dgc:density=0.001,values=f16", "threshold:tau=0.01")}
    assert route == {"none": 3, "powersgd:rank=4": 3, "none:values=f16": 0x201, "int8": 0x201,
                     "topk:density=0.01": 0x201, "dgc:density=0.001,values=f16": 0x201,
                     "threshold:tau=0.01": 1}


def test_adaptive_method_needs_the_model():
    import gradcomp.torch as gt
    with pytest.raises(gradcomp.ArgumentError, match="needs the model"):
        gt.hook("adapt:norm")


def test_adaptive_policy_refuses_a_ladder_across_the_momentum():
    # DGC keeps the momentum, top-k leaves it to the optimizer: the hook cannot move it
    from gradcomp.torch import AdaptivePolicy
    pol = AdaptivePolicy("adapt:norm;base=dgc:density=0.05;ladder=topk:density=0.5,feedback=ef/dgc:density=0.05",
                         min_elements=16)
    with pytest.raises(gradcomp.UnsupportedError, match="DistributedOptimizer"):
        pol.start([("w", (16, 8))], 2)
    assert pol.adapt is None
    # one side only is fine
    AdaptivePolicy("adapt:norm;base=dgc:density=0.05;ladder=dgc:density=0.5/dgc:density=0.05",
                   min_elements=16).start([("w", (16, 8))], 2)


def test_adaptive_hook_leaves_frozen_parameters_out():
    # DDP never buckets a parameter that needs no gradient: the controllers must not manage
    # it, or their measurements would wait for it forever (and report what was never measured)
    torch = pytest.importorskip("torch")
    import gradcomp.torch as gt
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 32))
    model[0].weight.requires_grad_(False)
    _, state = gt.hook("adapt:norm;base=topk:density=0.05,feedback=ef", model=model, total_steps=10)
    pol = state.policy
    assert pol.index("0.weight") is None
    assert pol.index("1.weight") is not None and pol.index("0.bias") is not None
    # and the hook's bandwidth defaults see a controller name written with spaces
    assert gt._with_hook_defaults("adapt: layers + bandwidth") == \
        "adapt: layers + bandwidth;overlap=0.5;concurrent=0"


def test_hook_state_keeps_ddp_buckets_across_a_restore():
    # The controllers price DDP's buckets (set_exchanges at the end of a step); a state
    # restored with a decision due takes it at the first step's first bucket, before that
    # step's layout is known: the restored controllers must have the buckets already (they
    # enter the configuration fingerprint, the first two numbers of the statistics).
    torch = pytest.importorskip("torch")
    import gradcomp.torch as gt
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 32))
    _, state = gt.hook("adapt:bandwidth;interval=2", model=model, total_steps=100)
    ad = state.policy.adapt
    groups = [1, 1, 2, 2]
    ad.set_exchanges(groups)
    state._layout = state._groups = groups
    back = pickle.loads(pickle.dumps(state))
    assert back._groups == groups
    assert list(back.policy.adapt.stats()[1:3]) == list(ad.stats()[1:3])


def test_adaptive_policy_pickles_its_controllers():
    import numpy as np
    from gradcomp.torch import AdaptivePolicy
    pol = AdaptivePolicy("adapt:norm;base=topk:density=0.05,feedback=ef;interval=2",
                         min_elements=16, total_steps=100)
    pol.start([("w", (16, 8)), ("b", (16,))], 2)
    rng = np.random.default_rng(5)
    for _ in range(5):
        pol.adapt.observe(0, rng.standard_normal((16, 8)).astype(np.float32))
        if pol.adapt.end_step():
            pol.adapt.decide(pol.adapt.stats()[None, :])
    back = pickle.loads(pickle.dumps(pol))
    assert back.adapt.save_state() == pol.adapt.save_state()
    assert back.adapt.report["decisions"] == 2


# ---- gradcomp.torch.tensor_list: the model as `gradcomp plan --model FILE` reads it -------------

def _plan_cli():
    cli = os.environ.get("GRADCOMP_CLI")
    if cli and os.path.exists(cli):
        return cli
    cand = os.path.join(os.path.dirname(os.path.abspath(gradcomp.LIBRARY_PATH)), "gradcomp")
    return cand if os.path.isfile(cand) and os.access(cand, os.X_OK) else None


def test_tensor_list_shapes_and_macs(tmp_path):
    import torch
    import gradcomp.torch as gt

    torch.manual_seed(0)
    shared = torch.nn.Linear(10, 10)
    m = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU(),
                            torch.nn.Conv2d(4, 4, 3, padding=1, groups=2, bias=False),
                            torch.nn.BatchNorm2d(4), torch.nn.Flatten(), torch.nn.Linear(256, 10),
                            shared, shared)
    m[3].weight.requires_grad_(False)  # frozen: not sent, not listed
    assert gt.tensor_list(m).splitlines() == [
        "0.weight 4 1 3 3", "0.bias 4", "2.weight 4 2 3 3", "3.bias 4", "5.weight 10 256",
        "5.bias 10", "6.weight 10 10", "6.bias 10"]
    lines = gt.tensor_list(m, torch.zeros(3, 1, 8, 8)).splitlines()
    # conv: 4 x 8 x 8 outputs a sample x (in / groups) x 3 x 3; the shared Linear runs twice
    assert lines == [
        "0.weight 4 1 3 3 macs=2304", "0.bias 4 macs=256", "2.weight 4 2 3 3 macs=4608",
        "3.bias 4 macs=256", "5.weight 10 256 macs=2560", "5.bias 10 macs=10",
        "6.weight 10 10 macs=200", "6.bias 10 macs=20"], lines
    with pytest.raises(ValueError, match="batched tensor"):
        gt.tensor_list(m, (3,))
    path = tmp_path / "m.txt"
    gt.write_tensor_list(m, str(path), torch.zeros(3, 1, 8, 8))
    cli = _plan_cli()
    if not cli:
        pytest.skip("no gradcomp CLI next to the library (set GRADCOMP_CLI)")
    out = subprocess.run([cli, "plan", "--model", str(path), "--compare", "dense", "--workers", "2",
                          "--link", "1gbit", "--compute-ms", "3", "--json"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    tensors = json.loads(out.stdout)["results"][0]["tensors"]
    assert [t["n"] for t in tensors] == [36, 4, 72, 4, 2560, 10, 100, 10]
    # the last layer (no work after the loss) is final first; the first conv last
    assert tensors[-1]["ready_s"] < tensors[4]["ready_s"] < tensors[0]["ready_s"]


def test_hook_bandwidth_defaults():
    # The hook's collectives progress on gloo's threads during the backward pass, one
    # bucket's after another: its bandwidth controller prices that (overlap 0.5,
    # concurrent 0) unless the method says otherwise.
    gt = pytest.importorskip("gradcomp.torch")
    w = gt._with_hook_defaults
    assert w("adapt:bandwidth") == "adapt:bandwidth;overlap=0.5;concurrent=0"
    assert w("adapt:layers+bandwidth;base=topk:density=0.01") == \
        "adapt:layers+bandwidth;base=topk:density=0.01;overlap=0.5;concurrent=0"
    assert w("adapt:bandwidth;overlap=0") == "adapt:bandwidth;overlap=0;concurrent=0"
    assert w("adapt:bandwidth;concurrent=1") == "adapt:bandwidth;concurrent=1;overlap=0.5"
    assert w("adapt:norm;interval=4") == "adapt:norm;interval=4"
    # a refusal quotes the method as the user wrote it, not with what the hook adds
    pol = gt.AdaptivePolicy("adapt:bandwidth;etaa=1")
    with pytest.raises(gradcomp.SpecError) as e:
        pol.start([("w", (64, 64))], 2)
    assert "'adapt:bandwidth;etaa=1'" in str(e.value)
    assert ";overlap=0.5" not in str(e.value) and ";concurrent=0" not in str(e.value)
    # the controller takes 0 or 1 only
    with pytest.raises(gradcomp.SpecError) as e:
        gradcomp.Adapt("adapt:bandwidth;concurrent=2", [("w", (64, 64))], workers=2)
    assert "concurrent=2" in str(e.value)
