"""gradcomp.Adapt and Compressor.retune from Python: the method grammar's errors, the
switch that keeps what a compressor holds back, and decisions that agree across ranks fed
different local observations (simulated here by several controllers, one per "rank")."""

import re

import numpy as np
import pytest

import gradcomp

TENSORS = [("fc1.weight", (128, 96)), ("fc1.bias", (128,)), ("fc2.weight", (64, 128))]


def make(method, **kw):
    kw.setdefault("min_elements", 1000)
    return gradcomp.Adapt(method, TENSORS, **kw)


@pytest.mark.parametrize("method,needle", [
    ("adapt:nrom", "unknown controller 'nrom'"),
    ("adapt:norm;etta=1", "unknown key 'etta'"),
    ("adapt:norm;target=0.9", "belongs to the accuracy controller"),
    ("adapt:accuracy;target=140", "out of range"),
    ("adapt:accuracy;target=ref-x", "expected ref-X"),
    ("adapt:layers;ladder=", "ladder is empty"),
    ("adapt:bandwidth,layers", "join controllers with '+'"),
])
def test_bad_methods_name_the_culprit(method, needle):
    with pytest.raises(gradcomp.SpecError, match=re.escape(needle)):
        make(method)


def test_a_nul_in_the_method_is_refused_not_cut_short():
    # C would read "adapt:norm" and accept it, without the refused eta=-1 after the NUL
    with pytest.raises(gradcomp.SpecError, match="NUL"):
        make("adapt:norm\x00;eta=-1")
    with pytest.raises(TypeError):
        make(5)


def test_counts_out_of_range_are_refused_not_wrapped():
    for kw in ({"total_steps": -1}, {"workers": -1}, {"nodes": 2 ** 40}, {"min_elements": -5}):
        with pytest.raises(ValueError, match="out of range"):
            make("adapt:norm", **kw)
    with pytest.raises(TypeError):
        make("adapt:norm", total_steps=1.7)


def test_tensor_names_must_be_unique():
    with pytest.raises(ValueError, match="two tensors are named 'w'"):
        gradcomp.Adapt("adapt:norm;min_elements=64", [("w", (64, 64)), ("v", (8,)), ("w", (64, 64))])


def test_metric_must_be_a_fraction():
    a = make("adapt:accuracy;target=0.8;interval=2", total_steps=100)
    for bad in (50, -0.1, float("nan")):
        with pytest.raises(ValueError, match="fraction"):
            a.observe_metric(bad)
    a.observe_metric(0.5)
    a.close()


def test_accuracy_needs_the_run_length():
    with pytest.raises(gradcomp.ArgumentError, match="run's length"):
        make("adapt:accuracy;target=0.8")


def test_retune_keeps_what_is_held_back():
    rng = np.random.default_rng(1)
    c = gradcomp.Compressor("topk:density=0.01,feedback=ef", 4096)
    sent = np.zeros(4096)
    total = np.zeros(4096)
    for spec in ["topk:density=0.01,feedback=ef", "topk:density=0.001,feedback=ef", "none",
                 "int8:feedback=ef", "topk:density=0.05,feedback=ef"]:
        c.retune(spec)
        assert c.spec.startswith(spec.split(":")[0])
        for _ in range(5):
            g = rng.standard_normal(4096).astype(np.float32)
            total += g
            out = np.zeros(4096, np.float32)
            gradcomp.decode_add(c.encode(g), out)
            sent += out
        held = c.residual if c.residual is not None else 0
        np.testing.assert_allclose(sent + held, total, atol=1e-3)
    with pytest.raises(gradcomp.SpecError):
        c.retune("topk:densty=1")
    assert "density=0.05" in c.spec


