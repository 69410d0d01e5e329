"""gradcomp.optimizer - a Horovod-style DistributedOptimizer on libgradcomp_mpi.

    from mpi4py import MPI                      # mpirun -np 4 python3 train.py
    import gradcomp.torch as gt

    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt = gt.DistributedOptimizer(opt, model.named_parameters(),
                                  compression="dgc:density=0.001", strategy="auto")
    gt.broadcast_parameters(model.state_dict(), root_rank=0)
    gt.broadcast_optimizer_state(opt, root_rank=0)
    for x, y in data:
        opt.zero_grad()
        loss_fn(model(x), y).backward()         # buckets start exchanging during backward
        opt.step()                              # waits for them, then the SGD step

How it works (Horovod's design, Sergeev & Del Balso 2018, on gradcomp's collectives):
  * Each trainable parameter gets a hook on its AccumulateGrad node (the node that writes
    p.grad; torch 1.13 has no post-accumulate tensor hook), which fires once p.grad holds
    this backward pass's gradient.
  * Parameters are grouped into buckets in reverse registration order (the order backward
    produces gradients), each about `bucket_bytes` of float32.  A bucket is one
    gcomp_mpi_bucket with each parameter's own spec and strategy.  The moment a bucket's
    last gradient is ready, its exchange starts (gcomp_mpi_start: compress, send what can
    be sent) while backward goes on with earlier layers, and every later hook pokes the
    buckets in flight (gcomp_mpi_test: MPI moves data only inside MPI calls).
  * step() = synchronize() + the wrapped optimizer's step.  synchronize() starts any bucket
    whose gradients never all arrived (unused parameters get zero gradients, as in Horovod),
    waits for every bucket with the timeout, and leaves the average over ranks in p.grad.
  * The returned object is an instance of a subclass of the wrapped optimizer's class
    (Horovod's trick), built on the same parameter groups and state: isinstance checks,
    LR schedulers and the class's own step() keep working.
Rejected: torch.distributed with an MPI backend (Debian's torch is built without one);
DDP communication hooks (DDP's buckets, gloo's collectives: no sparse allreduce, rsag,
hierarchical or timeouts); one bucket per model (no overlap with backward); one per
parameter as the default (per-bucket latency and Python overhead on many small tensors -
bucket_bytes=0 gives it, as `gradcomp train` does).

Compression: `compression` is a spec ("topk:density=0.01,feedback=ef"), a C policy string
("spec=dgc:density=0.001;min_elements=8192;dense=none:values=f16"), a LayerPolicy, or any
callable (name, shape) -> spec or None (None: dense f32).  A spec means LayerPolicy(spec):
tensors under 1024 elements and 1-D tensors (biases, norms) go dense, and a density codec
sends at least 512 values of a tensor a step (min_k).  `strategy` applies
to the tensors that get the method's spec; dense ones keep "auto" (allreduce).

Adaptive methods: compression="adapt:CONTROLLER[+...][;KEY=VALUE...]" (gradcomp.h,
"Adaptive compression"; docs/ADAPTIVE.md) builds a gradcomp.Adapt over the parameters (the
library parses the method and applies its layer policy, min_elements 1024 and biases dense
unless the method says otherwise).  Each step, before a bucket's exchange starts, the
controllers observe each managed gradient with what its compressor holds back; after a
successful exchange synchronize() ends their step; when a decision is due it is taken after
the wrapped optimizer's step, between two exchanges: a link probe when the bandwidth
controller asks for one (gcomp_mpi_link_probe at the decisions Adapt.link_due names: spaced
so that probing takes at most the controller's probe_cost of the time), one collective decision
(gcomp_mpi_adapt_decide: every rank decides alike on every rank's statistics) and a retune
of each tensor that changes (gcomp_mpi_bucket_retune: what it holds back is kept), in
tensor order.  Forward + backward time (from the end of one step() to the next
synchronize(), less the codec time) and the optimizer's are observed as `gradcomp train`
does.  specs() and adapt_history() show the settings; a tensor switched into or out of a
spec that keeps momentum (DGC) changes parameter group, and its optimizer momentum starts
afresh, as in `gradcomp train`.

DGC keeps its momentum inside the compressor (momentum correction, Lin et al. 2018): for
the parameters whose spec does, the wrapped optimizer must not apply momentum a second
time.  Those parameters move to a sibling parameter group with momentum 0 (and nesterov
off), everything else equal - the same rule as `gradcomp train` (skip momentum where DGC
owns it).  Optimizers without a `momentum` setting (Adam) are left alone.  Call
set_epoch(fractional_epoch) before each step for DGC's warm-up schedule.

Checkpoints: state_dict() holds the wrapped optimizer's state and, under "gradcomp", this
rank's state of every bucket (residuals, DGC momentum, PowerSGD's Q, the step counters that
key random draws).  It is per rank: save one file per rank, load each rank's own.
load_state_dict() into an optimizer built the same way on the same number of ranks
resumes bit for bit.  For an adaptive method the state also holds every tensor's spec (the
buckets are retuned to them before their states load) and the controllers' own state
(Adapt.save_state), so a resumed run decides on as the uninterrupted one would.

Parameter server: strategy="ps" with ps=gradcomp.mpi.ParameterServer(...) in sync aggregate
mode (BytePS): the workers push and pull through S server ranks, which call opt.serve()
instead of training (see DistributedOptimizer).  Its keys keep their specs: an adaptive
method with strategy="ps" is refused at construction (UnsupportedError).

Errors: every rank raises, never hangs.  A rank with another model (parameter names, count,
shapes) or another spec raises MismatchError on every rank at construction, naming the
first parameter that differs and what each rank has; a dead or stalled peer raises
CollectiveTimeout (or MPIError) from step() on every survivor within `timeout`; a NaN or
Inf gradient anywhere raises NonFiniteError on every rank (skip the step and go on).
"""

import contextlib
import ctypes
import functools
import io
import math
import operator
import time
import weakref

import torch

from . import adapt as _adapt
from . import core as _core
from . import errors as _err
from . import mpi as _gm

_F32 = torch.float32
_RULE_METHOD = (0, 3)  # GCOMP_RULE_OVERRIDE, GCOMP_RULE_DEFAULT: the method's own spec
_PROBE_BYTES = 512 << 10  # the link probe of an adaptive decision, as the C trainer's
_ADAPT_MIN_ELEMENTS = 1024  # the layer policy's default here (LayerPolicy, AdaptivePolicy)


_spec_keeps_momentum = _core._keeps_momentum


# ---- planning ------------------------------------------------------------------------------


class _Param:
    __slots__ = ("index", "key", "param", "shape", "spec", "strategy", "rule", "bucket", "slot", "adapt")

    def __init__(self, index, key, param):
        self.index, self.key, self.param = index, key, param
        self.shape = tuple(param.shape)
        self.slot = None  # index in its bucket
        self.adapt = False  # managed by the adaptive controllers (index = the Adapt's index)


class _Bucket:
    __slots__ = ("index", "params", "mpi", "pending", "started", "error", "nbytes")

    def __init__(self, index, params):
        self.index, self.params = index, params
        self.mpi = None
        self.pending = len(params)
        self.started = False
        self.error = None  # found during backward, raised by synchronize
        self.nbytes = 4 * sum(math.prod(p.shape) for p in params)


def _is_adaptive(compression):
    return isinstance(compression, str) and compression.startswith("adapt:")


def _policy_of(compression):
    from .torch import LayerPolicy  # torch.py re-exports this module: import late

    if compression is None:
        compression = "none"
    if isinstance(compression, str):
        return LayerPolicy(compression)
    if callable(compression):
        return compression
    raise TypeError("compression must be a spec or policy string, a LayerPolicy, or a callable "
                    "(name, shape) -> spec or None")


def _plan_spec(policy, key, shape):
    """(canonical spec, rule) for one parameter; rule is the C policy's rule, or 3 (the
    method's spec) / 2 (dense) for a plain callable."""
    if hasattr(policy, "plan"):
        d = policy.plan(key, shape)
        spec, rule = d["spec"], d["rule"]
    else:
        spec = policy(key, shape)
        rule = 3 if spec is not None else 2
        if spec is None:
            spec = "none"
    return _core.canonical(spec), rule


