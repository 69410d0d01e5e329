"""gradcomp.mpi.ParameterServer under mpirun: 2 ranks (1 worker + 1 server) and 4 ranks
(3 workers + 1 server, and 2 + 2 where the number of servers matters).  The last S ranks
serve; the workers alone also share a communicator of their own for the references.

  allgather    sync aggregate of `none`, top-k + EF and twobit (MXNet's 2-bit) gives bit for
               bit the allgather strategy's floats on the workers alone (the header: the
               server decodes in worker order, as allgather does), the same worker residual,
               and the same result on every worker; the servers refuse nothing.
  update       sync with the servers' SGD (momentum, weight decay, rescale, a learning rate
               sent with the pushes by set_lr) gives, bit for bit, the numpy SGD step on the
               aggregate; plain SGD from the same aggregate is far off; the servers store
               the workers' weights at the parts they own.
  async        runs and ends: each push is applied (the servers' applied = the workers'
               pushes); with one worker the weights follow numpy's sequential SGD bit for bit.
  init/pull    kv.init gives every worker worker 0's values, kv.pull returns them (update) or
               the last round's sum (aggregate); a pull before init is ProtocolError.
  mismatch     an option or a key's spec that differs on one rank raises MismatchError on
               every rank; a bad option only Python sees raises on that rank and
               MismatchError on the others, without a hang.
  roles        serve / set_optimizer on a worker, init / pull / shutdown on a server raise
               ArgumentError with the library's reason; allreduce on a server ProtocolError.
  checkpoint   bucket + server state after K steps, loaded into fresh objects, repeat the
               next M steps bit for bit (update mode with momentum, and compressed pulls with
               the servers' own residual); without the load they differ.
  lifetime     closing the server closes its buckets first; the communicator closes both.
  optimizer    DistributedOptimizer(strategy="ps") on a tiny torch model: the loss falls and
               the workers' replicas stay bit-identical after every step.
"""

import numpy as np
import pytest

import gradcomp
import gradcomp.errors as ge
import gradcomp.mpi as gm
from conftest import TIMEOUT, c_layout, check_layout, digest  # noqa: E402
from mpi4py import MPI

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.rank, WORLD.size
SHAPES = ((40, 30), (300,), (50, 40))
NAMES = ("fc1.weight", "fc1.bias", "fc2.weight")
SERVERS = [1, 2]  # 2 servers only at 4 ranks (2 workers + 2 servers)


@pytest.fixture
def comm():
    # A communicator per test: a test that fails half-way (a worker that never shut down)
    # leaves a failed communicator behind, not a cascade.  Set-up bounded by TIMEOUT.
    c = gm.Communicator(WORLD, timeout=TIMEOUT, setup_timeout=TIMEOUT)
    yield c
    c.close()


@pytest.fixture(scope="module")
def workers_only():
    """{S: a Communicator of this rank's side when the last S ranks serve} - the workers'
    communicator is the reference allgather runs on (the servers' side is unused)."""
    out, mpi = {}, []
    for s in SERVERS:
        if s >= SIZE:
            continue
        sub = WORLD.Split(1 if RANK >= SIZE - s else 0, RANK)
        mpi.append(sub)
        out[s] = gm.Communicator(sub, timeout=TIMEOUT, setup_timeout=TIMEOUT)
    yield out
    for c in out.values():
        c.close()
    for sub in mpi:
        sub.Free()


def need(servers):
    if servers > 1 and SIZE < servers + 2:
        pytest.skip(f"{servers} servers and 2 workers need {servers + 2} ranks")


def gather(comm, obj):
    # On the test's own communicator (its private duplicate): a rank that failed half-way
    # leaves an abandoned gather there, never on COMM_WORLD, which every later test uses.
    return gm.allgather_object(obj, comm, TIMEOUT)


def grad(step, n, who, salt=0):
    rng = np.random.default_rng(7919 * step + 104729 * who + salt)
    return rng.standard_normal(n).astype(np.float32)


def tensors(spec):
    return [gm.Tensor(name, spec, shape) for name, shape in zip(NAMES, SHAPES)]


def sizes():
    return [int(np.prod(s)) for s in SHAPES]