def test_ranks_with_different_observations_decide_alike():
    method = "adapt:bandwidth+layers+norm;interval=3;measure=3;confirm=1"
    ranks = [make(method, workers=3) for _ in range(3)]
    rng = np.random.default_rng(7)
    changed_any = False
    for decision in range(4):
        for step in range(3):
            for r, a in enumerate(ranks):
                for i, (_, shape) in enumerate(TENSORS):
                    a.observe(i, (rng.standard_normal(shape) * (r + 1)).astype(np.float32))
                a.observe_compute(0.001 * (r + 1), 0.003, 1e-4)
                a.observe_link(1e7 * (r + 1) * (decision + 1), 1e-5)
                a.end_step()
        every = np.stack([a.stats() for a in ranks])
        results = [a.decide(every) for a in ranks]
        assert results[0] == results[1] == results[2]
        changed_any |= bool(results[0])
        for i in range(len(TENSORS)):
            assert ranks[0].spec(i) == ranks[1].spec(i) == ranks[2].spec(i)
        # every candidate's predicted step, and the measurement schedule, agree too
        pred = [a.predicted() for a in ranks]
        assert pred[0] == pred[1] == pred[2] and all(p > 0 for p in pred[0])
        assert len({a.report["next_measure_step"] for a in ranks}) == 1
    assert changed_any
    other = make("adapt:bandwidth+layers+norm;interval=3;measure=6;confirm=1", workers=3)
    for _ in range(3):
        other.end_step()
    with pytest.raises(gradcomp.MismatchError):
        ranks[0].decide(np.stack([ranks[0].stats(), other.stats()]))


def test_a_learning_rate_decay_is_critical_on_every_rank():
    """Accordion's rule at a decay: the interval after the rate falls by lr_drop (0.8) or
    more is critical whatever the norms say.  Only rank 0 reports the rate (the least over the
    ranks that do counts), and both ranks take the same decision."""
    ranks = [make("adapt:norm;interval=4", workers=2) for _ in range(2)]
    rng = np.random.default_rng(3)

    def run(steps, lr):
        for _ in range(steps):
            for a in ranks:
                for i, (_, shape) in enumerate(TENSORS):
                    if a.managed(i):
                        g = 0.1 * (1 + 0.1 * rng.standard_normal(shape))  # steady norms
                        a.observe(i, g.astype(np.float32))
            ranks[0].observe_lr(lr)
            if [a.end_step() for a in ranks][0]:
                every = np.stack([a.stats() for a in ranks])
                for a in ranks:
                    a.decide(every)
        crit = [a.report["critical"] for a in ranks]
        assert crit[0] == crit[1] and [a.level(0) for a in ranks][0] == ranks[1].level(0)
        return crit[0]

    assert run(12, 0.1) == 0     # steady norms: out of the critical regime
    assert run(4, 0.05) == 0     # halved: not a decay at the default lr_drop=0.8
    assert run(4, 0.005) == 2    # /10: both managed tensors critical for one interval
    assert run(4, 0.005) == 0


def test_accuracy_course_from_a_reference_curve():
    # A reference that rises slowly and jumps at the end (a cosine rate's shape); a run 0.3 pp
    # below it all along is on its course and keeps its setting.
    progress = np.arange(1, 11) / 10
    ref = 0.80 + 0.08 * progress ** 3
    steered = make("adapt:accuracy;target=0.877;interval=10;dwell=1", total_steps=100)
    steered.set_course(progress, ref)
    start = steered.level(0)
    for acc in ref - 0.003:
        for _ in range(10):
            steered.end_step()
        steered.observe_metric(acc)
        steered.decide(steered.stats()[None, :])
    assert steered.level(0) == start
    with pytest.raises(gradcomp.ArgumentError, match="fraction"):
        steered.set_course(progress, 100 * ref)
    with pytest.raises(gradcomp.ArgumentError, match="increase strictly"):
        steered.set_course(progress[::-1], ref)
    with pytest.raises(ValueError, match="3 progress values for 10"):
        steered.set_course(progress[:3], ref)
    with pytest.raises(gradcomp.ArgumentError, match="no accuracy controller"):
        make("adapt:layers").set_course(progress, ref)