def _describe(p):
    return f"shape {tuple(p[1])}, spec {p[2]!r}, strategy {p[3]}"


def _describe_adapt(how):
    if how is None:
        return "no adaptive method"
    return f"adaptive method {how[0]!r} (total_steps {how[1]}, interval {how[2]}, measure {how[3]})"


def _first_difference(gathered, what):
    """A message naming the first entry where some rank differs from rank 0, or None."""
    ref = gathered[0]
    for r, other in enumerate(gathered[1:], 1):
        for i in range(max(len(ref), len(other))):
            a = ref[i] if i < len(ref) else None
            b = other[i] if i < len(other) else None
            if a == b:
                continue
            if a is None or b is None:
                has, lacks = (0, r) if b is None else (r, 0)
                x = a if b is None else b
                return (f"{what}: rank {has} has {len(gathered[has])} parameters, rank {lacks} "
                        f"{len(gathered[lacks])} (rank {has}'s parameter #{i} is {x[0]!r})")
            if a[0] != b[0]:
                return (f"{what}: parameter #{i} is {a[0]!r} on rank 0 but {b[0]!r} on rank {r} "
                        "(another model, or parameters registered in another order)")
            return f"{what}: parameter {a[0]!r}: rank 0 has {_describe(a)}; rank {r} has {_describe(b)}"
    return None


# ---- the optimizer ---------------------------------------------------------------------------


