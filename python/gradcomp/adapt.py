"""gradcomp.adapt - adaptive compression from Python (include/gradcomp.h, "Adaptive
compression"; docs/ADAPTIVE.md): the same method strings as `gradcomp train`,

    a = gradcomp.Adapt("adapt:norm;base=topk:density=0.001,feedback=ef",
                       [("fc1.weight", (1024, 784)), ("fc1.bias", (1024,)), ...],
                       total_steps=1000, workers=world)
    a.spec(i)                        # tensor i's spec now
    # every step, on every rank:
    a.observe(i, grad, residual)     # each tensor, before it is exchanged
    if a.end_step():                 # a decision is due
        mine = a.stats()             # float64 array, the same length on every rank
        every = all_gather(mine)     # yours: torch.distributed, mpi4py, ...
        for i in a.decide(every):    # rows in rank order; returns the tensors that changed
            compressors[i].retune(a.spec(i))

Every rank that decides on the same gathered rows takes the same decision (the library
combines them in rank order); a rank of another configuration makes decide raise
MismatchError.  gradcomp.torch's hook does all of this for "adapt:..." methods.
"""

import ctypes
import math
import operator

from . import _native
from . import core as _core
from . import errors as _err

_lib = _core._lib
_STRATEGY_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)


class _StepFilter:
    """Which measured steps count as compute for the bandwidth controller.  A caller that
    times the span between two exchanges (DistributedOptimizer, the DDP hook) also times
    whatever the training loop did there: an evaluation or a checkpoint every few hundred
    steps would weigh in the interval's mean as seconds of "compute" and hide transfers
    that do not hide.  A step over `factor` times the median of the latest `keep` accepted
    is left out (from the fourth on); `settle` such steps in a row are not an interruption
    but the step's new length (a larger batch, a slower phase, a co-tenant): they start the
    record over and count from then on."""

    def __init__(self, keep=16, factor=4.0, settle=8):
        self.keep, self.factor, self.settle = keep, factor, settle
        self._seen, self._high = [], []

    def accept(self, seconds):
        if not seconds > 0:
            return False
        seen = self._seen
        if len(seen) >= 3 and seconds > self.factor * sorted(seen)[len(seen) // 2]:
            self._high.append(seconds)
            if len(self._high) < self.settle:
                return False
            self._seen, self._high = self._high, []
            return True
        self._high = []
        seen.append(seconds)
        del seen[:-self.keep]
        return True


def _matrix(shape):
    shape = tuple(int(d) for d in shape)
    n = math.prod(shape) if shape else 1
    rows, cols = _core._matrix_shape(shape, n)
    return n, rows, cols


class Adapt:
    """Controllers for one model.  tensors: a list of (name, shape) in a fixed order, the
    same on every rank.  total_steps: the run's length (interval=auto scales with it; 0 if
    unknown); workers, nodes: the job's shape for the cost model; min_elements, dense_spec:
    the layer policy's defaults for keys the method leaves out; strategy: optional callable
    spec -> cost-model strategy number (gradcomp.h, gcomp_cost_strategy)."""

    def __init__(self, method, tensors, total_steps=0, workers=1, nodes=1, min_elements=0,
                 dense_spec=None, strategy=None):
        _core._needs("gcomp_adapt_create")
        self.method = method
        self.names = [str(n) for n, _ in tensors]
        if len(set(self.names)) != len(self.names):  # overrides and restores go by name
            seen = set()
            dup = next(n for n in self.names if n in seen or seen.add(n))
            raise ValueError(f"Adapt: two tensors are named {dup!r}; names must be unique")
        self.shapes = [tuple(int(d) for d in s) for _, s in tensors]
        self.numels = [math.prod(s) for s in self.shapes]  # what C reads of each gradient
        descs = (_native.TensorDesc * len(tensors))()
        self._names_b = [n.encode() for n in self.names]  # kept alive during create
        for i, (name, shape) in enumerate(zip(self._names_b, self.shapes)):
            n, rows, cols = _matrix(shape)
            descs[i] = _native.TensorDesc(name, n, rows, cols)
        o = _native.AdaptOptions()
        for what, v, hi in (("total_steps", total_steps, 2 ** 63), ("workers", workers, 2 ** 31),
                            ("nodes", nodes, 2 ** 31), ("min_elements", min_elements, 2 ** 63)):
            v = operator.index(v)  # 1.7 is a TypeError, not 1
            if not 0 <= v < hi:  # ctypes would wrap -1 around
                raise ValueError(f"Adapt: {what}={v} out of range (0 .. {hi - 1})")
            setattr(o, what, v)
        self._dense_b = _core._spec_bytes(dense_spec) if dense_spec else None
        o.dense_spec = self._dense_b
        self._cb = None
        if strategy is not None:
            def cb(ctx, spec):
                try:
                    return int(strategy(spec.decode()))
                except Exception:
                    return 0
            self._cb = _STRATEGY_FN(cb)
            o.strategy = ctypes.cast(self._cb, ctypes.c_void_p)
        h = ctypes.c_void_p()
        err = _native.ErrorInfo()
        mb = _core._spec_bytes(method)  # a NUL would cut the method short in C, silently
        st = _lib.gcomp_adapt_create(ctypes.byref(h), mb, descs, len(tensors), ctypes.byref(o),
                                     ctypes.byref(err))
        _core._check(st, f"adaptive method {method!r}", err)
        self._h = h
        self._len = _lib.gcomp_adapt_stats_size(h)

    def close(self):
        h, self._h = getattr(self, "_h", None), None
        if h:
            _lib.gcomp_adapt_free(h)

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def _handle(self):
        if not self._h:
            raise ValueError("adaptive controller is closed")
        return self._h

    def __len__(self):
        return len(self.names)

    def spec(self, i):
        """Tensor i's spec now (canonical)."""
        return _core._s(_lib.gcomp_adapt_spec(self._handle(), i))

    def managed(self, i):
        """Whether the controllers manage tensor i (the policy compresses it with base)."""
        return bool(_lib.gcomp_adapt_managed(self._handle(), i))

    def level(self, i):
        return _lib.gcomp_adapt_level(self._handle(), i)

    def uses(self, controller):
        return bool(_lib.gcomp_adapt_uses(self._handle(), controller.encode()))

    @property
    def ladder(self):
        h = self._handle()
        return [_core._s(_lib.gcomp_adapt_candidate(h, j)) for j in range(_lib.gcomp_adapt_ladder_size(h))]

    @property
    def fingerprint(self):
        """The configuration fingerprint the statistics carry: equal on every rank of one
        run (method, tensors, the options decisions read, course, exchange groups)."""
        return int(_lib.gcomp_adapt_fingerprint(self._handle()))

    @property
    def interval(self):
        return _lib.gcomp_adapt_interval(self._handle())

    @property
    def measure_interval(self):
        """Steps between measurements of every candidate, as resolved (auto included; with
        measure=auto the least spacing: report["next_measure_step"] is the next one)."""
        return _lib.gcomp_adapt_measure_interval(self._handle())

    def predicted(self):
        """bandwidth: the last decision's predicted step time of each ladder candidate,
        seconds (NaN before the first decision with a measured link)."""
        h = self._handle()
        return [_lib.gcomp_adapt_predicted(h, j) for j in range(_lib.gcomp_adapt_ladder_size(h))]

    @property
    def measuring(self):
        """True when this step measures every candidate (pass observe the residual)."""
        return bool(_lib.gcomp_adapt_measuring(self._handle()))

    def observe(self, i, grad, residual=None):
        """Tensor i's gradient this step (float32, n elements; not copied or kept), and
        optionally what its compressor holds back."""
        h = self._handle()
        n = self.numels[i]
        gp, _ = _core.float_buffer(grad, n, what="gradient")
        rp = None
        if residual is not None:
            rp, _ = _core.float_buffer(residual, n, what="residual")
        st = _lib.gcomp_adapt_observe(h, i, gp, rp)
        if st:
            _core._raise(st, f"adapt observe {self.names[i]}")

    def observe_compute(self, forward_s, backward_s, optimizer_s=0.0):
        _lib.gcomp_adapt_observe_compute(self._handle(), float(forward_s), float(backward_s),
                                         float(optimizer_s))

    def observe_link(self, bandwidth, latency):
        """This rank's link: payload bytes per second each way, one-way latency (s)."""
        _lib.gcomp_adapt_observe_link(self._handle(), float(bandwidth), float(latency))

    def observe_link_time(self, seconds):
        """The seconds this rank spent measuring its link for the coming decision: the
        slowest rank's figure spaces the probes (the bandwidth controller's probe_cost)."""
        _lib.gcomp_adapt_observe_link_time(self._handle(), float(seconds))

    def link_due(self):
        """Whether the decision now due should carry a fresh link measurement: the same on
        every rank.  Between probes the decisions use the last measured link."""
        return bool(_lib.gcomp_adapt_link_due(self._handle()))

    def observe_metric(self, value):
        """A validation metric to steer by (accuracy as a fraction)."""
        v = float(value)
        if not 0.0 <= v <= 1.0:  # NaN included; 50 for 50 % would steer the wrong way
            raise ValueError(f"observe_metric: {value!r} is not an accuracy as a fraction in "
                             "[0, 1] (give 0.5 for 50 %)")
        _lib.gcomp_adapt_observe_metric(self._handle(), v)

    def observe_lr(self, lr):
        """The learning rate of the coming steps (the same on every rank): the norm
        controller makes the interval after a decay (a fall by lr_drop, default 0.8: a /5
        or /10 step) critical.  The rate just used also works: a decay that falls on a
        decision's step is then seen one decision late."""
        _lib.gcomp_adapt_observe_lr(self._handle(), float(lr))

    def set_course(self, progress, metric):
        """The accuracy controller's course: a reference learning curve (e.g. a dense run's
        evaluations with the same schedule), progress the share of the run's steps done at
        each point (strictly increasing in (0, 1]) and metric the accuracy there as a
        fraction.  The course is that curve shifted to end at target; give the same points
        on every rank.  Empty sequences go back to the glide path."""
        np = _core._numpy()
        p = np.ascontiguousarray(progress, dtype=np.float64).ravel()
        m = np.ascontiguousarray(metric, dtype=np.float64).ravel()
        if p.size != m.size:
            raise ValueError(f"set_course: {p.size} progress values for {m.size} metrics")
        err = _native.ErrorInfo()
        st = _lib.gcomp_adapt_set_course(self._handle(), p.ctypes.data, m.ctypes.data, p.size,
                                         ctypes.byref(err))
        _core._check(st, "adapt set_course", err)

    def set_exchanges(self, groups, run_bytes=0):
        """How the caller's transport groups the tensors, for the bandwidth controller's
        predictions: groups[i] is tensor i's exchange group, 0 for a tensor sent alone; None
        goes back to a message a tensor.  run_bytes 0 (the DDP hook, which gives DDP's
        buckets): inside a group the tensors summed with one spec are predicted as one
        allreduce and the gathered ones as one allgather, wherever they sit, these
        exchanges side by side on the link.  run_bytes > 0
        (gcomp_mpi buckets, which DistributedOptimizer gives): only consecutive tensors of
        one strategy and spec, in backward order, runs of at most run_bytes of f32 gradient
        (gradcomp.mpi's bucket_bytes; None for no cap).  Give the same on every rank (they
        enter the configuration fingerprint: decide raises MismatchError otherwise); they
        are not part of save_state."""
        err = _native.ErrorInfo()
        run = ctypes.c_size_t(-1).value if run_bytes is None else operator.index(run_bytes)
        if run < 0:
            raise ValueError(f"set_exchanges: run_bytes must be >= 0 or None, got {run_bytes}")
        if groups is None:
            st = _lib.gcomp_adapt_set_exchanges(self._handle(), None, 0, 0, ctypes.byref(err))
        else:
            g = [operator.index(x) for x in groups]
            if any(not 0 <= x < 1 << 32 for x in g):
                raise ValueError("set_exchanges: groups are integers in [0, 2**32)")
            arr = (ctypes.c_uint * len(g))(*g)
            st = _lib.gcomp_adapt_set_exchanges(self._handle(), arr, len(g), run, ctypes.byref(err))
        _core._check(st, "adapt set_exchanges", err)

    def save_state(self):
        """This rank's state of the controllers (bytes; docs/FORMAT.md), taken between two
        steps: their decisions and memory, the course, and this rank's observations since
        the last statistics."""
        h = self._handle()
        cap = _lib.gcomp_adapt_state_bound(h)
        buf = ctypes.create_string_buffer(cap)
        n = ctypes.c_size_t()
        st = _lib.gcomp_adapt_save_state(h, buf, cap, ctypes.byref(n))
        if st:
            _core._raise(st, "adapt save_state")
        return buf.raw[:n.value]

    def load_state(self, blob):
        """Loads a save_state() blob of an Adapt with the same method, tensors and options;
        all or nothing (StateError, MismatchError, ... naming the cause)."""
        blob = bytes(blob)
        err = _native.ErrorInfo()
        st = _lib.gcomp_adapt_load_state(self._handle(), blob, len(blob), ctypes.byref(err))
        _core._check(st, "adapt load_state", err)

    def end_step(self):
        """Ends the step; True when a decision is due now (on every rank alike)."""
        due = ctypes.c_int()
        _lib.gcomp_adapt_end_step(self._handle(), ctypes.byref(due))
        return bool(due.value)

    def stats(self):
        """This rank's statistics since the last call (a float64 NumPy array of the same
        length on every rank of one configuration); starts a new interval."""
        np = _core._numpy()
        out = np.empty(self._len, np.float64)
        got = ctypes.c_size_t()
        _core._check(_lib.gcomp_adapt_stats(self._handle(), out.ctypes.data, self._len, ctypes.byref(got)),
                     "adapt stats")
        return out

    def decide(self, every):
        """Takes the decision from every rank's stats() (rows in rank order: a 2-D array,
        or a list of 1-D arrays).  Returns the indices of the tensors whose spec changed."""
        np = _core._numpy()
        rows = [np.asarray(r, dtype=np.float64).reshape(-1) for r in every]
        if any(r.size != self._len for r in rows):
            raise _err.MismatchError(
                f"gradcomp.adapt: statistics of {[r.size for r in rows]} doubles, this "
                f"configuration has {self._len}: ranks run different adaptive methods",
                status=_err.E_MISMATCH)
        flat = np.ascontiguousarray(np.concatenate(rows)) if rows else np.empty(0)
        changed = ctypes.c_size_t()
        err = _native.ErrorInfo()
        h = self._handle()
        _core._check(_lib.gcomp_adapt_decide(h, flat.ctypes.data, self._len, len(rows), ctypes.byref(changed),
                                             ctypes.byref(err)), "adaptive decision", err)
        return [i for i in range(len(self.names)) if _lib.gcomp_adapt_changed(h, i)]

    @property
    def report(self):
        """What the last decision saw (gcomp_adapt_report) as a dict."""
        r = _native.AdaptReport()
        _lib.gcomp_adapt_get_report(self._handle(), ctypes.byref(r))
        return {name: getattr(r, name) for name, _ in _native.AdaptReport._fields_}

    def __repr__(self):
        return f"gradcomp.Adapt({self.method!r}, {len(self.names)} tensors)"