def test_exchange_groups_are_part_of_the_configuration():
    # Two "ranks", one told the transport's groups and one not: the decision fails on both
    # instead of pricing the candidates differently; told the same, they decide.
    a, b = make("adapt:bandwidth;interval=1"), make("adapt:bandwidth;interval=1")
    a.set_exchanges([1, 1, 2])
    for x in (a, b):
        x.end_step()
    every = np.stack([a.stats(), b.stats()])
    for x in (a, b):
        with pytest.raises(gradcomp.MismatchError):
            x.decide(every)
    b.set_exchanges([1, 1, 2])
    for x in (a, b):
        x.end_step()
    every = np.stack([a.stats(), b.stats()])
    for x in (a, b):
        x.decide(every)
    with pytest.raises(gradcomp.ArgumentError, match="2 groups for 3 tensors"):
        a.set_exchanges([1, 1])
    with pytest.raises(ValueError, match="2\\*\\*32"):
        a.set_exchanges([1, -1, 1])
    with pytest.raises(TypeError):
        a.set_exchanges([1, 1.5, 1])
    with pytest.raises(ValueError, match="run_bytes"):
        a.set_exchanges([1, 1, 2], run_bytes=-1)
    a.set_exchanges([1, 1, 2], run_bytes=None)  # runs without a cap (gcomp_mpi's bucket_bytes 0)
    a.set_exchanges(None)


def test_controllers_state_round_trip_and_refusals():
    a = make("adapt:norm;interval=2", total_steps=100)
    rng = np.random.default_rng(3)
    for _ in range(5):
        for i, (_, shape) in enumerate(TENSORS):
            a.observe(i, rng.standard_normal(shape).astype(np.float32))
        if a.end_step():
            a.decide(a.stats()[None, :])
    blob = a.save_state()
    b = make("adapt:norm;interval=2", total_steps=100)
    b.load_state(blob)
    assert b.save_state() == blob and b.report["decisions"] == 2
    bad = bytearray(blob)
    bad[len(bad) // 2] ^= 1
    with pytest.raises(gradcomp.Error, match="checksum"):
        b.load_state(bytes(bad))
    with pytest.raises(gradcomp.MismatchError, match="another adaptive configuration"):
        make("adapt:norm;interval=3", total_steps=100).load_state(blob)
    with pytest.raises(gradcomp.Error, match="shorter"):
        b.load_state(blob[:10])


def test_step_filter_leaves_out_interruptions_not_a_new_pace():
    from gradcomp.adapt import _StepFilter

    f = _StepFilter(keep=16, factor=4.0, settle=8)
    assert not f.accept(0.0) and not f.accept(float("nan"))
    assert all(f.accept(0.1) for _ in range(10))
    # An evaluation (1.5 s) between two steps: left out, and the pace goes on.
    assert not f.accept(1.5) and f.accept(0.11)
    # A lasting change (a step now takes 0.6 s): left out 7 times, then taken as the pace.
    got = [f.accept(0.6) for _ in range(10)]
    assert got == [False] * 7 + [True] * 3, got
    # ... and judged against the new pace from then on: 0.1 s is fine, 3 s is out.
    assert f.accept(0.1) and not f.accept(3.0)


def test_retune_into_a_powersgd_that_sends_dense_carries_what_was_held_back():
    # 48 x 40 at rank 12: low rank does not pay, every step is dense.  What rank 2 held back
    # goes out with that next dense step, handed back by lowrank_begin as g + held (it was
    # refused before: the accuracy loop stopped on its way back to a heavy rank).
    rows, cols = 48, 40
    rng = np.random.default_rng(4)
    c = gradcomp.Compressor("powersgd:rank=2", rows * cols, (rows, cols))
    out = np.zeros(rows * cols, np.float32)
    for _ in range(3):  # one rank: the sums are the buffers themselves
        g = rng.standard_normal(rows * cols).astype(np.float32)
        p, rounds = c.lowrank_begin(g)
        assert rounds == 1 and p is not None
        c.lowrank_after_p()
        c.lowrank_finish(out, 1.0)
    held = c.residual.copy()
    assert np.abs(held).max() > 0
    c.retune("powersgd:rank=12")
    g = rng.standard_normal(rows * cols).astype(np.float32)
    p, rounds = c.lowrank_begin(g)
    assert rounds == 0 and p is not None
    np.testing.assert_array_equal(p, g + held)
    c.lowrank_finish(None)
    p, rounds = c.lowrank_begin(g)
    assert rounds == 0 and p is None  # sent: the next dense step is the gradient alone
    c.lowrank_finish(None)
