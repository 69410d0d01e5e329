"""gradcomp.mpi against the C library, under mpirun (2 and 4 ranks).

The central test runs every strategy x codec family through the binding and checks, at
every step, what allreduce-bench checks in C (tools/mpi/cmd_allreduce_bench.c), plus the
link to the core API in this same process:
  * each rank's message for a tensor is byte-identical to what a core Compressor made from
    the bucket's worker spec encodes from the same gradients (the bucket compressed exactly
    what the C API compresses);
  * the result equals the float64 sum, in rank order, of every rank's decoded messages
    (allgather, allreduce); for the owner strategies (sparse, rsag) result + the owner's
    residual change equals it (nothing lost); PowerSGD: the sum of g + E_before - E_after;
    hierarchical with one node: the exact sum of the inputs;
  * the replicas are bit-identical after every step.
"""

import numpy as np
import pytest

import gradcomp
import gradcomp.mpi as gm
from conftest import TIMEOUT, c_layout, check_layout, digest  # noqa: E402
from mpi4py import MPI

torch = pytest.importorskip("torch")

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.rank, WORLD.size
SHAPE = (64, 48)
N = SHAPE[0] * SHAPE[1]
BIAS = 300

# (spec, tolerance relative to max |sum|): f16 sums round at every addition.
SPECS = [
    ("none", 1e-6),
    ("none:values=f16", 4e-3),
    ("randomk:density=0.1", 1e-6),
    ("topk:density=0.05,feedback=ef", 1e-6),
    ("topk:density=0.05,values=f16,feedback=ef", 1e-6),
    ("dgc:density=0.05", 1e-6),
    ("int8:feedback=ef", 1e-6),
    ("twobit:threshold=0.5", 1e-6),
    ("sign:feedback=ef", 1e-6),
    ("qsgd:levels=16", 1e-6),
    ("powersgd:rank=2", 1e-5),
]
STRATEGIES = ["auto", "allgather", "sparse", "allreduce", "rsag", "hierarchical", "hierarchical:rsag"]


@pytest.fixture(scope="module")
def comms():
    flat = gm.Communicator(WORLD, timeout=TIMEOUT)
    nodes = gm.Communicator(WORLD, timeout=TIMEOUT, ranks_per_node=2)
    yield flat, nodes
    flat.close()
    nodes.close()


def grad(step, n, salt=0):
    rng = np.random.default_rng(7919 * step + 104729 * RANK + salt)
    return rng.standard_normal(n).astype(np.float32)


def gather(obj):
    return gm.allgather_object(obj, WORLD, TIMEOUT)


def decoded_sum(all_msgs, n):
    """Every rank's messages decoded in rank order and summed in float64."""
    ref = np.zeros(n, np.float64)
    for msgs in all_msgs:
        for blob, off, cnt in msgs:
            tmp = np.zeros(cnt, np.float32)
            gradcomp.decode_add(blob, tmp, 1.0)
            ref[off:off + cnt] += tmp
    return ref


def lowrank_residual(b, i, n):
    c = b.compressor(i)
    if c is None:
        return np.zeros(n, np.float32)
    r = c.residual
    return np.zeros(n, np.float32) if r is None else r