def session(ps, work, timeout=TIMEOUT):
    """Workers run work() and shut down (also when it fails, so that the servers return);
    servers serve until every worker has.  Returns work()'s result, None on servers."""
    if ps.is_server:
        ps.serve(timeout)
        return None
    try:
        out = work()
    except BaseException:
        try:
            ps.shutdown(timeout)
        except gradcomp.Error:
            pass
        raise
    ps.shutdown(timeout)
    return out


def worker_values(comm, value):
    """The workers' values, in worker order (servers contribute None)."""
    return [v for v in gather(comm, value) if v is not None]


# ---- sync aggregate: the allgather strategy's floats ------------------------------------------


@pytest.mark.parametrize("servers", SERVERS)
@pytest.mark.parametrize("spec", ["none", "topk:density=0.1,feedback=ef", "twobit:threshold=0.5"])
def test_sync_aggregate_equals_allgather(comm, workers_only, spec, servers):
    need(servers)
    with comm.parameter_server(servers=servers) as ps:
        pb = comm.bucket(tensors(spec), ps=ps, bucket_bytes=4096)  # several sub-buckets
        assert all(pb.strategy(i) == "ps" for i in range(len(pb)))
        placement = [ps.parts(pb, i) for i in range(len(pb))]
        # one part per key (below part_bytes), each on a server, every server used
        assert all(len(p) == 1 and p[0][:2] == (0, n) for p, n in zip(placement, sizes())), placement
        assert {p[0][2] for p in placement} == set(range(servers)), placement

        def work():
            wc = workers_only[servers]
            assert wc.size == ps.workers and wc.rank == ps.index
            out = []
            with wc.bucket([gm.Tensor(t.name, t.spec, t.shape, "allgather") for t in tensors(spec)],
                           bucket_bytes=4096) as ab:
                for step in range(3):
                    a = [grad(step, n, ps.index, i) for i, n in enumerate(sizes())]
                    b = [x.copy() for x in a]
                    ab.allreduce(a)
                    if step == 1:
                        pb.start(b)
                        pb.wait()
                    else:
                        pb.allreduce(b)  # kv.pushpull, averaged over the workers
                    for i in range(len(a)):
                        assert a[i].tobytes() == b[i].tobytes(), \
                            f"step {step}, {NAMES[i]}: ps differs from allgather by {np.max(np.abs(a[i] - b[i]))}"
                        c = ab.compressor(i)
                        ra = c.residual if c is not None else None
                        if ra is not None:
                            assert np.array_equal(ps.residual(pb, i), ra), f"step {step}: residual of {NAMES[i]}"
                    out.append(digest(b))
            return out

        mine = session(ps, work)
        stats = ps.stats()
        pb.close()
    per_worker = worker_values(comm, mine)
    assert len(per_worker) == SIZE - servers
    assert all(d == per_worker[0] for d in per_worker), "the workers pulled different sums"
    if mine is None:  # a server: every push taken, none refused
        assert stats["refused"] == 0 and stats["applied"] > 0, stats


# ---- sync update: the servers' SGD -------------------------------------------------------------


def sgd(w, v, g, lr, mu, wd, r):
    """The header's step in float32, written as the library writes it."""
    v = mu * v + r * g + wd * w
    return w - lr * v, v