class _DistributedMixin:
    """The methods the DistributedOptimizer subclass puts in front of the wrapped
    optimizer's class (see DistributedOptimizer)."""

    def __init__(self, optimizer, named_parameters, compression, strategy, backward_passes_per_step,
                 timeout, setup_timeout, bucket_bytes, pipeline_bytes, comm, op, total_steps, probe_bytes,
                 ps):
        if backward_passes_per_step < 1:
            raise ValueError(f"backward_passes_per_step must be >= 1, got {backward_passes_per_step}")
        total_steps = 0 if total_steps is None else operator.index(total_steps)
        if total_steps < 0:
            raise ValueError(f"total_steps must be >= 0 (0: unknown), got {total_steps}")
        probe_bytes = _PROBE_BYTES if probe_bytes is None else operator.index(probe_bytes)
        if probe_bytes != 0 and not 1024 <= probe_bytes <= 1 << 30:
            raise ValueError(f"probe_bytes must be 0 (no probe) or 1 KiB..1 GiB, got {probe_bytes}")
        self._gc_closed = True  # until fully built: close() and __del__ do nothing
        self._gc_hooks = []
        self._gc_buckets = []
        comm = self._gc_check_ps(ps, strategy, comm)
        owns_comm = not isinstance(comm, _gm.Communicator)
        gcomm = comm if not owns_comm else _gm.Communicator(comm, timeout=timeout, setup_timeout=setup_timeout)
        try:
            plan, policy = self._gc_plan(optimizer, named_parameters, compression, strategy, gcomm,
                                         gcomm.setup_timeout, total_steps)
            buckets = self._gc_make_buckets(plan, bucket_bytes, pipeline_bytes, gcomm, gcomm.setup_timeout,
                                            server=ps)
        except BaseException:
            if owns_comm:
                gcomm.close()
            raise
        adapt = policy if isinstance(policy, _adapt.Adapt) else None
        if adapt is not None:
            # The controllers' cost model sees the buckets as the library sends them: runs of
            # consecutive tensors of one strategy, cut at pipeline_bytes (gm_groups_plan).
            run = _gm.default_sub_bucket_bytes() if pipeline_bytes is None else int(pipeline_bytes)
            adapt.set_exchanges([e.bucket.index + 1 for e in plan], run if run > 0 else None)
        groups, pairs = self._gc_groups(optimizer, plan, self._gc_movable(adapt, plan))
        super().__init__(groups)
        self.defaults = dict(optimizer.defaults)
        for p, s in optimizer.state.items():
            self.state[p] = s
        self._gc_comm, self._gc_owns_comm = gcomm, owns_comm
        self._gc_ps = ps
        self._gc_session = ps is not None and not ps.is_server  # a worker that has not shut down
        self._gc_policy = policy
        # Adaptive methods: the controllers, momentum moves, the record of settings.
        self._gc_adapt = adapt
        self._gc_pairs = pairs  # id(param) -> (group with momentum, group without)
        self._gc_tails = {}  # id(param) -> [param, released momentum buffer, steps left]
        self._gc_order = {id(e.param): n for n, e in enumerate(plan)}
        # Parameters the exchange leaves out (frozen when it was built, or empty): one that
        # gets a gradient later would be stepped with this rank's own, unaveraged
        self._gc_unplanned = [(gi, pi, p) for gi, g in enumerate(optimizer.param_groups)
                              for pi, p in enumerate(g["params"])
                              if id(p) not in self._gc_order and p.numel() > 0]
        self._gc_probe = probe_bytes
        self._gc_adapt_step = 0  # steps the controllers have counted
        self._gc_due = False  # a decision is due after this step's optimizer step
        self._gc_adapt_error = None  # an observation that failed this step (this rank)
        self._gc_fb_s = None  # this step's forward + backward less codec time, seconds
        self._gc_fb_filter = _adapt._StepFilter()  # leaves out evaluations between steps
        self._gc_mark = None  # (time, codec ns) at the end of the last step()
        self._gc_history = [(0, e.key, e.spec) for e in plan if e.adapt]
        self._gc_params = plan
        self._gc_buckets = buckets
        self._gc_timeout = timeout
        self._gc_op = op
        self._gc_passes = int(backward_passes_per_step)
        self._gc_delay = [self._gc_passes] * len(plan)
        self._gc_fired = 0  # hook calls since the last synchronize
        # whether this step's synchronize() ran (reset by step() and by a backward): what
        # makes it idempotent, the same on every rank (a rank that ran no backward still
        # takes part in the exchange)
        self._gc_synced = False
        self._gc_inflight = []
        self._gc_should_sync = True
        self._gc_epoch = None
        self._gc_steps = 0
        self._gc_msg_bytes = 0.0
        self._gc_sent_before = {}
        self._gc_wait_ns = 0
        self._gc_closed = False
        wself = weakref.ref(self)
        for e in plan:
            self._gc_hooks.append(self._gc_hook(wself, e))

    # -- construction --
    @staticmethod
    def _gc_check_ps(ps, strategy, comm):
        """The communicator to use; refuses a parameter server the optimizer cannot use."""
        try:
            via_ps = _gm.strategy_value(strategy) & 0xFF == _gm.PS
        except _err.Error:
            via_ps = False  # an unknown name: _gc_plan reports it on every rank
        if ps is None:
            if via_ps:
                raise ValueError(f"gradcomp: strategy={strategy!r} needs ps=gradcomp.mpi.ParameterServer(...)")
            return comm
        if not isinstance(ps, _gm.ParameterServer):
            raise TypeError(f"gradcomp: ps must be a gradcomp.mpi.ParameterServer, got {type(ps).__name__}")
        if not via_ps:
            raise ValueError(f"gradcomp: with ps=, strategy must be 'ps' (or 'hierarchical:ps'), got {strategy!r}")
        if ps.mode != "sync" or ps.update:
            raise ValueError(f"gradcomp: the DistributedOptimizer keeps the optimizer on the workers and needs a "
                             f"parameter server in sync aggregate mode (mode='sync', update=False), not "
                             f"{ps.mode}{' update' if ps.update else ''}: its pulls would be weights, not gradients")
        if comm is not None and comm is not ps.comm:
            raise ValueError("gradcomp: with ps=, comm must be None or the server's own communicator (ps.comm)")
        return ps.comm

    def _gc_plan(self, optimizer, named_parameters, compression, strategy, gcomm, timeout, total_steps=0):
        """Names, specs and strategies of every parameter; collective check of the layout.
        For an adaptive method the policy returned is its gradcomp.Adapt."""
        local_error = None
        plan, policy = [], None
        try:
            opt_params = [p for g in optimizer.param_groups for p in g["params"]]
            if named_parameters is not None:
                named = list(named_parameters)
                names = {}
                for name, p in named:
                    if id(p) in names:
                        continue  # a shared parameter named twice: its first name
                    names[id(p)] = name
                if len(set(names.values())) != len(names):
                    dup = sorted({n for n in names.values() if list(names.values()).count(n) > 1})
                    raise ValueError(f"gradcomp: parameter names must be unique; repeated: {dup[:3]}")
                missing = [i for i, p in enumerate(opt_params) if id(p) not in names]
                if missing:
                    raise ValueError("gradcomp: named_parameters does not name every parameter of the "
                                     f"optimizer ({len(missing)} unnamed, the first is its #{missing[0]})")
                order = {id(p): i for i, (_, p) in enumerate(named)}
            else:
                names = {id(p): f"param.{i}" for i, p in enumerate(opt_params)}
                order = {id(p): i for i, p in enumerate(opt_params)}
            seen, todo = set(), []
            for p in opt_params:
                if id(p) in seen or not p.requires_grad:
                    continue
                seen.add(id(p))
                if p.dtype != _F32 or p.device.type != "cpu" or p.layout != torch.strided:
                    raise TypeError(f"gradcomp: parameter {names[id(p)]!r}: gradcomp exchanges float32 "
                                    f"dense CPU tensors, this one is {p.dtype} {p.layout} on {p.device}")
                if p.numel() == 0:
                    continue
                todo.append(p)
            todo.sort(key=lambda p: order[id(p)])
            strat = _gm.strategy_value(strategy)
            if _is_adaptive(compression):
                if strat & 0xFF == _gm.PS:
                    raise _err.UnsupportedError(
                        f"gradcomp: adaptive method {compression!r} with strategy={strategy!r}: adaptive "
                        "methods do not run through a parameter server.  A decision (gcomp_mpi_adapt_decide, "
                        "the link probe) and a structural retune (gcomp_mpi_bucket_retune: a 'ps' tensor "
                        "always is one) are collectives of the whole communicator, servers included, while "
                        "the servers sit in serve(), and include/gradcomp_mpi.h defines no retune of a "
                        "server's keys.  Use a fixed spec with strategy='ps', or an adaptive method with "
                        "another strategy (no ps=)",
                        status=_err.E_UNSUPPORTED, status_name="GCOMP_E_UNSUPPORTED")
                policy = self._gc_make_adapt(compression, [(names[id(p)], tuple(p.shape)) for p in todo],
                                             strat, gcomm, total_steps)
            else:
                policy = _policy_of(compression)
            for i, p in enumerate(todo):
                e = _Param(i, names[id(p)], p)
                if isinstance(policy, _adapt.Adapt):
                    # The controllers' layer policy: managed tensors get a ladder entry and
                    # the strategy; the others their fixed spec (dense, a glob's) and auto.
                    e.adapt = policy.managed(i)
                    e.spec, e.rule = _core.canonical(policy.spec(i)), 3 if e.adapt else 2
                else:
                    e.spec, e.rule = _plan_spec(policy, e.key, e.shape)
                e.strategy = strat if e.rule in _RULE_METHOD else _gm.AUTO
                plan.append(e)
        except Exception as e:  # reported to every rank below, raised here
            local_error = e
        mine = None if local_error else [(e.key, e.shape, e.spec, _gm.strategy_name(e.strategy)) for e in plan]
        # An adaptive method's configuration: ranks that decide at other steps would meet a
        # decision's collective with a data collective (timeouts), so it is compared here.
        how = None
        if isinstance(policy, _adapt.Adapt) and local_error is None:
            how = (policy.method, int(total_steps), policy.interval, policy.measure_interval)
        gathered = _gm.allgather_object((repr(local_error) if local_error else None, mine, how), gcomm, timeout)
        if local_error is not None:
            raise local_error
        bad = [(r, msg) for r, (msg, _, _) in enumerate(gathered) if msg]
        if bad:
            raise _err.Error(f"gradcomp: DistributedOptimizer could not be set up on rank {bad[0][0]}: "
                             f"{bad[0][1]}")
        # Names and order here; sizes and specs are the library's set-up check's (each
        # bucket's), but a different parameter count would give ranks different numbers of
        # buckets, which no single bucket can see.
        layouts = [[x[0] for x in plan_r] for _, plan_r, _ in gathered]
        if any(lay != layouts[0] for lay in layouts):
            msg = _first_difference([g[1] for g in gathered], "gradcomp: the ranks' models differ")
            raise _err.MismatchError(msg, status=_err.E_MISMATCH, status_name="GCOMP_E_MISMATCH")
        for r, (_, _, other) in enumerate(gathered):
            if other != gathered[0][2]:
                raise _err.MismatchError(f"gradcomp: the ranks' compression differs: rank 0 runs "
                                         f"{_describe_adapt(gathered[0][2])}, rank {r} runs {_describe_adapt(other)}",
                                         status=_err.E_MISMATCH, status_name="GCOMP_E_MISMATCH")
        return plan, policy

    @staticmethod
    def _gc_make_adapt(method, tensors, strat, gcomm, total_steps):
        """The controllers of an adaptive method over every exchanged parameter (the library
        parses the method: a bad one is SpecError here, on every rank alike)."""
        if not tensors:
            raise ValueError(f"gradcomp: adaptive method {method!r}: the optimizer has no trainable parameter")

        def cost_strategy(spec):  # the strategy each candidate would run with, for the cost model
            return _gm.cost_strategy(strat, spec)

        return _adapt.Adapt(method, tensors, total_steps=total_steps, workers=gcomm.size, nodes=gcomm.nodes,
                            min_elements=_ADAPT_MIN_ELEMENTS, strategy=cost_strategy)

    @staticmethod
    def _gc_movable(adapt, plan):
        """Parameters whose momentum can move between the optimizer and the compressor: the
        managed ones when the ladder mixes specs that keep the momentum (DGC) with others."""
        if adapt is None or not _core._mixes_momentum(adapt.ladder):
            return set()
        return {id(e.param) for e in plan if e.adapt}

    def _gc_make_buckets(self, plan, bucket_bytes, pipeline_bytes, gcomm, timeout, server=None):
        limit = 4 << 20 if bucket_bytes is None else int(bucket_bytes)
        groups, cur, size = [], [], 0
        for e in reversed(plan):
            cur.append(e)
            size += 4 * math.prod(e.shape)
            if size >= limit:
                groups.append(cur)
                cur, size = [], 0
        if cur:
            groups.append(cur)
        buckets = []
        try:
            for bi, ps in enumerate(groups):
                b = _Bucket(bi, ps)
                for slot, e in enumerate(ps):
                    e.bucket, e.slot = b, slot
                tensors = [_gm.Tensor(e.key, e.spec, e.shape, e.strategy) for e in ps]
                try:
                    b.mpi = _gm.Bucket(gcomm, tensors, bucket_bytes=pipeline_bytes, timeout=timeout, ps=server)
                except _err.MismatchError as err:
                    # Every rank got MISMATCH from the same set-up check: all are here.
                    mine = [(e.key, e.shape, e.spec, _gm.strategy_name(e.strategy)) for e in ps]
                    gathered = _gm.allgather_object(mine, gcomm, timeout)
                    detail = _first_difference(gathered, "gradcomp: the ranks' settings differ")
                    raise _err.MismatchError(f"{detail or 'gradcomp: the ranks differ'} ({err})",
                                             status=_err.E_MISMATCH, status_name="GCOMP_E_MISMATCH") from err
                buckets.append(b)
        except BaseException:
            for b in buckets:
                b.mpi.close()
            raise
        return buckets

    @staticmethod
    def _gc_groups(optimizer, plan, movable=()):
        """The wrapped optimizer's groups, copied; parameters whose compressor keeps the
        momentum (DGC) go to a sibling group without momentum.  For `movable` parameters
        (ids; an adaptive method may switch them between DGC and other specs) both groups
        exist from the start, even empty, so that a switch moves the parameter without
        changing the groups a scheduler knows.  Returns (groups, {id(param): (index of the
        group with momentum, index of the one without)} for the movable ones)."""
        dgc = {id(e.param) for e in plan if _spec_keeps_momentum(e.spec)}
        groups, pairs = [], {}
        for g in optimizer.param_groups:
            opts = {k: v for k, v in g.items() if k != "params"}
            ps = list(g["params"])
            own = [p for p in ps if id(p) in dgc]
            mov = [p for p in ps if id(p) in movable]
            if (own or mov) and opts.get("momentum", 0):
                rest = [p for p in ps if id(p) not in dgc]
                with_mom = None
                if rest or mov:
                    groups.append(dict(opts, params=rest))
                    with_mom = len(groups) - 1
                no_mom = dict(opts, params=own, momentum=0.0)
                if "nesterov" in no_mom:
                    no_mom["nesterov"] = False
                if "dampening" in no_mom:
                    no_mom["dampening"] = 0.0
                groups.append(no_mom)
                for p in mov:
                    pairs[id(p)] = (with_mom, len(groups) - 1)
            else:
                groups.append(dict(opts, params=ps))
        return groups, pairs

    @staticmethod
    def _gc_hook(wself, e):
        acc = e.param.expand_as(e.param).grad_fn.next_functions[0][0]

        def hook(*_):
            self = wself()
            if self is not None and not self._gc_closed:
                self._gc_ready(e)

        # The node must outlive this call: a tensor holds its AccumulateGrad weakly.
        return acc, acc.register_hook(hook)

    # -- the step --
    def _gc_ready(self, e):
        i = e.index
        if self._gc_delay[i] <= 0:
            raise AssertionError(
                f"gradcomp: parameter {e.key!r} got more than backward_passes_per_step="
                f"{self._gc_passes} gradients before step() or synchronize(); raise "
                "backward_passes_per_step to accumulate more passes locally")
        self._gc_delay[i] -= 1
        self._gc_fired += 1
        self._gc_synced = False
        if self._gc_delay[i] == 0:
            b = e.bucket
            b.pending -= 1
            if b.pending == 0:
                self._gc_start(b)
        # Keep the transfers in flight moving.  An error (a NaN found by a peer, a timeout)
        # is kept for synchronize(): raised here it would leave backward half done on this
        # rank, with later buckets never started, while the peers wait for them.
        still = []
        for b in self._gc_inflight:
            try:
                if not b.mpi.test():
                    still.append(b)
            except _err.Error as err:
                b.error = err
        self._gc_inflight = still

    def _gc_start(self, b):
        b.started = True
        try:
            grads = []
            for e in b.params:
                g = e.param.grad
                if g is None:  # no gradient this step (an unused parameter): zeros, as Horovod
                    with torch.no_grad():
                        g = e.param.grad = torch.zeros_like(e.param)
                elif g.dtype != _F32 or g.layout != torch.strided or not g.is_contiguous():
                    raise TypeError(f"gradcomp: gradient of {e.key!r} must be a contiguous float32 tensor, got "
                                    f"{g.dtype} {g.layout}{'' if g.is_contiguous() else ' (not contiguous)'}")
                grads.append(g)
            if self._gc_epoch is None:
                for e in b.params:
                    if e.spec and _core.warmup_epochs(e.spec) > 0:
                        raise _core.no_epoch_error("gradcomp", e.key, e.spec, "optimizer.set_epoch")
            if self._gc_ps is not None:
                self._gc_session = True
            if self._gc_adapt is not None:
                self._gc_observe(b, grads)
            b.mpi.start(grads, self._gc_op)
        except (_err.Error, TypeError, ValueError) as err:
            b.error = err
            return
        self._gc_inflight.append(b)

    def _gc_observe(self, b, grads):
        """The controllers see each managed gradient, with what its compressor holds back,
        before the exchange compresses it (the vector the codec will see).  A failure is
        kept for synchronize(): raised here it would leave this bucket unstarted."""
        ad = self._gc_adapt
        h = ad._handle()
        bh = b.mpi._handle()
        lib = _core._lib
        for e, g in zip(b.params, grads):
            if not e.adapt:
                continue
            c = _gm._lib.gcomp_mpi_compressor(bh, e.slot)
            rp = lib.gcomp_compressor_residual(c) if c else None
            st = lib.gcomp_adapt_observe(h, e.index, g.data_ptr(), ctypes.cast(rp, ctypes.c_void_p) if rp else None)
            # NaN/Inf: the library kept nothing of it, and the exchange raises NonFiniteError
            # on every rank
            if st and st != _err.E_NONFINITE and self._gc_adapt_error is None:
                try:
                    _core._raise(st, f"gradcomp: adaptive controllers observing {e.key!r}")
                except _err.Error as err:
                    self._gc_adapt_error = err

    def synchronize(self):
        """Finishes this step's exchange: starts the buckets not started yet (gradients
        that never arrived count as zeros), waits for all, and leaves each p.grad holding
        the average over ranks.  Called by step(); call it yourself to clip or inspect
        the averaged gradients, then step() inside skip_synchronize().  Idempotent until
        the next backward or step().  A rank whose backward did not run takes part with
        zeros.  Raises the exchange's error on every rank (the pending ones are
        still waited for, so the next step starts clean).  With an adaptive method it also
        ends the controllers' step (a failed exchange does not count)."""
        self._gc_check_open()
        # Not "nothing fired here": a rank whose backward never ran (no batch, a skipped
        # loss) would return at once while the others wait, and start its next backward's
        # exchange against their pending one, silently a step apart.  Like Horovod it takes
        # part with zeros.
        if self._gc_synced:
            return
        self._gc_synced = True
        t0 = time.perf_counter_ns()
        codec0 = self._gc_codec_ns() if self._gc_adapt is not None else 0
        for b in self._gc_buckets:
            if not b.started:
                self._gc_start(b)
        # All at once: each bucket's next round trip goes out as soon as its last is in.
        waiting = [b for b in self._gc_buckets if b.error is None and b.mpi.in_flight]
        for b, err in zip(waiting, _gm.wait_all([b.mpi for b in waiting], self._gc_timeout)):
            b.error = err
        first = next((b.error for b in self._gc_buckets if b.error is not None), None)
        if first is None:
            first = self._gc_unplanned_error()
        self._gc_wait_ns += time.perf_counter_ns() - t0
        self._gc_inflight = []
        for b in self._gc_buckets:
            b.started, b.error = False, None
            b.pending = len(b.params)
        self._gc_delay = [self._gc_passes] * len(self._gc_params)
        self._gc_fired = 0
        observe_error, self._gc_adapt_error = self._gc_adapt_error, None
        if first is not None:
            self._gc_mark = None  # this step's time is no measure of compute
            raise first
        self._gc_steps += 1
        self._gc_count_messages()
        if self._gc_adapt is not None:
            self._gc_end_step(t0, codec0)
            if observe_error is not None:
                raise observe_error

    def _gc_unplanned_error(self):
        for gi, pi, p in self._gc_unplanned:
            if p.grad is not None and p.requires_grad:
                return _err.ArgumentError(
                    f"gradcomp: param_groups[{gi}]['params'][{pi}] (shape {tuple(p.shape)}) needed no "
                    "gradient when the DistributedOptimizer was built and has one now: its gradient "
                    "would be this rank's own, never averaged.  Build the DistributedOptimizer again "
                    "after unfreezing",
                    status=_err.E_ARG, status_name="GCOMP_E_ARG")
        return None

    # -- adaptive methods --
    def _gc_codec_ns(self):
        return sum(b.mpi.stats()["codec_ns"] for b in self._gc_buckets)

    def _gc_end_step(self, t0, codec0):
        """After a successful exchange: the controllers' step ends (every rank alike)."""
        if self._gc_due:  # step() never ran after the last due step: decide now, between steps
            self._gc_decide()
        self._gc_fb_s = None
        if self._gc_mark is not None:
            # forward + backward: from the end of the last step() to this synchronize, less
            # the compression the buckets did meanwhile (the cost model counts it apart)
            t_end, c_end = self._gc_mark
            codec = max(codec0 - c_end, 0)
            self._gc_fb_s = max((t0 - t_end - codec) * 1e-9, 0.0)
            self._gc_mark = None  # once: synchronize() without step() measures nothing
        self._gc_adapt_step += 1
        self._gc_due = self._gc_adapt.end_step()

    def _gc_after_step(self, opt_s):
        """After the wrapped optimizer's step: this step's compute, and the decision when
        one is due (so a tensor's momentum moves between two optimizer steps)."""
        ad = self._gc_adapt
        # the norm controller's decay rule: the rate as the loop has it now (a scheduler
        # stepped after this step shows its decay at the next decision)
        ad.observe_lr(self.param_groups[0]["lr"])
        if self._gc_fb_s is not None:
            fb = self._gc_fb_s
            if self._gc_fb_filter.accept(fb):  # the span also holds what the loop did between steps
                ad.observe_compute(fb / 3, fb - fb / 3, opt_s)  # the split `gradcomp plan` uses
            self._gc_fb_s = None
        if self._gc_due:
            self._gc_decide()
        self._gc_mark = (time.perf_counter_ns(), self._gc_codec_ns())

    def _gc_decide(self):
        """One decision with every rank: the link probe when the bandwidth controller asks
        for one (Adapt.link_due: spaced by what probing costs), the collective decision,
        then the retunes, in tensor order."""
        self._gc_due = False
        ad = self._gc_adapt
        if self._gc_probe and ad.link_due():
            t0 = time.perf_counter()
            bw, lat = self._gc_comm.link_probe(self._gc_probe, self._gc_timeout)
            ad.observe_link(bw, lat)  # one rank: 0, ignored
            ad.observe_link_time(time.perf_counter() - t0)
        self._gc_comm.adapt_decide(ad, self._gc_timeout)
        self._gc_apply_specs()

    def _gc_apply_specs(self):
        """Retunes every managed tensor whose bucket runs another spec than the controllers
        chose: those the decision changed, and any a failed retune or a checkpoint left
        behind.  Same order, same specs on every rank."""
        ad = self._gc_adapt
        for e in self._gc_params:
            if not e.adapt:
                continue
            want = _core.canonical(ad.spec(e.index))
            if want != e.spec:
                self._gc_retune(e, want)
                self._gc_history.append((self._gc_adapt_step, e.key, want))

    def _gc_retune(self, e, spec):
        b = e.bucket
        keeps_before = _spec_keeps_momentum(e.spec)
        b.mpi.retune(e.slot, spec, self._gc_timeout)
        e.spec = spec
        # the per-tensor byte counter goes on across strategies: count from here
        self._gc_sent_before[(b.index, e.slot)] = b.mpi.stats(e.slot)["bytes_sent"]
        keeps = _spec_keeps_momentum(spec)
        if keeps != keeps_before:
            self._gc_move_momentum(e, keeps)

    def _gc_move_momentum(self, e, to_compressor):
        """The tensor's momentum moves between the optimizer and its compressor (DGC): the
        parameter changes group.  Into DGC, the optimizer's buffer still owes the weights
        m*buf + m^2*buf + ... (9 steps' worth at m = 0.9): it leaves the optimizer's state
        and is applied as it decays, a step at a time (_gc_apply_tails), until m^k < 2^-24.
        Back out of DGC, the optimizer's momentum starts from such a tail if one is still
        running, else from zero: what DGC held back went into the new spec's residual,
        converted (gcomp_compressor_retune).  The rule of `gradcomp train`."""
        pair = self._gc_pairs.get(id(e.param))
        if pair is None:  # its group has no momentum: nothing to move
            return
        src, dst = (pair[0], pair[1]) if to_compressor else (pair[1], pair[0])
        gs, gd = self.param_groups[src], self.param_groups[dst]
        if not any(p is e.param for p in gs["params"]):
            return
        gs["params"] = [p for p in gs["params"] if p is not e.param]
        gd["params"] = sorted(gd["params"] + [e.param], key=lambda p: self._gc_order[id(p)])
        buf = self.state[e.param].pop("momentum_buffer", None) if e.param in self.state else None
        tail = self._gc_tails.pop(id(e.param), None)
        if to_compressor:
            m = float(gs.get("momentum", 0))
            if buf is not None and 0 < m < 1:
                self._gc_tails[id(e.param)] = [e.param, buf, math.ceil(-24 * math.log(2) / math.log(m))]
        elif tail is not None:
            self.state[e.param]["momentum_buffer"] = tail[1]

    @torch.no_grad()
    def _gc_apply_tails(self):
        """One step of every released momentum buffer's tail: buf *= m, then the update
        torch.optim.SGD makes from a buffer with no new gradient (lr * buf; Nesterov:
        lr * m * buf; the sign of `maximize`), with the momentum group's m and options and
        the lr of the group the parameter steps in now."""
        for key, tail in list(self._gc_tails.items()):
            p, buf, _ = tail
            pair = self._gc_pairs[key]
            gm, gp = self.param_groups[pair[0]], self.param_groups[pair[1]]
            m = float(gm["momentum"])
            buf.mul_(m)
            a = float(gp["lr"]) * (m if gm.get("nesterov") else 1.0)
            p.add_(buf, alpha=a if gm.get("maximize") else -a)
            tail[2] -= 1
            if tail[2] <= 0:
                del self._gc_tails[key]

    @property
    def adapt(self):
        """The controllers of an adaptive method (a gradcomp.Adapt: ladder, interval,
        report, ...), else None.  Read it; the optimizer observes, ends steps and decides."""
        return self._gc_adapt

    def specs(self):
        """Every parameter's spec now, {name: canonical spec} (an adaptive method changes
        them at its decisions)."""
        return {e.key: e.spec for e in self._gc_params}

    def adapt_history(self):
        """Every setting of the tensors an adaptive method manages, in order: a list of
        (step, name, spec), step being the steps the controllers had counted when the spec
        took effect (0: the first decision).  Empty for other methods."""
        return list(self._gc_history)

    def observe_metric(self, value):
        """A validation metric for the accuracy controller (accuracy as a fraction, higher
        is better; its mean over ranks is what it steers by).  No-op for other methods."""
        if self._gc_adapt is not None:
            self._gc_adapt.observe_metric(value)

    def set_course(self, progress, metric):
        """The accuracy controller's reference curve (gradcomp.Adapt.set_course).  No-op
        for other methods."""
        if self._gc_adapt is not None:
            self._gc_adapt.set_course(progress, metric)

    def observe_link(self, bandwidth, latency):
        """This rank's link for the bandwidth controller (payload bytes/s each way, one-way
        latency in s), when it is measured outside (probe_bytes=0); the latest of an
        interval counts.  No-op for other methods."""
        if self._gc_adapt is not None:
            self._gc_adapt.observe_link(bandwidth, latency)

    def _gc_count_messages(self):
        # What this rank's codecs produced this step: message lengths, or for tensors that
        # travel by allreduce (dense, PowerSGD's factors) the reduced buffer, recovered from
        # the ring volume 2(P-1)/P the library counts - as `gradcomp train` counts.
        nr = self._gc_comm.size
        for b in self._gc_buckets:
            m = b.mpi
            for i in range(len(b.params)):
                if m.strategy_value(i) & 0xFF == _gm.ALLREDUCE:
                    sent = m.stats(i)["bytes_sent"]
                    key = (b.index, i)
                    step = sent - self._gc_sent_before.get(key, 0)
                    self._gc_sent_before[key] = sent
                    self._gc_msg_bytes += step * nr / (2.0 * (nr - 1)) if nr > 1 else 4.0 * m.tensors[i].n
                else:
                    self._gc_msg_bytes += m.message_bytes(i)

    @contextlib.contextmanager
    def skip_synchronize(self):
        """step() inside this block does not synchronize (you called synchronize())."""
        self._gc_should_sync = False
        try:
            yield
        finally:
            self._gc_should_sync = True

    def step(self, closure=None):
        """synchronize(), then the wrapped optimizer's step.  A closure is evaluated once,
        before the exchange (its backward feeds the buckets)."""
        self._gc_check_open()
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._gc_should_sync:
            self.synchronize()
        self._gc_synced = False  # the next step exchanges again, backward or not
        t0 = time.perf_counter()
        super().step()
        if self._gc_tails:
            self._gc_apply_tails()
        if self._gc_adapt is not None:
            self._gc_after_step(time.perf_counter() - t0)
        return loss

    def _gc_pending(self):
        return self._gc_fired or any(b.started for b in self._gc_buckets)

    def zero_grad(self, set_to_none=False):
        if self._gc_pending():
            raise AssertionError("gradcomp: zero_grad() was called after backward() but before step() "
                                 "or synchronize(): the exchange of those gradients is still in flight")
        return super().zero_grad(set_to_none)

    # -- schedules and statistics --
    def set_epoch(self, epoch):
        """Fractional epoch for the compressors' schedules (DGC warm-up), before a step.  A
        spec with warmup= refuses to start (ArgumentError) until it has been called once."""
        self._gc_check_open()
        self._gc_epoch = float(epoch)
        for b in self._gc_buckets:
            b.mpi.set_epoch(self._gc_epoch)

    def stats(self):
        """Counters since creation or reset_stats(), this rank: steps; bytes_sent and
        bytes_received (what the library handed to MPI, all buckets); message_bytes (what
        the codecs produced: gradient bytes / message_bytes is the compression ratio);
        dense_bytes (float32 bytes of the exchanged gradients); codec_ns, wire_ns,
        overlap_ns (library timers, summed over buckets); wait_ns (time in synchronize)."""
        out = dict(steps=self._gc_steps, bytes_sent=0, bytes_received=0, codec_ns=0, wire_ns=0, overlap_ns=0,
                   message_bytes=int(self._gc_msg_bytes), wait_ns=self._gc_wait_ns,
                   dense_bytes=self._gc_steps * sum(b.nbytes for b in self._gc_buckets))
        for b in self._gc_buckets:
            s = b.mpi.stats()
            for k in ("bytes_sent", "bytes_received", "codec_ns", "wire_ns", "overlap_ns"):
                out[k] += s[k]
        return out

    def reset_stats(self):
        for b in self._gc_buckets:
            b.mpi.reset_stats()
        self._gc_steps, self._gc_msg_bytes, self._gc_wait_ns = 0, 0.0, 0
        self._gc_sent_before = {}

    def layout(self):
        """One entry per parameter: (bucket, name, shape, spec, strategy actually used)."""
        out = []
        for b in self._gc_buckets:
            for i, e in enumerate(b.params):
                out.append((b.index, e.key, e.shape, e.spec, b.mpi.strategy(i)))
        return out

    @property
    def communicator(self):
        return self._gc_comm

    # -- the parameter server (strategy="ps") --
    @property
    def parameter_server(self):
        """The ParameterServer given as ps=, or None."""
        return self._gc_ps

    def _gc_need_ps(self, what):
        self._gc_check_open()
        if self._gc_ps is None:
            raise ValueError(f"gradcomp: {what}() is for a DistributedOptimizer with ps=ParameterServer(...)")
        return self._gc_ps

    def serve(self, timeout=None):
        """Server ranks (strategy="ps"): answers the workers' pushes of every bucket until
        every worker has called shutdown() or close(), then returns (ParameterServer.serve).
        timeout: None for the optimizer's.  Raises ArgumentError on a worker,
        CollectiveTimeout when a worker stops pushing in the middle of a round."""
        self._gc_need_ps("serve").serve(timeout or self._gc_timeout)

    def shutdown(self, timeout=None):
        """Worker ranks (strategy="ps"): ends this worker's session with the servers (call
        it after the last step; close() does when it was not called).  A step after it
        starts the next session, which the servers serve with another serve().  Raises
        ArgumentError on a server, ProtocolError between backward() and step()."""
        ps = self._gc_need_ps("shutdown")
        if self._gc_pending():
            raise _err.ProtocolError("gradcomp: shutdown() between backward() and step(): the exchange is still "
                                     "in flight", status=_err.E_PROTOCOL, status_name="GCOMP_E_PROTOCOL")
        ps.shutdown(timeout or self._gc_timeout)
        self._gc_session = False

    # -- checkpoints --
    def _wrapped_state_dict(self):
        return super().state_dict()

    def _wrapped_load_state_dict(self, sd):
        return super().load_state_dict(sd)

    def state_dict(self):
        """The wrapped optimizer's state_dict plus, under "gradcomp", this rank's bucket
        states (and, for an adaptive method, every tensor's spec, the method, the
        controllers' step count, the settings' history, the released momentum tails and
        the controllers' own state, gcomp_adapt_save_state).  Between steps only (ProtocolError
        while an exchange is in flight)."""
        self._gc_check_open()
        if self._gc_pending():
            raise _err.ProtocolError("gradcomp: state_dict() between backward() and step(): save between "
                                     "steps", status=_err.E_PROTOCOL, status_name="GCOMP_E_PROTOCOL")
        sd = super().state_dict()
        sd["gradcomp"] = {
            "version": 1,
            "rank": self._gc_comm.rank,
            "size": self._gc_comm.size,
            "layout": [[e.key for e in b.params] for b in self._gc_buckets],
            "specs": [[e.spec for e in b.params] for b in self._gc_buckets],
            "buckets": [b.mpi.state_bytes() for b in self._gc_buckets],
            "epoch": self._gc_epoch,
            "steps": self._gc_steps,
        }
        if self._gc_ps is not None:  # what a server keeps beyond compressors (its last sums)
            sd["gradcomp"]["ps"] = [self._gc_ps.save_state(b.mpi) for b in self._gc_buckets]
        if self._gc_adapt is not None:
            keys = {id(e.param): e.key for e in self._gc_params}
            sd["gradcomp"]["adapt"] = {"method": self._gc_adapt.method, "step": self._gc_adapt_step,
                                       "history": list(self._gc_history),
                                       "controllers": self._gc_adapt.save_state(),
                                       "tails": {keys[k]: [t[1].clone(), t[2]] for k, t in self._gc_tails.items()}}
        return sd

    def load_state_dict(self, state_dict):
        """Loads a state_dict() saved by this rank.  The bucket states are checked (layout,
        rank, number of ranks, each blob by the library) and loaded first; on any error
        nothing changes.  Adaptive methods: the buckets are first retuned to the specs
        saved (collective when a switch is structural: every rank loads at the same
        point), so each tensor goes on with the setting and state it had, and the
        controllers' own state is loaded (a state saved before it was kept restarts them
        from their first decision)."""
        self._gc_check_open()
        sd = dict(state_dict)
        g = sd.pop("gradcomp", None)
        # What torch checks of its own part, checked before any of gradcomp's is loaded, so
        # that a refusal there changes nothing either.  (An adaptive method moves parameters
        # between its groups, which the load moves back: only their count is fixed.)
        mine, theirs = self.param_groups, sd.get("param_groups")
        if not isinstance(theirs, (list, tuple)) or len(theirs) != len(mine):
            raise ValueError("gradcomp: load_state_dict: the state has "
                             f"{len(theirs) if isinstance(theirs, (list, tuple)) else 'no'} parameter groups, "
                             f"this optimizer {len(mine)}; nothing was loaded")
        if self._gc_adapt is None and any(len(a["params"]) != len(b.get("params", ())) for a, b in zip(mine, theirs)):
            raise ValueError("gradcomp: load_state_dict: a parameter group of the state has another size than "
                             "this optimizer's; nothing was loaded")
        # An adaptive method moves parameters between its groups: their total is fixed.
        if self._gc_adapt is not None and (
                not all(isinstance(b, dict) and isinstance(b.get("params"), (list, tuple)) for b in theirs)
                or sum(len(a["params"]) for a in mine) != sum(len(b["params"]) for b in theirs)):
            raise ValueError("gradcomp: load_state_dict: the state's parameter groups hold another number of "
                             "parameters than this optimizer's; nothing was loaded")
        if g is not None:
            self._gc_load(g)
        super().load_state_dict(sd)

    def _gc_load(self, g):
        def fail(msg, cls=_err.StateError, st=_err.E_STATE):
            raise cls(f"gradcomp: load_state_dict: {msg}", status=st, status_name=_core.status_name(st))

        if not isinstance(g, dict) or g.get("version") != 1:
            fail(f"unknown gradcomp state version {g.get('version') if isinstance(g, dict) else g!r}")
        if g["size"] != self._gc_comm.size or g["rank"] != self._gc_comm.rank:
            fail(f"saved by rank {g['rank']} of {g['size']}, loaded on rank {self._gc_comm.rank} of "
                 f"{self._gc_comm.size}: each rank loads its own state", _err.MismatchError, _err.E_MISMATCH)
        mine = [[e.key for e in b.params] for b in self._gc_buckets]
        if g["layout"] != mine or len(g["buckets"]) != len(self._gc_buckets):
            fail("saved for another bucket layout (model, bucket_bytes or parameter order differ)",
                 _err.MismatchError, _err.E_MISMATCH)
        saved_adapt = g.get("adapt")
        ours = self._gc_adapt.method if self._gc_adapt is not None else None
        theirs = saved_adapt.get("method") if isinstance(saved_adapt, dict) else None
        if ours != theirs:
            fail(f"saved with compression {'adaptive method ' + repr(theirs) if theirs else 'not adaptive'}, "
                 f"this optimizer runs {'adaptive method ' + repr(ours) if ours else 'no adaptive method'}",
                 _err.MismatchError, _err.E_MISMATCH)
        specs = None
        if ours is not None:
            specs = g.get("specs")
            if not isinstance(specs, list) or [len(x) for x in specs] != [len(b.params) for b in self._gc_buckets]:
                fail("the adaptive state has no spec for every tensor")
            for b, bs in zip(self._gc_buckets, specs):
                for e, sp in zip(b.params, bs):
                    if not e.adapt and sp != e.spec:
                        fail(f"parameter {e.key!r} was saved with spec {sp!r}, this optimizer gives it {e.spec!r} "
                             "(another layer policy)", _err.MismatchError, _err.E_MISMATCH)
            # the fields applied after the buckets load: checked now, so that a malformed
            # one is refused before anything changes
            st_ = saved_adapt.get("step", 0)
            if not isinstance(st_, int) or isinstance(st_, bool) or st_ < 0:
                fail(f"the adaptive state's step {st_!r} is not a count")
            hist = saved_adapt.get("history", [])
            if not isinstance(hist, (list, tuple)) or not all(
                    isinstance(x, (list, tuple)) and len(x) == 3 for x in hist):
                fail("the adaptive state's history is not a list of (step, name, spec)")
            tails = saved_adapt.get("tails") or {}
            if not isinstance(tails, dict) or not all(
                    isinstance(v, (list, tuple)) and len(v) == 2 and isinstance(v[0], torch.Tensor)
                    and isinstance(v[1], int) for v in tails.values()):
                fail("the adaptive state's momentum tails are not (tensor, steps left) pairs")
        if self._gc_pending():
            fail("called between backward() and step()", _err.ProtocolError, _err.E_PROTOCOL)
        ps = self._gc_ps
        if (ps is not None) != ("ps" in g):
            fail("saved with a parameter server, loaded without one" if "ps" in g else
                 "saved without a parameter server, loaded with one", _err.MismatchError, _err.E_MISMATCH)
        if ps is not None and len(g["ps"]) != len(self._gc_buckets):
            fail(f"{len(g['ps'])} parameter-server states for {len(self._gc_buckets)} buckets")
        # Adaptive methods: first the specs saved (a bucket loads a state only with the specs
        # it was saved with); then each bucket's compressors, then (strategy="ps") what its
        # server keeps beyond them.  On any error, the specs and what was loaded already are
        # put back (best effort) and the error is raised.
        steps = [(b.mpi.load_state, blob, b.mpi.state_bytes()) for b, blob in zip(self._gc_buckets, g["buckets"])]
        if ps is not None:
            steps += [(functools.partial(ps.load_state, bucket=b.mpi), blob, ps.save_state(b.mpi))
                      for b, blob in zip(self._gc_buckets, g["ps"])]
        before_specs = [(e, e.spec) for e in self._gc_params]
        done = 0
        try:
            if specs is not None:
                for b, bs in zip(self._gc_buckets, specs):
                    for e, sp in zip(b.params, bs):
                        if sp != e.spec:
                            self._gc_retune(e, sp)
            for load, blob, _ in steps:
                load(blob)
                done += 1
            if ours is not None and saved_adapt.get("controllers") is not None:
                self._gc_adapt.load_state(saved_adapt["controllers"])  # all or nothing
        except BaseException:
            try:  # best effort: back to the specs and states before
                for e, sp in before_specs:
                    if e.spec != sp:
                        self._gc_retune(e, sp)
                for load, _, old in steps[:done]:
                    load(old)
            except _err.Error:
                pass
            raise
        if ours is not None:
            # the released momentum tails as saved (a retune above may have started others
            # from this optimizer's own buffers)
            by_key = {e.key: e.param for e in self._gc_params}
            self._gc_tails = {}
            for k, (buf, left) in (saved_adapt.get("tails") or {}).items():
                if k in by_key and int(left) > 0:
                    p = by_key[k]
                    self._gc_tails[id(p)] = [p, buf.to(device=p.device, dtype=p.dtype).clone(), int(left)]
            self._gc_adapt_step = int(saved_adapt.get("step", 0))
            self._gc_history = [tuple(x) for x in saved_adapt.get("history", [])]
            self._gc_due = False
        self._gc_steps = g.get("steps", 0)
        if g.get("epoch") is not None:
            self.set_epoch(g["epoch"])

    # -- lifetime --
    def _gc_check_open(self):
        if self._gc_closed:
            raise ValueError("gradcomp: this DistributedOptimizer is closed")

    def close(self):
        """Removes the hooks and frees the buckets (and the communicator it made).  An
        exchange still in flight is waited for first.  A parameter-server worker that has
        not called shutdown() shuts down here (errors ignored: the servers' serve() then
        reports them); the ParameterServer itself is the caller's to close."""
        if getattr(self, "_gc_closed", True):
            return
        self._gc_closed = True
        for _, h in self._gc_hooks:
            h.remove()
        self._gc_hooks = []
        if self._gc_session and self._gc_ps._h and not self._gc_comm.failed:
            try:
                for b in self._gc_buckets:
                    if b.mpi.in_flight:
                        b.mpi.wait(self._gc_timeout)
                self._gc_ps.shutdown(self._gc_timeout)
            except _err.Error:
                pass
            self._gc_session = False
        for b in self._gc_buckets:
            b.mpi.close()
        if self._gc_adapt is not None:
            self._gc_adapt.close()
        if self._gc_owns_comm:
            self._gc_comm.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def DistributedOptimizer(optimizer, named_parameters=None, compression="none", strategy="auto",
                         backward_passes_per_step=1, timeout=None, setup_timeout=None, bucket_bytes=None,
                         pipeline_bytes=None, comm=None, op="average", total_steps=None, probe_bytes=None,
                         ps=None):
    """Wraps `optimizer` so that step() uses gradients averaged over MPI ranks, compressed.

    Collective: every rank builds it with the same model, settings and order.
      optimizer      a torch.optim optimizer over CPU float32 parameters; the returned
                     object replaces it (same class, groups and state; make LR schedulers
                     on the returned one).
      named_parameters  model.named_parameters(): names for specs, policies, messages and
                     errors, and the registration order buckets follow in reverse.  None:
                     "param.<i>" in the optimizer's order.
      compression    a spec, a C policy string, a LayerPolicy or a callable (name, shape) ->
                     spec or None (see the module docstring), or an adaptive method
                     "adapt:..." (docs/ADAPTIVE.md).  Default "none": dense f32.
      strategy       "auto", "allgather", "sparse", "allreduce", "rsag", "hierarchical",
                     "hierarchical:NAME" for the compressed tensors (include/gradcomp_mpi.h);
                     for an adaptive method, for the tensors its controllers manage; "ps"
                     or "hierarchical:ps" with ps= (every tensor, then; not adaptive).
      backward_passes_per_step  backward passes accumulated locally (summed in p.grad)
                     before the exchange, as in Horovod.
      timeout        seconds any exchange may take before CollectiveTimeout (None: 300).
      setup_timeout  the bound of this constructor's collectives (None: max(timeout, 300 s);
                     ranks reach it at different times: imports, data loading).
      bucket_bytes   float32 bytes per bucket (None: 4 MiB; 0: one bucket per parameter).
      pipeline_bytes the library's sub-bucket size inside a bucket (None: 4 MiB).
      comm           an mpi4py communicator (None: COMM_WORLD) or a gradcomp.mpi.Communicator
                     (e.g. with ranks_per_node for hierarchical tests).
      op             "average" (default) or "sum" over ranks.
      total_steps    adaptive methods: the run's length in steps, for interval=auto (the
                     run / 40 in 10..500); None or 0: unknown (100 steps between decisions).
      probe_bytes    adaptive methods with the bandwidth controller: the link probe at the
                     decisions that ask for one (gcomp_mpi_link_probe; None: 512 KiB, as
                     `gradcomp train`; 0: no probe, feed opt.observe_link yourself).
      ps             a gradcomp.mpi.ParameterServer, with strategy="ps" (or
                     "hierarchical:ps"): see below.  comm is then the server's (None or
                     ps.comm).  Not with an adaptive method (UnsupportedError).
    Raises MismatchError (ranks differ), SpecError (a bad spec or adaptive method),
    TypeError (not float32/CPU), UnsupportedError (an adaptive method through a parameter
    server), CollectiveTimeout / MPIError (a peer is gone).

    Through a parameter server (strategy="ps", ps=ParameterServer(comm) in sync aggregate
    mode: BytePS, the optimizer stays on the workers): every parameter is a key of the
    server (the compressed ones with their spec, the others dense), each worker pushes its
    compressed gradient and pulls the servers' average - the same floats as the allgather
    strategy on the workers alone.  Every rank, servers included, builds the optimizer with
    the same model (the buckets' set-up check covers the servers).  Workers then train as
    usual and call shutdown() after the last step (close() does it otherwise); server ranks
    call serve(), which returns once every worker has shut down:

        ps = gradcomp.mpi.ParameterServer(comm, servers=1)     # the last rank serves
        opt = DistributedOptimizer(opt, model.named_parameters(), compression=spec,
                                   strategy="ps", ps=ps)
        if ps.is_server:
            opt.serve()
        else:
            ...train: zero_grad, backward, opt.step()...
            opt.shutdown()
        opt.close(); ps.close()

    ParameterServers in update or async mode are refused (ValueError): their pulls are
    weights, which this optimizer would take for gradients.  Adaptive methods
    (compression="adapt:...") are refused with strategy="ps" (UnsupportedError on every
    rank): their decisions and retunes are collectives the serving servers cannot join,
    and the library has no retune of a server's keys.  state_dict() then also holds
    the server's part of each bucket (ParameterServer.save_state), so servers save theirs
    between serve() sessions.
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"expected a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if isinstance(optimizer, _DistributedMixin):
        raise TypeError("this optimizer is already a gradcomp DistributedOptimizer")
    base = optimizer.__class__
    cls = type(base.__name__, (_DistributedMixin, base), {"__module__": __name__})
    return cls(optimizer, named_parameters, compression, strategy, backward_passes_per_step, timeout,
               setup_timeout, bucket_bytes, pipeline_bytes, comm, op, total_steps, probe_bytes, ps)


# ---- making every rank start equal -------------------------------------------------------------


def _tensor_items(params):
    if isinstance(params, torch.nn.Module):
        params = params.state_dict()
    items = list(params.items()) if isinstance(params, dict) else list(params)
    out = []
    for name, t in items:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"broadcast_parameters: {name!r} is a {type(t).__name__}, not a tensor")
        if t.device.type != "cpu" or t.layout != torch.strided:
            raise TypeError(f"broadcast_parameters: {name!r} must be a dense CPU tensor")
        out.append((str(name), t))
    return out


def broadcast_parameters(params, root_rank=0, comm=None, timeout=None):
    """Copies root_rank's tensors into every other rank's, in place.

    params: model.state_dict(), model.named_parameters(), a dict or list of (name, tensor),
    or a module (its state_dict).  Collective; one MPI_Ibcast per tensor (any dtype, as
    bytes), all in flight together, bounded by `timeout` (None: 300 s).  Ranks whose lists
    differ (names, shapes, dtypes) all raise MismatchError before anything is copied."""
    import numpy as np

    items = _tensor_items(params)
    desc = [(n, tuple(t.shape), str(t.dtype)) for n, t in items]
    if not _gm.all_agree(repr(desc), comm, timeout):
        gathered = _gm.allgather_object([(n, s, d, "-") for n, s, d in desc], comm, timeout)
        msg = _first_difference(gathered, "broadcast_parameters: the ranks' tensors differ")
        raise _err.MismatchError(msg or "broadcast_parameters: the ranks' tensors differ",
                                 status=_err.E_MISMATCH, status_name="GCOMP_E_MISMATCH")
    c = _gm._mpi4py_comm(comm)
    reqs, copies = [], []
    for _, t in items:
        if t.numel() == 0:
            continue
        src = t.detach()
        buf = src if src.is_contiguous() else src.contiguous()
        arr = buf.reshape(-1).view(torch.uint8).numpy()
        reqs.append(c.Ibcast(np.ascontiguousarray(arr) if not arr.flags.c_contiguous else arr, root=root_rank))
        if buf is not src:
            copies.append((src, buf))
    _gm._wait_requests(reqs, timeout, "broadcast_parameters", (items, copies), c)
    for dst, buf in copies:
        with torch.no_grad():
            dst.copy_(buf)


def _bcast_bytes(data, root, comm, timeout):
    import numpy as np

    c = _gm._mpi4py_comm(comm)
    n = np.array([len(data) if data is not None else 0], np.int64)
    _gm._wait_requests([c.Ibcast(n, root=root)], timeout, "broadcast of a size", (n,), c)
    buf = np.frombuffer(bytearray(data), np.uint8) if c.Get_rank() == root else np.empty(int(n[0]), np.uint8)
    if buf.size:
        _gm._wait_requests([c.Ibcast(buf, root=root)], timeout, "broadcast of optimizer state", (buf,), c)
    return buf.tobytes()


def broadcast_optimizer_state(optimizer, root_rank=0, comm=None, timeout=None):
    """Copies root_rank's optimizer state (momentum buffers, step counts, hyper-parameters
    of every group) to every other rank.  For a DistributedOptimizer only the wrapped
    optimizer's part travels (bucket states are each rank's own).  Collective, bounded by
    `timeout`; a rank that cannot load it makes every rank raise."""
    if isinstance(optimizer, _DistributedMixin):
        save, load = optimizer._wrapped_state_dict, optimizer._wrapped_load_state_dict
        if comm is None:
            comm = optimizer.communicator
    else:
        save, load = optimizer.state_dict, optimizer.load_state_dict
    c = _gm._mpi4py_comm(comm)
    data = None
    if c.Get_rank() == root_rank:
        f = io.BytesIO()
        torch.save(save(), f)
        data = f.getvalue()
    blob = _bcast_bytes(data, root_rank, comm, timeout)
    error = None
    if c.Get_rank() != root_rank:
        try:
            load(torch.load(io.BytesIO(blob)))
        except Exception as e:
            error = repr(e)
    errors = _gm.allgather_object(error, comm, timeout)
    bad = [(r, m) for r, m in enumerate(errors) if m]
    if bad:
        raise _err.Error(f"broadcast_optimizer_state: rank {bad[0][0]} could not load rank {root_rank}'s "
                         f"state: {bad[0][1]}")