def run_case(comm, spec, tol, strategy, steps=3):
    """Returns None when the combination is refused (UnsupportedError), else a summary."""
    try:
        b = comm.bucket([gm.Tensor("w", spec, SHAPE, strategy), gm.Tensor("b", "none", BIAS)], timeout=TIMEOUT)
    except gradcomp.UnsupportedError as e:
        return ("unsupported", str(e)[:80])
    with b:
        strat = b.strategy(0)
        base = strat.split(":")[-1]
        lowrank = "multiphase" in gradcomp.codec_info(spec.split(":")[0])["properties"]
        ws = b.worker_spec(0)
        twin = gradcomp.Compressor(ws, N, SHAPE) if ws and not lowrank and base in ("allgather", "sparse",
                                                                                        "allreduce") \
            and not strat.startswith("hierarchical") else None
        worst, checked = 0.0, True
        for step in range(steps):
            g = grad(step, N)
            bias = grad(step, BIAS, salt=1)
            x = torch.from_numpy(g.copy()).reshape(SHAPE) if step % 2 else g.copy()
            y = bias.copy()
            r0 = b.owner_residual(0)
            e0 = lowrank_residual(b, 0, N) if lowrank else None
            ptr = x.data_ptr() if step % 2 else x.ctypes.data
            if step == 1:
                b.start([x, y], op="sum")
                while not b.test():
                    pass
            elif step == 2:
                b.start([x, y], op="sum")
                b.wait()
            else:
                b.allreduce([x, y], op="sum")
            res = (x.numpy() if step % 2 else x).reshape(-1).astype(np.float64)
            assert (x.data_ptr() if step % 2 else x.ctypes.data) == ptr  # in place, no copy
            msgs = b.messages(0)
            if twin is not None:
                assert len(msgs) == 1, msgs
                assert msgs[0][0] == twin.encode(g), f"step {step}: the bucket's message is not the C API's"
            all_msgs = gather(msgs)
            # the dense tensor beside it: exact f32 sum of the inputs
            ref_b = np.sum(np.stack(gather(bias)).astype(np.float64), axis=0)
            assert np.max(np.abs(y - ref_b)) <= 1e-5 * (1 + np.max(np.abs(ref_b)))
            if lowrank:
                e1 = lowrank_residual(b, 0, N)
                ref = np.sum(np.stack(gather(g.astype(np.float64) + e0 - e1)), axis=0)
            elif not any(all_msgs):
                # hierarchical with one node: the leader's dense sum is exact
                assert strat.startswith("hierarchical") and comm.nodes == 1, strat
                ref = np.sum(np.stack(gather(g.astype(np.float64))), axis=0)
            elif base in ("sparse", "rsag"):
                # Owners re-compress their region of the sum: result + the owner's residual
                # change = the exact sum of what the workers sent, region by region; each
                # owner checks its own (ranks that own nothing, e.g. non-leaders under
                # hierarchical, hold replicas of the owners' results: the hash below).
                ref = decoded_sum(all_msgs, N)
                owner = b.owner_spec(0)
                r1 = b.owner_residual(0)
                owned = np.zeros(N, bool)
                if owner is not None and ",feedback=ef," not in owner + ",":
                    # No residual that conserves the sum: the dgc codec's owners apply its
                    # momentum correction again, non-contractions' owners keep no feedback.
                    checked = False
                elif r1 is not None:
                    res1, off = r1
                    before = r0[0] if r0 is not None and r0[1] == off and len(r0[0]) == len(res1) else 0.0
                    res = res.copy()
                    res[off:off + len(res1)] += res1.astype(np.float64) - before
                    owned[off:off + len(res1)] = True
                res = np.where(owned, res, ref)
            else:
                ref = decoded_sum(all_msgs, N)
            scale = 1.0 + np.max(np.abs(ref))
            err = float(np.max(np.abs(res - ref))) / scale
            worst = max(worst, err)
            assert err <= tol, f"step {step}: max |result - reference| / max|sum| = {err:.3g} > {tol}"
            hashes = gather(digest(x.numpy() if step % 2 else x, y))
            assert len(set(hashes)) == 1, f"step {step}: replicas differ"
        return (strat, worst if checked else "replicas only")


@pytest.mark.parametrize("spec,tol", SPECS, ids=[s for s, _ in SPECS])
def test_every_strategy_matches_the_c_reference(comms, spec, tol):
    flat, nodes = comms
    if gradcomp.codec_info(spec.split(":")[0]) is None:
        pytest.skip(f"NOT LANDED: codec {spec.split(':')[0]}")
    ran = {}
    for strategy in STRATEGIES:
        comm = nodes if strategy.startswith("hierarchical") else flat
        ran[strategy] = run_case(comm, spec, tol, strategy)
    # auto always works, and so does allgather for every codec that sends messages
    assert ran["auto"][0] != "unsupported", ran
    worked = [s for s, v in ran.items() if v[0] != "unsupported"]
    assert len(worked) >= 3, ran
    # every rank agrees on what ran and how
    plans = gather(sorted((s, v[0]) for s, v in ran.items()))
    assert all(p == plans[0] for p in plans), plans


def test_average_is_sum_over_ranks(comms):
    flat, _ = comms
    with flat.bucket([("w", "none", N)]) as b:
        g = grad(0, N)
        s, a = g.copy(), g.copy()
        b.allreduce([s], op="sum")
        b.allreduce([a], op="average")
        assert np.allclose(a, s / SIZE, rtol=1e-6, atol=1e-7)