@pytest.mark.parametrize("servers", SERVERS)
def test_sync_update_applies_the_sgd_step(comm, workers_only, servers):
    need(servers)
    lr, mu, wd, r = np.float32(0.1), np.float32(0.9), np.float32(1e-3), np.float32(0.5)
    rates = [None, np.float32(0.05), None]  # step 1's pushes carry their own rate (set_lr)
    ps = gm.ParameterServer(comm, servers=servers, update=True,
                            optimizer={"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-3, "rescale": 0.5},
                            part_bytes=2048)  # fc1.weight and fc2.weight are cut into parts
    assert ps.update and ps.mode == "sync"
    b = comm.bucket(tensors("none"), ps=ps)
    w0 = [grad(99, n, 0, i) for i, n in enumerate(sizes())]

    def work():
        w = [x.copy() if ps.index == 0 else np.zeros_like(x) for x in w0]
        b.init(w)  # worker 0's values, everywhere
        assert all(np.array_equal(x, y) for x, y in zip(w, w0))
        ref_w, ref_v = [x.copy() for x in w0], [np.zeros_like(x) for x in w0]
        plain = [x.copy() for x in w0]
        wc = workers_only[servers]
        with wc.bucket([gm.Tensor(t.name, t.spec, t.shape, "allgather") for t in tensors("none")]) as ab:
            for step, rate in enumerate(rates):
                ps.set_lr(rate)
                g = [grad(step, n, ps.index, i) for i, n in enumerate(sizes())]
                avg = [x.copy() for x in g]
                ab.allreduce(avg)  # the servers' aggregate, bit for bit (the test above)
                b.allreduce(g)  # pushes gradients, pulls the updated weights
                for i in range(len(g)):
                    ref_w[i], ref_v[i] = sgd(ref_w[i], ref_v[i], avg[i], rate or lr, mu, wd, r)
                    plain[i] = plain[i] - (rate or lr) * avg[i]
                    assert g[i].tobytes() == ref_w[i].tobytes(), \
                        f"step {step}, {NAMES[i]}: max |ps - numpy SGD| = {np.max(np.abs(g[i] - ref_w[i]))}"
                    assert ps.version(b, i) == step + 1
            far = max(float(np.max(np.abs(g[i] - plain[i]))) for i in range(len(g)))
            assert far > 1e-3, f"plain SGD is as close as the momentum step ({far}): the check is blind"
        return g

    final = session(ps, work)
    stored = ps.stored(b, 0)[0] if ps.is_server else None
    owners = [(s, p) for s, p in enumerate(gather(comm, stored)) if p is not None]
    if final is not None:  # each server stores the weights at the parts it owns
        servers_ranks = ps.server_ranks
        for off, n, srv in ps.parts(b, 0):
            got = dict(owners)[servers_ranks[srv]]
            assert np.array_equal(got[off:off + n], final[0][off:off + n]), f"part at {off} on server {srv}"
    assert len(ps.parts(b, 0)) > 1
    ps.close()
    assert not b._h, "closing the server closes its buckets"


# ---- async ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("servers", SERVERS)
def test_async_runs_and_ends(comm, servers):
    need(servers)
    steps, lr = 4, np.float32(0.05)
    ps = gm.ParameterServer(comm, servers=servers, mode="async", lr=0.05)
    assert ps.mode == "async" and ps.update  # async implies update
    b = comm.bucket(tensors("none"), ps=ps)
    w0 = [grad(5, n, 0, i) for i, n in enumerate(sizes())]

    def work():
        w = [x.copy() for x in w0]
        b.init(w)
        ps.reset_stats()  # count the pushes of gradients only (init's frames count as pushes)
        ref = [x.copy() for x in w0]
        for step in range(steps):
            g = [grad(step, x.size, ps.index, i) for i, x in enumerate(w)]
            sent = [x.copy() for x in g]
            b.allreduce(g)  # pushes a gradient, gets the current weights back
            assert all(np.all(np.isfinite(x)) for x in g)
            if ps.workers == 1:  # one worker: sequential SGD, w -= lr g
                for i in range(len(g)):
                    ref[i] = ref[i] - lr * sent[i]
                    assert g[i].tobytes() == ref[i].tobytes(), f"step {step}: {NAMES[i]} is not numpy's SGD"
                assert ps.version(b, 0) == step + 1
        return ps.stats()["pushes"]

    pushed = session(ps, work)
    applied = ps.stats()["applied"] if ps.is_server else None
    counts = gather(comm, (pushed, applied))
    total_pushed = sum(p for p, _ in counts if p is not None)
    total_applied = sum(a for _, a in counts if a is not None)
    assert total_pushed >= steps * ps.workers and total_applied == total_pushed, counts
    ps.close()


# ---- kv.init, kv.pull ----------------------------------------------------------------------------


def test_init_and_pull(comm):
    n = sizes()
    w0 = [grad(3, k, 0, i) for i, k in enumerate(n)]
    with comm.parameter_server(update=True) as ps, comm.bucket(tensors("none"), ps=ps) as b:
        def early():
            with pytest.raises(ge.ProtocolError, match="wrong order"):
                b.pull([np.zeros_like(x) for x in w0])  # update mode holds no weights before kv.init

        # A session of its own, and every rank past it, before worker 0's kv.init: that init
        # counts the moment it arrives, and a worker whose pull came later got the weights
        # (seen at 4 ranks, once).
        session(ps, early)
        gather(comm, None)

        def work():
            y = [np.zeros_like(x) for x in w0]
            w = [x.copy() if ps.index == 0 else np.full_like(x, 7.0) for x in w0]
            b.init(w)
            b.pull(y)
            return digest(w), digest(y)
        got = session(ps, work)
    ref = digest(w0)
    assert all(v == (ref, ref) for v in worker_values(comm, got)), "kv.init / kv.pull did not give worker 0's values"

    with comm.parameter_server() as ps, comm.bucket(tensors("twobit:threshold=0.5"), ps=ps) as b:
        def work2():
            g = [grad(1, k, ps.index, i) for i, k in enumerate(n)]
            b.allreduce(g, op="sum")
            y = [np.zeros_like(x) for x in g]
            b.pull(y)  # aggregate: the last round's sum
            assert all(np.array_equal(x, z) for x, z in zip(g, y))
            return True
        assert session(ps, work2) in (True, None)


# ---- mismatches and bad options ---------------------------------------------------------------------


def test_mismatched_options_raise_on_every_rank(comm):
    with pytest.raises(ge.MismatchError, match="options differ"):
        gm.ParameterServer(comm, part_bytes=8192 if RANK == 0 else 4096)
    with pytest.raises(ge.MismatchError):
        gm.ParameterServer(comm, mode="async" if RANK == SIZE - 1 else "sync")
    # a key whose spec differs on a server: the bucket's set-up check covers the servers
    with comm.parameter_server() as ps:
        spec = "topk:density=0.2,feedback=ef" if ps.is_server else "topk:density=0.1,feedback=ef"
        with pytest.raises(ge.MismatchError):
            comm.bucket([gm.Tensor("w", spec, 1000)], ps=ps)
    # the communicator is still usable
    with comm.parameter_server() as ps, comm.bucket([gm.Tensor("w", "none", 10)], ps=ps) as b:
        session(ps, lambda: b.allreduce([np.ones(10, np.float32)]))


@pytest.mark.parametrize("options,cls,needle", [
    (dict(servers=SIZE), ge.ArgumentError, "servers on"),
    (dict(pull="same", update=True), ge.ArgumentError, "compressed pulls"),
    (dict(pull="topk:density=2"), ge.SpecError, "pull spec"),
    (dict(lr=-1.0), ge.ArgumentError, "optimizer"),
    (dict(part_bytes=100), ge.ArgumentError, "part_bytes"),
])
def test_bad_options_raise_the_c_reason_on_every_rank(comm, options, cls, needle):
    with pytest.raises(cls, match=needle):
        gm.ParameterServer(comm, **options)


def test_python_side_errors_do_not_hang_the_other_ranks(comm):
    cases = [
        (dict(mode="bogus"), ge.ArgumentError, "mode 'bogus'"),
        (dict(server_ranks=[SIZE - 1], servers=2), ge.ArgumentError, "server_ranks"),
        (dict(optimizer={"lr": 0.1}, momentum=0.9), TypeError, "not both"),
        (dict(optimizer={"learning_rate": 0.1}), TypeError, "learning_rate"),
        (dict(part_bytes=-1), ge.ArgumentError, "does not fit"),
    ]
    for options, cls, needle in cases:
        if RANK == 0:
            with pytest.raises(cls, match=needle):
                gm.ParameterServer(comm, **options)
        else:
            with pytest.raises(ge.MismatchError, match="rank 0"):
                gm.ParameterServer(comm)
    # server_ranks: any ranks may serve
    with comm.parameter_server(server_ranks=[0]) as ps:
        assert ps.server_ranks == [0] and ps.is_server == (RANK == 0)
        assert ps.worker_ranks == list(range(1, SIZE))


# ---- roles -------------------------------------------------------------------------------------------


def test_each_role_refuses_the_other_roles_calls(comm):
    with comm.parameter_server() as ps, comm.bucket(tensors("none"), ps=ps) as b:
        x = [np.ones(n, np.float32) for n in sizes()]
        if ps.is_server:
            for call in (b.init, b.pull):
                with pytest.raises(ge.ArgumentError, match="is a server"):
                    call(x)
            with pytest.raises(ge.ArgumentError, match="server does not shut down"):
                ps.shutdown()
            with pytest.raises(ge.ProtocolError, match="parameter server"):
                b.allreduce(x)
            with pytest.raises(ge.ArgumentError, match="worker keeps|keeps no worker residual"):
                ps.residual(b, 0)
            ps.set_optimizer(b, 1, weight_decay=0.0)  # MXNet's wd_mult = 0 for a bias
        else:
            with pytest.raises(ge.ArgumentError, match="is a worker"):
                ps.serve()
            with pytest.raises(ge.ArgumentError, match="is a worker"):
                ps.set_optimizer(b, None, lr=0.5)
            with pytest.raises(ge.ArgumentError, match="only servers store"):
                ps.stored(b, 0)
        with pytest.raises(IndexError):
            ps.parts(b, len(b))
        with pytest.raises(ge.ArgumentError, match="finite"):
            ps.set_lr(-1.0)
        # a plain bucket is no parameter server's
        with comm.bucket([gm.Tensor("v", "none", 10)]) as plain:
            with pytest.raises(ValueError, match="not a bucket of this parameter server"):
                ps.parts(plain, 0)
            if not ps.is_server:
                with pytest.raises(ge.ArgumentError, match="not a parameter-server bucket"):
                    plain.pull([np.zeros(10, np.float32)])


# ---- checkpoints -------------------------------------------------------------------------------------


def run_steps(ps, b, first, count):
    def work():
        out = []
        for step in range(first, first + count):
            g = [grad(step, n, ps.index, i) for i, n in enumerate(sizes())]
            b.allreduce(g)
            out.append(digest(g))
        return out
    return session(ps, work)


@pytest.mark.parametrize("servers", SERVERS)
@pytest.mark.parametrize("mode", ["update", "pull"])
def test_state_round_trip_resumes_bit_for_bit(comm, servers, mode):
    need(servers)
    K, M = 2, 2
    opts = dict(servers=servers, part_bytes=2048)
    if mode == "update":  # the servers' weights and momentum, the workers' twobit residuals
        opts.update(update=True, lr=0.05, momentum=0.9, weight_decay=1e-3)
    else:  # BytePS: compressed pulls, with the servers' own residuals
        opts.update(pull="same")
    spec = "twobit:threshold=0.5"

    def make():
        ps = gm.ParameterServer(comm, **opts)
        return ps, comm.bucket(tensors(spec), ps=ps)

    ps, b = make()
    if mode == "update" and not ps.is_server:
        b.init([grad(50, n, 0, i) for i, n in enumerate(sizes())])
    run_steps(ps, b, 0, K)
    blob, ps_blob = b.state_bytes(), ps.save_state()
    assert isinstance(ps_blob, list) and len(ps_blob) == 1
    # Every server out of serve() before the next session's first push: a push that reaches
    # a server while it ends a session is lost (libgradcomp_mpi's serve clean-up), so the
    # sessions are kept apart here.
    gather(comm, None)
    ref = run_steps(ps, b, K, M)
    ps.close()

    ps, b = make()
    b.load_state(blob)
    ps.load_state(ps_blob)
    got = run_steps(ps, b, K, M)
    # a foreign blob is refused and changes nothing: another rank's, a flipped byte
    other = gather(comm, ps_blob[0])[(RANK + 1) % SIZE]
    with pytest.raises(ge.MismatchError):
        ps.load_state(other, b)
    bad = bytearray(ps_blob[0])
    bad[len(bad) // 2] ^= 0x40
    with pytest.raises(ge.CorruptMessage):
        ps.load_state([bytes(bad)])
    ps.close()

    ps, b = make()  # no load: the same steps from a fresh state
    if mode == "update" and not ps.is_server:
        b.init([grad(50, n, 0, i) for i, n in enumerate(sizes())])
    fresh = run_steps(ps, b, K, M)
    ps.close()
    assert got == ref, "the loaded objects did not repeat the saved run"
    assert fresh != ref or ref is None, "a fresh state gives the same results: the check is blind"


# ---- lifetime --------------------------------------------------------------------------------------


def test_close_order_is_safe(comm):
    ps = comm.parameter_server()
    b1 = comm.bucket([gm.Tensor("a", "none", 10)], ps=ps)
    b2 = gm.Bucket(comm, [gm.Tensor("b", "none", 10)], ps=ps)
    assert b1.ps is ps and "parameter server" in repr(b2)
    b1.close()
    ps.close()  # closes b2 first: the C library refuses a server with live buckets
    assert not b2._h and not ps._h
    with pytest.raises(ValueError, match="closed"):
        b2.allreduce([np.zeros(10, np.float32)])
    with pytest.raises(ValueError, match="closed"):
        comm.bucket([gm.Tensor("c", "none", 10)], ps=ps)
    # the communicator closes a server and its buckets in the right order
    c2 = gm.Communicator(WORLD, timeout=TIMEOUT, setup_timeout=TIMEOUT)
    ps2 = c2.parameter_server()
    b3 = c2.bucket([gm.Tensor("a", "none", 10)], ps=ps2)
    with pytest.raises(ValueError, match="another communicator"):
        comm.bucket([gm.Tensor("a", "none", 10)], ps=ps2)
    c2.close()
    assert not b3._h and not ps2._h


def test_struct_layout_matches_header():
    lines = c_layout(r"""
  S(gcomp_mpi_ps_optimizer); F(gcomp_mpi_ps_optimizer, lr); F(gcomp_mpi_ps_optimizer, momentum);
  F(gcomp_mpi_ps_optimizer, weight_decay); F(gcomp_mpi_ps_optimizer, rescale);
  F(gcomp_mpi_ps_optimizer, nesterov);
  S(gcomp_mpi_ps_options); F(gcomp_mpi_ps_options, servers); F(gcomp_mpi_ps_options, server_ranks);
  F(gcomp_mpi_ps_options, mode); F(gcomp_mpi_ps_options, update); F(gcomp_mpi_ps_options, optimizer);
  F(gcomp_mpi_ps_options, pull); F(gcomp_mpi_ps_options, part_bytes); F(gcomp_mpi_ps_options, max_staleness);
  S(gcomp_mpi_ps_stats); F(gcomp_mpi_ps_stats, applied); F(gcomp_mpi_ps_stats, busy_ns);
  F(gcomp_mpi_ps_stats, dropped); F(gcomp_mpi_ps_stats, refused); F(gcomp_mpi_ps_stats, workers_lost);
  F(gcomp_mpi_ps_stats, reserved);
  S(gcomp_mpi_bucket_options); F(gcomp_mpi_bucket_options, ps);
  printf("E %d %d %d\n", GCOMP_MPI_PS, GCOMP_MPI_PS_SYNC, GCOMP_MPI_PS_ASYNC);
""")
    types = {"gcomp_mpi_ps_optimizer": gm.PSOptimizer, "gcomp_mpi_ps_options": gm.PSOptions,
             "gcomp_mpi_ps_stats": gm.PSStats, "gcomp_mpi_bucket_options": gm.BucketOptions}
    check_layout(lines, types, [gm.PS, gm.PS_SYNC, gm.PS_ASYNC], 25)


# ---- the DistributedOptimizer through a parameter server -----------------------------------------------


def test_distributed_optimizer_through_the_server(comm):
    torch = pytest.importorskip("torch")
    import gradcomp.torch as gt

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    teacher = torch.randn(16, 4, generator=torch.Generator().manual_seed(7))
    base = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with pytest.raises(ValueError, match="needs ps="):
        gt.DistributedOptimizer(base, model.named_parameters(), strategy="ps")
    ps = gm.ParameterServer(comm, servers=2 if SIZE >= 4 else 1, timeout=TIMEOUT)
    opt = gt.DistributedOptimizer(base, model.named_parameters(), compression="spec=topk:density=0.25;min_elements=64",
                                  strategy="ps", ps=ps, timeout=TIMEOUT, bucket_bytes=0)
    assert opt.parameter_server is ps and opt.communicator is comm
    assert {s for *_, s in opt.layout()} == {"ps"}
    gt.broadcast_parameters(model.state_dict(), root_rank=0, comm=comm, timeout=TIMEOUT)
    losses, digests = [], []
    server = ps.is_server

    if server:
        with pytest.raises(ge.ArgumentError, match="server"):
            opt.shutdown()
        opt.serve()  # until every worker's shutdown()
    else:
        with pytest.raises(ge.ArgumentError, match="is a worker"):
            opt.serve()
        for step in range(20):
            g = torch.Generator().manual_seed(1000 * step + ps.index)
            x = torch.randn(32, 16, generator=g)
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), (x @ teacher).argmax(1))
            loss.backward()
            opt.step()
            losses.append(loss.item())
            digests.append(digest([p.detach().numpy() for p in model.parameters()]))
        st = opt.stats()  # what the workers pushed: compressed weights, dense biases
        assert st["steps"] == 20 and 0 < st["message_bytes"] < st["dense_bytes"], st
        opt.shutdown()
    # a checkpoint between sessions holds the server's part of every bucket too
    sd = opt.state_dict()
    assert len(sd["gradcomp"]["ps"]) == len(sd["gradcomp"]["buckets"]) == len(opt.layout())
    opt.load_state_dict(sd)
    opt.close()
    ps.close()
    per_worker = worker_values(comm, None if server else digests)
    assert all(d == per_worker[0] for d in per_worker), "the workers' replicas differ"
    if not server:
        first, last = np.mean(losses[:4]), np.mean(losses[-4:])
        assert last < 0.85 * first, f"the loss did not fall: {first:.3f} -> {last:.3f}"

    # a worker's close() ends its session when it did not call shutdown()
    with gm.ParameterServer(comm) as ps2:
        opt2 = gt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                                       strategy="ps", ps=ps2, timeout=TIMEOUT)
        if ps2.is_server:
            opt2.serve()
        else:
            model(torch.ones(2, 16)).sum().backward()
            opt2.step()
        opt2.close()

    # update or async servers hand back weights: refused
    with gm.ParameterServer(comm, update=True) as ups:
        with pytest.raises(ValueError, match="sync aggregate"):
            gt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), strategy="ps", ps=ups)



# ---- adaptive methods and the parameter server (the py-adapt merge) ---------------------------


def test_adaptive_methods_are_refused_through_the_server(comm):
    """An adaptive method with strategy="ps" is UnsupportedError at construction on every
    rank (its decisions and retunes are collectives the serving servers cannot join, and
    the library has no retune of a server's keys), and Bucket.retune of a ps bucket is
    UnsupportedError before any communication: the bucket and its session go on."""
    torch = pytest.importorskip("torch")
    import gradcomp.torch as gt

    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    method = "adapt:norm;base=topk:density=0.1,feedback=ef;min_elements=64;interval=4"
    with gm.ParameterServer(comm) as ps:
        for strategy in ("ps", "hierarchical:ps"):
            with pytest.raises(ge.UnsupportedError, match="parameter server"):
                gt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                                        compression=method, strategy=strategy, ps=ps, total_steps=100,
                                        probe_bytes=0, timeout=TIMEOUT)
        # the refusal left nothing behind: the same server takes an optimizer with a fixed spec
        opt = gt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                                      compression="topk:density=0.1,feedback=ef", strategy="ps", ps=ps,
                                      timeout=TIMEOUT)
        assert opt.adapt is None and opt.specs()["0.weight"].startswith("topk:")
        if ps.is_server:
            opt.serve()
        else:
            model(torch.ones(2, 64)).sum().backward()
            opt.step()
            opt.shutdown()
        opt.close()

        b = comm.bucket(tensors("topk:density=0.1,feedback=ef"), ps=ps)
        before = b.spec(0)
        with pytest.raises(ge.UnsupportedError, match="parameter server"):
            b.retune(0, "topk:density=0.05,feedback=ef")
        b.retune(0, before)  # the spec it has: nothing to do, as in the library
        assert b.spec(0) == before

        def work():
            g = [grad(0, n, ps.index) for n in sizes()]
            b.allreduce(g)
            return digest(g)

        got = session(ps, work)
        assert len(set(worker_values(comm, got))) == 1
        b.close()