def test_stats_and_strategy_names(comms):
    flat, _ = comms
    with flat.bucket([("w", "topk:density=0.01", N), ("b", "none", BIAS)]) as b:
        assert [b.strategy(0), b.strategy(1)] == ["allgather", "allreduce"]
        assert gm.strategy_auto("int8", SIZE) == "rsag"
        assert gm.strategy_name(gm.strategy_value("hierarchical:rsag")) == "hierarchical:rsag"
        with pytest.raises(gradcomp.ArgumentError):
            gm.strategy_value("ring")
        for _ in range(2):
            b.allreduce([grad(0, N), grad(0, BIAS)])
        s = b.stats()
        assert s["calls"] == 2 and s["bytes_sent"] > 0 and s["bytes_received"] > 0
        # per tensor: its messages; the bucket also counts the size exchange
        assert 0 < b.stats(0)["bytes_sent"] + b.stats(1)["bytes_sent"] <= s["bytes_sent"]
        b.reset_stats()
        assert b.stats()["calls"] == 0


def test_state_round_trip_continues_bit_for_bit(comms):
    flat, _ = comms
    spec = "topk:density=0.02,feedback=ef"
    a = flat.bucket([("w", spec, SHAPE), ("v", "dgc:density=0.05", 500)])
    for step in range(3):
        a.allreduce([grad(step, N), grad(step, 500, 1)])
    blob = a.state_bytes()
    assert len(blob) > 4 * (N + 500)  # the residuals are in it
    b = flat.bucket([("w", spec, SHAPE), ("v", "dgc:density=0.05", 500)])
    b.load_state(blob)
    for step in range(3, 6):
        xa, ya, xb, yb = grad(step, N), grad(step, 500, 1), grad(step, N), grad(step, 500, 1)
        a.allreduce([xa, ya])
        b.allreduce([xb, yb])
        assert digest(xa, ya) == digest(xb, yb), f"step {step}: the loaded bucket diverged"
    # a corrupt blob is refused and changes nothing
    bad = bytearray(blob)
    bad[len(bad) // 2] ^= 1
    with pytest.raises(gradcomp.CorruptMessage):
        b.load_state(bytes(bad))
    with pytest.raises(gradcomp.MismatchError):  # another bucket's state
        with flat.bucket([("x", spec, SHAPE), ("v", "dgc:density=0.05", 500)]) as c:
            c.load_state(blob)
    a.close()
    b.close()


def test_spec_mismatch_raises_on_every_rank(comms):
    flat, _ = comms
    spec = "topk:density=0.5" if RANK == SIZE - 1 else "topk:density=0.05"
    with pytest.raises(gradcomp.MismatchError) as e:
        flat.bucket([("fc1.weight", "none", 100), ("fc2.weight", spec, SHAPE)])
    assert "fc2.weight" in str(e.value)
    assert not flat.failed  # a mismatch leaves the communicator usable
    shape = (N,) if RANK == 0 else (N + 1,)
    with pytest.raises(gradcomp.MismatchError):
        flat.bucket([("w", "none", shape)])


def test_bad_spec_on_one_rank_fails_every_rank(comms):
    flat, _ = comms
    spec = "topk:densty=0.1" if RANK == 0 else "topk:density=0.1"
    with pytest.raises((gradcomp.SpecError, gradcomp.MismatchError)) as e:
        flat.bucket([("w", spec, N)])
    assert isinstance(e.value, gradcomp.SpecError) == (RANK == 0)


def test_nonfinite_gradient_raises_on_every_rank(comms):
    flat, _ = comms
    for spec in ("topk:density=0.1,feedback=ef", "none"):
        with flat.bucket([("w", spec, N)]) as b:
            g = grad(0, N)
            if RANK == SIZE - 1:
                g[17] = np.nan
            with pytest.raises(gradcomp.NonFiniteError):
                b.allreduce([g])
            b.allreduce([grad(1, N)])  # the communicator is still usable
    assert not flat.failed


def test_wait_all_is_the_waits_one_by_one(comms):
    """gm.wait_all moves every bucket at once; the bits are those of waiting in turn, an
    error is reported for its own bucket, and the other buckets are still waited for."""
    flat, _ = comms
    specs = [("p", "powersgd:rank=2", SHAPE), ("t", "topk:density=0.05,feedback=ef", N)]
    twins = [flat.bucket(specs) for _ in range(2)]
    idle = flat.bucket([("i", "none", BIAS)])
    try:
        for step in range(3):
            xs = [[grad(step, N), grad(step, N, 1)] for _ in twins]
            for b, x in zip(twins, xs):
                b.start(x, op="sum")
            twins[0].wait()
            assert gm.wait_all([idle, twins[1]]) == [None, None]
            assert not twins[1].in_flight
            assert digest(*xs[0]) == digest(*xs[1]), f"step {step}"
        x, y = [grad(5, N), grad(5, N, 1)], [grad(6, N), grad(6, N, 1)]
        if RANK == SIZE - 1:
            y[1][7] = np.nan
        twins[0].start(x)
        twins[1].start(y)
        errors = gm.wait_all(twins)
        assert errors[0] is None and isinstance(errors[1], gradcomp.NonFiniteError)
        # both are idle again: a bucket left in flight would refuse the next start
        for b in twins:
            b.start([grad(7, N), grad(7, N, 1)])
        assert gm.wait_all(twins) == [None, None]
        assert gm.wait_all([]) == []
        assert not flat.failed
    finally:
        for b in twins + [idle]:
            b.close()


def test_argument_errors_are_local(comms):
    flat, _ = comms
    with flat.bucket([("w", "none", N)]) as b:
        with pytest.raises(ValueError):
            b.allreduce([np.zeros(N + 1, np.float32)])
        with pytest.raises(TypeError):
            b.allreduce([np.zeros(N, np.float64)])
        with pytest.raises(ValueError):
            b.allreduce([np.zeros((N, 2), np.float32)[:, 0]])  # not contiguous
        with pytest.raises(ValueError):
            b.allreduce([])
        with pytest.raises(gradcomp.ProtocolError):
            x = grad(0, N)
            b.start([x])
            try:
                b.start([x])
            finally:
                b.wait()
    with pytest.raises(gradcomp.UnsupportedError):
        flat.bucket([("w", "topk:density=0.1", N, "allreduce")])


def test_bounded_helpers():
    assert gm.allgather_object(RANK * 10) == [r * 10 for r in range(SIZE)]
    assert gm.all_agree("same")
    assert not gm.all_agree(f"rank {RANK}") or SIZE == 1


def test_struct_layout_matches_header():
    lines = c_layout(r"""
  S(gcomp_mpi_options); F(gcomp_mpi_options, timeout_s); F(gcomp_mpi_options, ranks_per_node);
  S(gcomp_mpi_tensor); F(gcomp_mpi_tensor, spec); F(gcomp_mpi_tensor, n); F(gcomp_mpi_tensor, rows);
  F(gcomp_mpi_tensor, cols); F(gcomp_mpi_tensor, strategy);
  S(gcomp_mpi_bucket_options); F(gcomp_mpi_bucket_options, bucket_bytes);
  S(gcomp_mpi_stats); F(gcomp_mpi_stats, bytes_sent); F(gcomp_mpi_stats, node_bytes);
  F(gcomp_mpi_stats, elapsed_ns); F(gcomp_mpi_stats, overlap_ns);
  S(MPI_Comm);
  printf("E %d %d %d %d %d %d %d %d\n", GCOMP_MPI_AUTO, GCOMP_MPI_ALLGATHER, GCOMP_MPI_SPARSE,
         GCOMP_MPI_ALLREDUCE, GCOMP_MPI_RSAG, GCOMP_MPI_HIERARCHICAL, GCOMP_MPI_SUM, GCOMP_MPI_AVERAGE);
""")
    types = {"gcomp_mpi_options": gm.Options, "gcomp_mpi_tensor": gm.TensorDesc,
             "gcomp_mpi_bucket_options": gm.BucketOptions, "gcomp_mpi_stats": gm.Stats, "MPI_Comm": gm._COMM_T}
    check_layout(lines, types, [gm.AUTO, gm.ALLGATHER, gm.SPARSE, gm.ALLREDUCE, gm.RSAG,
                                gm.HIERARCHICAL, gm.SUM, gm.AVERAGE], 17)
