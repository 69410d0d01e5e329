"""gradcomp.torch - a PyTorch DDP communication hook that compresses gradients in C.

    hook, state = gradcomp.torch.hook("topk:density=0.01,feedback=ef", model=ddp_model)
    ddp_model.register_comm_hook(state, hook)

Per DDP bucket, each parameter's gradient (a view into the bucket's flat buffer) is
handled by one of three paths, chosen by the policy:
  * dense    - small and 1-D tensors (biases, norms), and those an adaptive method switched
               to plain fp32 from the step after the switch (that step's gathered
               message flushes what their compressor held back): one fp32 all_reduce
               for all of them;
  * gather   - every codec that makes a self-describing message (sparsifiers,
               quantizers): the messages of the bucket are encoded by C straight into one
               uint8 tensor, the per-message lengths are all-gathered (gloo in torch 1.13
               has no uneven all_gather), the byte tensors are all-gathered padded to the
               longest - or, where the encode bound is within 15 % of that (fixed-k
               sparsifiers, quantizers), in one asynchronous all_gather at the bound with
               the lengths inside, which saves a blocking round trip per bucket (see
               _gather_path) - and each rank's messages are decode-added by C into the gradient
               views with scale 1/world, rank 0 first, so every replica sums in the same
               order and stays bit-identical;
  * lowrank  - PowerSGD (Vogels et al., NeurIPS 2019) through the C protocol
               (gcomp_lowrank_*): C computes P = M Q, the bucket's P factors are summed
               with one all_reduce (the dense tensors ride along in it), C orthogonalises
               and computes Q = M^T P, the Qs are summed with a second all_reduce, and C
               writes the rank-r approximation P Q^T / world into the gradient.  Dense
               steps (start_iter=, tensors that would not shrink min_compression_rate
               times) join the fp32 all_reduce.
Every collective is submitted from the hook's own thread, in the same order on every
rank; only the last one of each path is asynchronous, and the callbacks that finish the
work (decoding, the final low-rank product) submit nothing.  Submitting collectives from
callbacks (as torch's own powerSGD_hook does) was rejected: callbacks run on gloo's
threads, so two ranks could submit two buckets' collectives in different orders.

State: one Compressor per parameter, keyed stably across steps by parameter name when the
model is known (hook(..., model=m)), else by order of first appearance (DDP calls the
hook for its buckets in index order, and the first step always sees the initial bucket
layout, so the order is the same in every process and after a restart; keys by position
in a bucket would break when DDP rebuilds its buckets after the first iteration).  At the
first step a parameter is seen, all ranks all-gather their spec fingerprints and shapes:
a difference raises MismatchError naming the parameter and both specs.  The state
pickles (every compressor's state_bytes, counters, policy; not the process group) so a
checkpoint resumes exactly where it stopped.

A rank that dies or stalls: every collective of the hook runs under the process group's
timeout (init_process_group(timeout=...)).  A closed connection (a rank that died) raises
CommunicatorFailed at once, a rank that does not answer CollectiveTimeout after the
timeout, both naming the step and bucket (or the link probe) and keeping gloo's words; DDP
re-raises either from backward() as a RuntimeError carrying that text.  The group cannot
be used again.

DGC (feedback=dgc or the dgc codec) keeps the momentum inside the compressor: give those
parameters an optimizer without momentum, and call state.set_epoch(epoch) every epoch
for its warm-up (include/gradcomp.h, gcomp_compressor_set_epoch).

Torch is imported here, not in gradcomp/__init__.py, so the core package works without it.
"""

import ctypes
import math
import operator
import re
import threading
import time

import torch
import torch.distributed as dist

from . import adapt as _adapt
from . import core as _core
from . import errors as _err

_F32 = torch.float32
_PROBE_BYTES = 512 << 10  # the link probe of an adaptive decision, as the C trainer's


def _is_policy_string(text):
    # A C policy is `key=value;...` whose first key has no ':'; a spec is `name[:k=v,...]`.
    head = text.split("=", 1)[0]
    return ";" in text or ("=" in text and ":" not in head)


class LayerPolicy:
    """The default policy: the C layer-wise policy (gcomp_policy, src/adapt/policy.c).

    LayerPolicy(spec, min_elements=1024, vectors=False, min_k=512) compresses a tensor with
    `spec` unless it has fewer than `min_elements` elements or is 1-D (biases, norm scales;
    with vectors=False): those go dense, as a plain fp32 all_reduce.  Small tensors cost
    more in per-message overhead and latency than they save, and 1-D ones are sensitive to
    compression error.  A spec whose codec counts from density= (topk, dgc, randomk,
    sampled) sends at least `min_k` values of a tensor a step unless it sets min_k itself
    (0: exactly ceil(density * n)): at density 0.001 a 10 x 1024 classifier would otherwise
    send 11, and lose 1-2 points of accuracy (docs/BENCHMARKS.md, "Good defaults").
    LayerPolicy("spec=...;min_elements=...;embed*=...") takes a full C policy string
    instead (name globs match the parameter key).
    A policy is any picklable callable (key, shape) -> spec string or None (dense).
    """

    def __init__(self, spec, min_elements=1024, vectors=False, min_k=512):
        if _is_policy_string(spec):
            text = spec
        else:
            text = (f"spec={_core.canonical(spec)};min_elements={int(min_elements)};"
                    f"min_k={int(min_k)};dense_1d={0 if vectors else 1}")
        self.text = text
        self.spec = spec if _is_policy_string(spec) else _core.canonical(spec)
        self._c = _core.Policy(text)
        self._canon = {}

    def __getstate__(self):
        return {"text": self.text, "spec": self.spec}

    def __setstate__(self, d):
        self.text, self.spec = d["text"], d["spec"]
        self._c = _core.Policy(self.text)
        self._canon = {}

    def plan(self, key, shape):
        """The C policy's full decision (spec, rule, reason, estimated bytes)."""
        return self._c.choose(key, shape)

    def __call__(self, key, shape):
        spec = self._c.choose(key, shape)["spec"]
        canon = self._canon.get(spec)
        if canon is None:
            canon = self._canon[spec] = _core.canonical(spec)
        return None if _is_plain_dense(canon) else canon

    def __repr__(self):
        return f"LayerPolicy({self.text!r})"


class AdaptivePolicy:
    """An adaptive method ("adapt:...", gradcomp.adapt and docs/ADAPTIVE.md) as the hook's
    policy: the controllers choose each parameter's spec and change it during training.

    AdaptivePolicy(method, min_elements=1024, total_steps=0): the parameters are those of
    the model given to hook(..., model=m), in named_parameters() order (the same on every
    rank).  Decisions are taken with every rank at the controllers' interval: the hook
    all-gathers the statistics at the start of the step after one is due.  The bandwidth
    controller's link is measured by the hook: at the decisions Adapt.link_due names
    (spaced so that probing costs at most the controller's probe_cost of the time) every
    rank times ring steps over the process group (link_probe; GradcompState's probe_bytes,
    0: feed state.observe_link(bandwidth, latency) yourself).  Its compute time is measured
    by the hook too, from the end of one exchange to the next less the hook's own time (see
    GradcompState._clock_last), unless the training loop gives its own with
    state.observe_compute(forward_s, backward_s, optimizer_s).  The accuracy controller
    needs state.observe_metric(accuracy) from the training loop, and the norm controller's
    rule at a learning-rate decay state.observe_lr(lr) (without it, the norms alone).  A
    tensor the controllers switch to dense sends its next step as a dense message
    (all-gathered), so that what its compressor held back goes with it, and joins the
    fp32 all_reduce from the step after (a restored one that is dense does the same at its
    first step: it may hold a carry).  Pickled, it keeps the method and
    the controllers' state (Adapt.save_state), so a restored hook goes on deciding where
    it stopped; each compressor keeps its state.  A pickle made before the controllers'
    state was kept restarts them from their first decision (each compressor retuned to it).
    A ladder that mixes specs keeping the momentum in the compressor (DGC) with specs that
    leave it to the optimizer, dense included, is refused (UnsupportedError, when the hook
    binds the model): a switch between the two must move the parameter's momentum, and the
    hook does not own the optimizer; DistributedOptimizer does.  (The bandwidth controller
    adds dense to a DGC base's ladder: with_dense=0 keeps it out.)
    """

    def __init__(self, method, min_elements=1024, total_steps=0):
        self.method = method
        self.min_elements = int(min_elements)
        self.total_steps = int(total_steps)
        self.adapt = None
        self._index = {}

    def __getstate__(self):
        return {"method": self.method, "min_elements": self.min_elements,
                "total_steps": self.total_steps, "tensors": getattr(self, "_tensors", None),
                "world": getattr(self, "_world", 1),
                "controllers": self.adapt.save_state() if self.adapt is not None else None}

    def __setstate__(self, d):
        self.__init__(d["method"], d["min_elements"], d["total_steps"])
        if d.get("tensors"):
            self.start(d["tensors"], d.get("world", 1))
            if d.get("controllers") is not None:
                self.adapt.load_state(d["controllers"])

    def start(self, tensors, world):
        """Creates the controllers for [(key, shape), ...]."""
        self._tensors, self._world = list(tensors), int(world)
        kw = dict(total_steps=self.total_steps, workers=self._world,
                  min_elements=self.min_elements, strategy=_hook_route_strategy)
        method = _with_hook_defaults(self.method)
        try:
            ad = _adapt.Adapt(method, self._tensors, **kw)
        except _err.Error:
            if method == self.method:
                raise
            # refused: say it in the user's words, without the defaults the hook added
            _adapt.Adapt(self.method, self._tensors, **kw).close()
            raise
        # A switch between a spec that keeps the momentum (DGC) and one that leaves it to
        # the optimizer must move the momentum between them; the hook does not own the
        # optimizer, so its parameters would get the momentum twice, or none.
        if _core._mixes_momentum(ad.ladder):
            ad.close()
            raise _err.UnsupportedError(
                f"gradcomp.torch: adaptive method {self.method!r}: its ladder mixes specs that keep "
                "the momentum in the compressor (DGC) with specs that leave it to the optimizer, and "
                "the hook cannot move a parameter's momentum between the two (it does not own the "
                "optimizer): use a ladder on one side, or gradcomp.torch.DistributedOptimizer, "
                "which moves it", status=_err.E_UNSUPPORTED, status_name="GCOMP_E_UNSUPPORTED")
        self.adapt = ad
        self._index = {k: i for i, (k, _) in enumerate(self._tensors)}

    def index(self, key):
        return self._index.get(key)

    def __call__(self, key, shape):
        i = self._index.get(key)
        if self.adapt is None or i is None:
            raise _err.ArgumentError(
                f"gradcomp.torch: adaptive method: parameter {key!r} is not one of the model's "
                "(give hook(..., model=the_model))", status=_err.E_ARG)
        return self.adapt.spec(i)

    def __repr__(self):
        return f"AdaptivePolicy({self.method!r})"


# The share of a transfer that hides behind the backward pass (the bandwidth controller's
# `overlap`) when the method does not say: gloo runs the hook's collectives on its own
# threads, so a DDP bucket's exchange progresses while the backward pass computes the next
# one; its bytes are copied on the same cores.  Measured on a 50-tensor model, two netsim
# hosts at 1 Gbit/s with 5 ms each way (docs/BENCHMARKS.md, "DDP's buckets in the hook's
# predictions"): the library's default 0 over-predicted top-k by 19-34 %, 1 under-predicted
# dense and PowerSGD by 14-24 %, 0.5 put all three within 18 %.
_HOOK_OVERLAP = 0.5


def _with_hook_defaults(method):
    """The method with the hook's bandwidth defaults where it does not set them: overlap
    0.5 (above), and concurrent=0, since gloo runs DDP's buckets' collectives one after
    another (the controller's default, 1, is gradcomp's own buckets finished together)."""
    head, _, rest = method.partition(";")
    keys = [kv.partition("=")[0].strip() for kv in rest.split(";")] if rest else []
    if "bandwidth" not in [c.strip() for c in head.partition(":")[2].split("+")]:
        return method
    if "overlap" not in keys:
        method += f";overlap={_HOOK_OVERLAP}"
    if "concurrent" not in keys:
        method += ";concurrent=0"
    return method


def _is_plain_dense(canonical):
    # Every element as f32, summed as is, with nothing kept between steps: the tensor as it
    # is, which an all_reduce sends with no message headers and no gather.
    d = _core.describe(canonical)
    props = d["properties"]
    return ("linear" in props and "sparse" not in props and "feedback" not in props
            and d["value_type"] == "f32")


_COST_ALLGATHER, _COST_ALLREDUCE = 1, 3  # gcomp_cost_strategy
_COST_ONE_EXCHANGE = 0x200  # GCOMP_COST_ONE_EXCHANGE


def _hook_route_strategy(spec):
    """How the hook sends a tensor of `spec`, as the cost model's strategy: PowerSGD's
    factors and plain fp32 by all_reduce, everything else gathered (an fp16 dense spec too,
    which the library's default would count as an all-reduce).  A message of a fixed size
    (dense quantizers, fixed-count selectors: its bound is what it sends) goes in one
    all_gather with its length in front (_gather_path); a count that depends on the data
    (threshold, whose describe() gives density 1) has its lengths exchanged first."""
    d = _core.describe(spec)
    if "multiphase" in d["properties"] or _is_plain_dense(spec):
        return _COST_ALLREDUCE
    if "sparse" in d["properties"] and d["density"] >= 1:
        return _COST_ALLGATHER
    return _COST_ALLGATHER | _COST_ONE_EXCHANGE


def _u64_to_i64(v):
    return v - (1 << 64) if v >= (1 << 63) else v


class _Entry:
    __slots__ = ("key", "shape", "numel", "spec", "comp", "kind", "plain", "flush", "adapt_index",
                 "tensor_index")

    def __init__(self, key, shape, spec, comp):
        self.key, self.shape, self.numel, self.spec, self.comp = key, shape, math.prod(shape), spec, comp
        self.adapt_index = None  # managed by the controllers
        self.tensor_index = None  # its place in the controllers' tensor list, managed or not
        self.plain = False
        self.set_kind()

    def set_kind(self):
        was_plain, self.plain = self.plain, False
        if self.comp is None:
            self.kind = "dense"
        elif "multiphase" in self.comp.codec["properties"]:
            self.kind = "lowrank"
        else:
            self.kind = "gather"
            self.plain = _is_plain_dense(self.comp.spec)
        # A compressor that becomes plain fp32 (made so, or restored so: it may hold a
        # retune's carry) sends one gathered message first.
        self.flush = self.plain and not was_plain

    def route(self):
        """How this step sends it.  A compressor retuned to plain fp32 (an adaptive
        method's dense) joins the fp32 all_reduce after one step: the step after the
        switch flushes what it held as one gathered message (g plus the carry, which only
        its own encode adds), every step after that is what dense is: a ring all_reduce,
        not an all-gather of P messages and a decode of each.  Whether a carry is held
        depends on the data (held-back values that are all zero leave none), so the choice
        follows the switch alone, which every rank makes at the same step."""
        if self.plain and not self.flush:
            return "dense"
        return self.kind  # a flush: _gather_path clears it once encoded


class GradcompState:
    """What the hook keeps between steps; pass it to register_comm_hook with the hook.

    Attributes: `policy`, `process_group` (None: the default group), `step` (completed
    steps: calls for the last bucket), `stats` (dict of counters, see below),
    `compressors` (key -> Compressor).

    stats: steps; message_bytes (what this rank sent for compressed tensors: gather
    messages, PowerSGD's P and Q factors and its dense steps -- always equal to the sum of
    its compressors' C statistics bytes_out); dense_bytes (fp32 bytes of the tensors the
    policy sends dense); bytes_sent (the two together, per rank, before padding);
    lowrank_bytes (the P and Q part of message_bytes); pad_bytes (padding that gives all
    ranks' byte tensors one size); control_bytes (length tables, spec checks); hook_ns
    (for each bucket, from hook entry to its future's completion, summed).
    """

    def __init__(self, policy, process_group=None, model=None, check_specs=True, total_steps=0,
                 probe_bytes=None):
        if isinstance(policy, str) and policy.startswith("adapt:"):
            if model is None:
                raise _err.ArgumentError(
                    "gradcomp.torch: an adaptive method needs the model (hook(method, model=m)): "
                    "the controllers must know every parameter from the start", status=_err.E_ARG)
            policy = AdaptivePolicy(policy, total_steps=total_steps)
        if isinstance(policy, str):
            policy = LayerPolicy(policy)
        if not callable(policy):
            raise TypeError("policy must be a spec string or a callable (key, shape) -> spec or None")
        probe_bytes = _PROBE_BYTES if probe_bytes is None else operator.index(probe_bytes)
        if probe_bytes != 0 and not 1024 <= probe_bytes <= 1 << 30:
            raise ValueError(f"probe_bytes must be 0 (no probe) or 1 KiB..1 GiB, got {probe_bytes}")
        self.policy = policy
        self.process_group = process_group
        self.check_specs = check_specs
        self.probe_bytes = probe_bytes
        self.step = 0
        self.epoch = None
        self._init_runtime()
        self._entries = {}
        self._order = []
        self._saved = {}
        self._saved_order = []
        self.stats = dict.fromkeys(
            ("steps", "message_bytes", "dense_bytes", "lowrank_bytes", "bytes_sent", "pad_bytes",
             "control_bytes", "hook_ns"), 0)
        self._adapt_due = False
        if model is not None:
            self.bind(model)

    def _init_runtime(self):
        # The step's compute as the hook sees it (_clock_*): when the step's first bucket
        # arrived, when the last step ended, the hook's own time this step.
        self._t_first = self._t_end = self._t_done = None
        self._sync_ns = self._obs_ns = 0
        self._compute_fed = False  # the training loop calls observe_compute itself
        self._compute_filter = _adapt._StepFilter()
        self._lock = threading.Lock()
        self._names = {}
        self._keys = {}  # id(parameter) -> key
        self._send = {}  # bucket index -> uint8 send buffer (reused)
        self._recv = {}  # bucket index -> list of uint8 receive buffers
        self._longest = {}  # bucket index -> the longest rank's message bytes last step
        # DDP's buckets as the controllers' exchange groups (Adapt.set_exchanges): this
        # step's, filled bucket by bucket, and the ones last given
        self._layout = self._groups = None

    def bind(self, model):
        """Keys compressors by parameter name (stable across code changes that reorder
        buckets, and used in error messages).  Call before the first step."""
        tensors = []
        for name, p in model.named_parameters():
            if name.startswith("module."):
                name = name[len("module."):]
            self._names[id(p)] = name
            # DDP never buckets a frozen parameter: managed, it would never be observed
            if p.requires_grad:
                tensors.append((name, tuple(p.shape)))
        if isinstance(self.policy, AdaptivePolicy):
            if self.policy.adapt is None:
                world = dist.get_world_size(self.process_group) if dist.is_initialized() else 1
                self.policy.start(tensors, world)
            elif [(k, tuple(s)) for k, s in self.policy._tensors] != tensors:
                # restored controllers were made for another model: the hook hands them
                # raw pointers to gradients of the sizes they were created with
                mine = {k: tuple(s) for k, s in self.policy._tensors}
                diff = next(((k, s, mine.get(k)) for k, s in tensors if mine.get(k) != s),
                            None)
                raise _err.StateError(
                    "gradcomp.torch: the restored adaptive controllers were made for other "
                    f"parameters ({len(self.policy._tensors)} against the model's {len(tensors)}"
                    + (f"; {diff[0]}: shape {diff[1]} here, {diff[2]} there" if diff else "")
                    + "): restore a state saved from this model", status=_err.E_STATE)
        return self

    # -- adaptive methods (AdaptivePolicy) --
    @property
    def adapt(self):
        """The controllers of an adaptive method (gradcomp.Adapt), else None."""
        return self.policy.adapt if isinstance(self.policy, AdaptivePolicy) else None

    def observe_link(self, bandwidth, latency):
        if self.adapt is not None:
            self.adapt.observe_link(bandwidth, latency)

    def observe_metric(self, value):
        if self.adapt is not None:
            self.adapt.observe_metric(value)

    def observe_lr(self, lr):
        """The learning rate of the coming steps, from the training loop (the hook cannot
        see the optimizer): the norm controller's rule at a decay."""
        if self.adapt is not None:
            self.adapt.observe_lr(lr)

    def set_course(self, progress, metric):
        if self.adapt is not None:
            self.adapt.set_course(progress, metric)

    def observe_compute(self, forward_s, backward_s, optimizer_s=0.0):
        """This rank's forward, backward and optimizer seconds of the step, for the bandwidth
        controller.  Once called, the hook's own measurement (below) stops."""
        self._compute_fed = True
        if self.adapt is not None:
            self.adapt.observe_compute(forward_s, backward_s, optimizer_s)

    # The hook's own measure of the compute between two exchanges, for the bandwidth
    # controller when the training loop gives none: from the end of the last step (its last
    # bucket's hook returned and its collectives completed) to the return of this step's
    # last bucket, less the hook's own time in between (the decision, the link probe, the
    # encodes and the blocking collectives; not the controllers' observe pass, whose
    # candidate measurements the C side takes out itself).  That is forward, backward,
    # optimizer and whatever the loop did between steps, split as `gradcomp plan` and
    # DistributedOptimizer split it (a third forward, the rest backward).  A step that took
    # over 4x the median of the latest 16 (an evaluation, a checkpoint) is left out
    # (gradcomp.adapt._StepFilter).  Steps accumulated under DDP's no_sync() run no hook:
    # their compute counts toward the next exchange's, which is what the link has to hide
    # behind (the controller's overlap is per exchange, not per batch).

    def _clock_first(self, t):
        if self._t_end is not None:
            self._t_first = max(self._t_end, self._t_done or 0)
        self._t_end = self._t_done = None
        self._sync_ns = self._obs_ns = 0

    def _clock_last(self, t_return):
        self._t_end = t_return
        since, self._t_first = self._t_first, None
        if since is None or self._compute_fed or self.adapt is None:
            return
        c = (t_return - since - (self._sync_ns - self._obs_ns)) * 1e-9
        if self._compute_filter.accept(c):
            self.adapt.observe_compute(c / 3, c - c / 3, 0.0)

    def _adapt_decide(self, group):
        """A decision is due: the link probe when the bandwidth controller asks for one
        (Adapt.link_due: the same on every rank), then every rank all-gathers its statistics
        (float64) and retunes the parameters that change, before this step's first bucket
        is encoded."""
        ad = self.adapt
        self._adapt_due = False
        if self.probe_bytes and ad.link_due():
            t0 = time.perf_counter()
            bw, lat = link_probe(self.probe_bytes, group)
            ad.observe_link(bw, lat)  # one rank: 0, ignored
            ad.observe_link_time(time.perf_counter() - t0)
        mine = torch.from_numpy(ad.stats())
        outs = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
        dist.all_gather(outs, mine, group=group)
        self.stats["control_bytes"] += mine.numel() * 8
        for i in ad.decide([o.numpy() for o in outs]):
            e = self._entries.get(ad.names[i])
            if e is None or e.comp is None:
                continue
            e.comp.retune(ad.spec(i))
            e.spec = e.comp.spec
            e.set_kind()

    @property
    def compressors(self):
        return {k: e.comp for k, e in self._entries.items() if e.comp is not None}

    @property
    def world_size(self):
        return dist.get_world_size(self.process_group)

    def set_epoch(self, epoch):
        """Fractional epoch for the schedules (DGC warm-up) of every compressor.  A spec with
        warmup= refuses to start (ArgumentError) until it has been called once."""
        self.epoch = float(epoch)
        for e in self._entries.values():
            if e.comp is not None:
                e.comp.set_epoch(self.epoch)

    def reset_stats(self):
        for k in self.stats:
            self.stats[k] = 0
        for c in self.compressors.values():
            c.reset_stats()

    # -- entries --
    def _entry(self, param, grad):
        pid = id(param)
        key = self._keys.get(pid)
        if key is not None:
            return self._entries[key]
        ordinal = len(self._order)
        key = self._names.get(pid)
        if key is None:
            if ordinal < len(self._saved_order) and not self._names:
                key = self._saved_order[ordinal]
            else:
                key = f"#{ordinal}"
        if key in self._entries:
            raise _err.Error(f"gradcomp.torch: two parameters map to key {key!r}")
        if grad.dtype != _F32 or grad.device.type != "cpu" or not grad.is_contiguous():
            raise TypeError(f"gradcomp.torch: parameter {key}: gradients must be contiguous float32 "
                            f"CPU tensors, got {grad.dtype} on {grad.device}")
        shape = tuple(grad.shape)
        saved = self._saved.pop(key, None)
        spec = self.policy(key, shape)
        ai = self.policy.index(key) if isinstance(self.policy, AdaptivePolicy) else None
        managed = ai is not None and self.policy.adapt.managed(ai)
        comp = None
        if spec is not None:
            comp = _core.Compressor(spec, math.prod(shape), shape)
            if _is_plain_dense(comp.spec) and not managed:
                comp.close()
                comp, spec = None, None
            else:
                spec = comp.spec
                if self.epoch is None and _core.warmup_epochs(spec) > 0:
                    comp.close()
                    raise _core.no_epoch_error("gradcomp.torch", key, spec, "state.set_epoch")
        if saved is not None and managed and saved[1] and saved[1] != spec:
            # An adaptive tensor saved under another setting: its state, then the new one.
            s_shape, s_spec, blob = saved
            if tuple(s_shape) == shape and blob is not None:
                comp.close()
                comp = _core.Compressor(s_spec, math.prod(shape), shape)
                comp.load_state(blob)
                comp.retune(spec)
                saved = None
        if saved is not None:
            s_shape, s_spec, blob = saved
            if tuple(s_shape) != shape or s_spec != spec:
                raise _err.StateError(
                    f"gradcomp.torch: saved state of parameter {key} is for shape {tuple(s_shape)} "
                    f"and spec {s_spec!r}, but the model has shape {shape} and spec {spec!r}",
                    status=_err.E_STATE)
            if comp is not None and blob is not None:
                comp.load_state(blob)
        if comp is not None and self.epoch is not None:
            comp.set_epoch(self.epoch)
        e = _Entry(key, shape, spec, comp)
        e.adapt_index = ai if managed else None
        e.tensor_index = ai
        self._entries[key] = e
        self._order.append(key)
        self._keys[pid] = key
        return e

    def _check(self, entries, group):
        """All ranks compare fingerprints and shapes of these parameters (first step)."""
        world = dist.get_world_size(group)
        # The link probe's size too: a rank that probes with another size would wait in
        # its ring step for bytes that never come.
        probe = self.probe_bytes if self.adapt is not None else 0
        # The controllers' configuration and step too: ranks with another interval or run
        # length (or states restored at other steps) would enter a decision's collective
        # at different steps, and wait there for the process group's timeout.
        ad = self.adapt
        mine = [probe, _u64_to_i64(ad.fingerprint) if ad is not None else 0,
                self.step if ad is not None else 0]
        for e in entries:
            mine += [_u64_to_i64(e.comp.fingerprint) if e.comp is not None else 0, e.numel]
        t = torch.tensor(mine, dtype=torch.int64)
        outs = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(outs, t, group=group)
        self.stats["control_bytes"] += t.numel() * 8
        for r, o in enumerate(outs):
            if torch.equal(o, t):
                continue
            # Every rank sees the same gathered data, so all of them get here together and
            # the object gather below cannot hang.
            if o[0] != t[0]:
                raise _err.MismatchError(
                    f"gradcomp.torch: rank {dist.get_rank(group)} probes the link with probe_bytes="
                    f"{probe}, rank {r} with {int(o[0])}: give every rank the same",
                    status=_err.E_MISMATCH)
            if o[1] != t[1]:
                raise _err.MismatchError(
                    f"gradcomp.torch: rank {r} runs another adaptive configuration than rank "
                    f"{dist.get_rank(group)} (the method, interval, total_steps or model differ): "
                    "give every rank the same", status=_err.E_MISMATCH)
            if o[2] != t[2]:
                raise _err.MismatchError(
                    f"gradcomp.torch: rank {dist.get_rank(group)} is at step {int(t[2])}, rank {r} "
                    f"at {int(o[2])}: restore every rank from states saved at the same step",
                    status=_err.E_MISMATCH)
            specs = [None] * world
            dist.all_gather_object(specs, [(e.key, e.spec, e.shape) for e in entries], group=group)
            for i, e in enumerate(entries):
                if o[3 + 2 * i] != t[3 + 2 * i] or o[4 + 2 * i] != t[4 + 2 * i]:
                    other = specs[r][i] if i < len(specs[r]) else None
                    raise _err.MismatchError(
                        f"gradcomp.torch: parameter {e.key}: rank {dist.get_rank(group)} uses spec "
                        f"{e.spec or 'dense'} (shape {e.shape}), rank {r} uses "
                        f"{(other[1] or 'dense') if other else '?'} (shape {other[2] if other else '?'})",
                        status=_err.E_MISMATCH)
            raise _err.MismatchError("gradcomp.torch: ranks differ in their buckets", status=_err.E_MISMATCH)

    # -- checkpointing --
    def __getstate__(self):
        entries = {}
        for key in self._order:
            e = self._entries[key]
            entries[key] = (e.shape, e.spec, e.comp.state_bytes() if e.comp is not None else None)
        # Entries loaded but not seen yet survive a save before the first step.
        for key, v in self._saved.items():
            entries.setdefault(key, v)
        order = self._order + [k for k in self._saved_order if k not in self._entries]
        return {
            "version": 1,
            "policy": self.policy,
            "check_specs": self.check_specs,
            "probe_bytes": self.probe_bytes,
            "step": self.step,
            "adapt_due": self._adapt_due,
            "groups": self._groups,
            "epoch": self.epoch,
            "stats": dict(self.stats),
            "order": order,
            "entries": entries,
        }

    def __setstate__(self, d):
        if d.get("version") != 1:
            raise _err.StateError(f"gradcomp.torch: unknown state version {d.get('version')!r}",
                                  status=_err.E_STATE)
        self.policy = d["policy"]
        self.process_group = None
        self.check_specs = d["check_specs"]
        self.probe_bytes = d.get("probe_bytes", _PROBE_BYTES)  # pickles from before the probe
        self.step = d["step"]
        self._adapt_due = d.get("adapt_due", False)  # a decision due at the next step
        self.epoch = d["epoch"]
        self.stats = dict(d["stats"])
        self._init_runtime()
        # DDP's buckets as the controllers last had them: a decision due at the first step
        # after the restore prices them, as the uninterrupted run would have (set_exchanges
        # comes only at the end of that step)
        groups = d.get("groups")
        ad = getattr(self.policy, "adapt", None)
        if groups is not None and ad is not None:
            ad.set_exchanges(groups)
            self._layout = self._groups = list(groups)
        self._entries = {}
        self._order = []
        self._saved = dict(d["entries"])
        self._saved_order = list(d["order"])

    # -- buffers --
    def _send_buffer(self, bucket_index, nbytes):
        b = self._send.get(bucket_index)
        if b is None or b.numel() < nbytes:
            b = torch.empty(max(nbytes, 8), dtype=torch.uint8)
            self._send[bucket_index] = b
        return b

    def _recv_buffers(self, bucket_index, world, nbytes):
        bs = self._recv.get(bucket_index)
        if bs is None or len(bs) != world or bs[0].numel() < nbytes:
            bs = [torch.empty(max(nbytes, 8), dtype=torch.uint8) for _ in range(world)]
            self._recv[bucket_index] = bs
        return [b[:nbytes] for b in bs]


def _completed(value):
    f = torch.futures.Future()
    f.set_result(value)
    return f


def _dense_path(state, group, world, grads, whole_buffer, on_done=None):
    """fp32 all_reduce of the dense tensors; returns a future that has averaged them."""
    if whole_buffer is not None:
        flat = whole_buffer
    else:
        flat = torch.cat([g.reshape(-1) for g in grads])
    fut = dist.all_reduce(flat, group=group, async_op=True).get_future()

    def unpack(f):
        f.wait()
        flat.div_(world)
        if whole_buffer is None:
            off = 0
            for g in grads:
                g.view(-1).copy_(flat[off:off + g.numel()])
                off += g.numel()
        if on_done is not None:
            on_done()
        return None

    return fut.then(unpack)


# The gather path sends every rank's messages at their encode bound, in one all_gather
# without a length exchange first, when the bound is within this factor of what the longest
# rank sent last step (fixed-k sparsifiers: 1.02-1.14x, quantizers: 1x); otherwise (a
# threshold's k varies: its bound is ~3x) the lengths go first.
_ONE_EXCHANGE_SLACK = 1.15


_NONFINITE_LEN = -1  # a rank's length table of these: its gradient held NaN or Inf


def _agree_finite(failed, bad, where, also=""):
    """After an exchange that told every rank which ranks' gradients held NaN or Inf
    (`bad`): this rank's own NonFiniteError, or one naming them; every rank raises."""
    if failed is not None:
        raise failed
    if bad:
        raise _err.NonFiniteError(
            f"gradcomp.torch: {where}: rank {', '.join(map(str, bad))}'s gradient holds NaN or "
            f"Inf{also} (every rank raises; skip the step there too, or check the loss before "
            "backward())", status=_err.E_NONFINITE)


def _raise_nonfinite(failed, tables, bucket_index):
    """After the exchange of the length tables, whose -1s mark a NaN or Inf."""
    _agree_finite(failed, [r for r, t in enumerate(tables) if t and t[0] == _NONFINITE_LEN],
                  f"bucket {bucket_index}")


def _gather_path(state, group, world, bucket_index, entries, grads):
    """Encode in C, exchange byte tensors, decode-add in C.

    Two exchanges: the per-message lengths (all_gather, blocking), then the messages padded
    to the longest rank's.  The blocking one stops this rank's backward pass until every
    rank has encoded the bucket: on 4 ranks of mlp-large sharing 2 cores it took 70 ms of a
    315 ms step.  So when the encode bound is within _ONE_EXCHANGE_SLACK of last step's
    longest message, one asynchronous exchange carries it all: each rank's buffer is its
    length table (int64 each) and then its messages, padded to the bucket's total bound,
    a size every rank knows from the specs alone.  The choice follows from the specs and
    the previous step's all-gathered lengths, so every rank makes it alike; correctness
    does not depend on it (a message never exceeds its bound).  The bound is the same on
    every rank because the specs are (the first-sight check, the collective decisions)."""
    m = len(entries)
    total_bound = sum(e.comp.bound for e in entries)
    prev = state._longest.get(bucket_index)
    one = prev is not None and total_bound <= _ONE_EXCHANGE_SLACK * prev
    head = 8 * m if one else 0
    send = state._send_buffer(bucket_index, head + total_bound)
    base = send.data_ptr() + head
    lens = []
    off = 0
    failed = None
    for e, g in zip(entries, grads):
        try:
            ln = e.comp._encode_ptr(g.data_ptr(), base + off, total_bound - off)
        except _err.NonFiniteError as ex:
            # Still in the exchanges, with a length table of -1s, which no message has:
            # every rank then raises from the same exchange, instead of the others
            # waiting in it for the process group's timeout.
            failed = ex
            break
        lens.append(ln)
        off += ln
        e.flush = False
    if failed is not None:
        lens, off = [_NONFINITE_LEN] * m, 0
    total = off
    state.stats["message_bytes"] += total
    state.stats["control_bytes"] += 8 * m
    # This rank's gradient has been consumed: the views now accumulate the average.
    for g in grads:
        g.zero_()
    if one:
        send[:head].view(torch.int64).copy_(torch.tensor(lens, dtype=torch.int64))
        size = head + total_bound
        state.stats["pad_bytes"] += total_bound - total
        table = None  # read from each rank's buffer once it arrives
    else:
        mine = torch.tensor(lens, dtype=torch.int64)
        all_lens = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(all_lens, mine, group=group)
        table = [t.tolist() for t in all_lens]
        _raise_nonfinite(failed, table, bucket_index)
        size = max(sum(t) for t in table)
        state.stats["pad_bytes"] += size - total
    recv = state._recv_buffers(bucket_index, world, size)
    fut = dist.all_gather(recv, send[:size], group=group, async_op=True).get_future()
    scale = 1.0 / world
    gptrs = [g.data_ptr() for g in grads]

    def decode(f):
        f.wait()
        if one:
            _raise_nonfinite(failed, [recv[r][:head].view(torch.int64).tolist()
                                      for r in range(world)], bucket_index)
        longest = 0
        for r in range(world):
            lens_r = recv[r][:head].view(torch.int64).tolist() if one else table[r]
            rb = recv[r].data_ptr() + head
            o = 0
            for e, gp, ln in zip(entries, gptrs, lens_r):
                if ln < 0 or o + ln > size - head:
                    raise _err.CorruptMessage(f"gradcomp.torch: rank {r} sent a bad length table",
                                              status=_err.E_CORRUPT)
                st = _core._lib.gcomp_compressor_decode_add(e.comp._h, rb + o, ln, gp, scale)
                if st:
                    _core._raise(st, f"gradcomp.torch: decoding parameter {e.key} from rank {r}")
                o += ln
            longest = max(longest, o)
        state._longest[bucket_index] = longest
        return None

    return fut.then(decode)


def _is_f16(spec):
    return _core.describe(spec)["value_type"] == "f16"


def _copy_back(src, bufs):
    src = src if src.dtype == _F32 else src.to(_F32)
    o = 0
    for a, n in bufs:
        _as_tensor(a, n).copy_(src[o:o + n])
        o += n


def _factor_allreduce(group, bufs, dtype, async_op=False):
    """Sums the C buffers `bufs` [(address, count)] over ranks with one all_reduce.
    Blocking: the sums are written back on return.  Async: returns (future, wire)."""
    flat = torch.cat([_as_tensor(a, n) for a, n in bufs])
    wire = flat if dtype == _F32 else flat.to(dtype)
    if async_op:
        return dist.all_reduce(wire, group=group, async_op=True).get_future(), wire
    dist.all_reduce(wire, group=group)
    _copy_back(wire, bufs)
    return None


def _factor_allreduce_with_dense(group, bufs, dense, world):
    """Blocking fp32 sum of the C buffers `bufs` and the gradients `dense` in one
    all_reduce; the factors get the sum, the gradients the average."""
    flat = torch.cat([_as_tensor(a, n) for a, n in bufs] + [g.reshape(-1) for g in dense])
    dist.all_reduce(flat, group=group)
    _copy_back(flat, bufs)
    o = sum(n for _, n in bufs)
    tail = flat[o:].div_(world)
    o = 0
    for g in dense:
        g.view(-1).copy_(tail[o:o + g.numel()])
        o += g.numel()


class _LowRankStep:
    """One bucket's PowerSGD step through the C protocol (include/gradcomp.h, "Low-rank"):
    per round one all_reduce of all the bucket's P factors and one of all its Qs.

    Each factor all_reduce carries a flag per rank: a rank whose begin refused its gradient
    (NaN or Inf), or whose factor overflowed, still joins it, with zeros of the size
    gcomp_lowrank_shape gives and its flag set; then every rank abandons the step and
    raises NonFiniteError from that exchange, instead of the others waiting in the next
    one for the process group's timeout."""

    def __init__(self, state, entries, grads):
        self.state = state
        self.comp_e, self.comp_g, self.dense_e, self.dense_g = [], [], [], []
        self.begun = []
        self.rounds = 0
        self.ps = []
        self.failed = None  # this rank's NonFiniteError, if a begin refused its gradient
        self._zeros = []  # what a refused tensor's P is, on this rank
        try:
            for e, g in zip(entries, grads):
                try:
                    addr, n, r = e.comp._lr_begin(g.data_ptr())
                except _err.NonFiniteError as ex:
                    # Not begun (its state is as before), but its P still goes out, as zeros.
                    self.failed = self.failed or ex
                    r, n, _ = e.comp._lr_shape()
                    z = torch.zeros(n, dtype=_F32)
                    self._zeros.append(z)
                    addr = z.data_ptr()
                else:
                    self.begun.append(e)
                if r == 0:  # dense step: before start_iter, or compression would not pay
                    if addr:  # after a retune: g plus what the old spec held back goes out
                        ctypes.memmove(g.data_ptr(), addr, 4 * n)
                    self.dense_e.append(e)
                    self.dense_g.append(g)
                    continue
                if self.rounds and r != self.rounds:
                    raise _err.ProtocolError(
                        "gradcomp.torch: PowerSGD tensors of one bucket use different iters= "
                        f"({self.rounds} and {r}); use one value per model", status=_err.E_PROTOCOL)
                self.rounds = r
                self.comp_e.append(e)
                self.comp_g.append(g)
                self.ps.append((addr, n))
        except BaseException:
            self.abort()
            raise
        # values=f16: C already rounded P and Q to f16, so fp16 on the wire loses nothing
        # more (gloo sums fp16; it has no bf16 all_reduce).
        f16 = bool(self.comp_e) and all(_is_f16(e.spec) for e in self.comp_e)
        self.dtype = torch.float16 if f16 else _F32
        st = state.stats
        for e in self.dense_e:
            st["message_bytes"] += 4 * e.numel  # what C counts for a dense step

    def abort(self):
        for e in self.begun:
            e.comp._lr_abort()

    def _agree(self, flags):
        """After a factor all_reduce: every rank raises if any rank refused a tensor."""
        _agree_finite(self.failed, [r for r, v in enumerate(flags.tolist()) if v != 0.0],
                      "PowerSGD", ", or overflows its factors")

    def commit_dense(self):
        for e in self.dense_e:
            e.comp._lr_finish(None, 0.0)

    def _next(self, fn, what, which):
        """Each tensor's next buffer to sum.  One that C refuses on this rank (a NaN or an
        overflow in its factors) still goes out, as zeros of its shape's size (`which`: 1
        for P, 2 for Q), and this rank's flag rides with them."""
        out = []
        for e in self.comp_e:
            try:
                out.append(e.comp._lr_next(fn, what))
            except _err.NonFiniteError as ex:  # C abandoned that tensor's step
                self.failed = self.failed or ex
                n = e.comp._lr_shape()[which]
                z = torch.zeros(n, dtype=_F32)
                self._zeros.append(z)
                out.append((z.data_ptr(), n))
        return out

    def _flagged(self, bufs, world, group):
        """`bufs` and a word a rank: 1 where that rank refused a tensor."""
        flags = torch.zeros(world, dtype=_F32)
        if self.failed is not None:
            flags[dist.get_rank(group)] = 1.0
        return bufs + [(flags.data_ptr(), world)], flags

    def run(self, group, world, dense=(), on_dense=None):
        """All rounds but the last Q reduction blocking; returns the final future.

        `dense` fp32 gradients ride along in the first P all_reduce (one collective less
        per step: on a 2-core loopback each costs ~0.4 ms, more than the compression).
        Every factor all_reduce carries the ranks' flags (`world` floats), and every rank
        checks them after it, so a rank that refused a tensor never leaves the others
        waiting in the next one."""
        if not self.comp_e:
            return None
        esize = 2 if self.dtype == torch.float16 else 4
        st = self.state.stats
        after_p, after_q = _core._lib.gcomp_lowrank_after_p, _core._lib.gcomp_lowrank_after_q
        try:
            ps = self.ps
            for k in range(self.rounds):
                if k > 0:
                    ps = self._next(after_q, "lowrank_after_q", 1)
                bufs, flags = self._flagged(ps, world, group)
                if k == 0 and dense:
                    _factor_allreduce_with_dense(group, bufs, dense, world)
                else:
                    _factor_allreduce(group, bufs, self.dtype)
                self._agree(flags)
                if k == 0 and dense and on_dense is not None:
                    on_dense()
                qs = self._next(after_p, "lowrank_after_p", 2)
                nbytes = esize * (sum(n for _, n in ps) + sum(n for _, n in qs))
                st["lowrank_bytes"] += nbytes
                st["message_bytes"] += nbytes
                if k + 1 < self.rounds:
                    bufs, flags = self._flagged(qs, world, group)
                    _factor_allreduce(group, bufs, self.dtype)
                    self._agree(flags)
            bufs, flags = self._flagged(qs, world, group)
            fut, wire = _factor_allreduce(group, bufs, self.dtype, async_op=True)
        except BaseException:
            self.abort()
            raise
        scale = 1.0 / world

        def finish(f):
            try:
                f.wait()
                _copy_back(wire, bufs)
                self._agree(flags)
                for e, g in zip(self.comp_e, self.comp_g):
                    e.comp._lr_finish(g.data_ptr(), scale)  # g = P^ Q^T / world
            except BaseException:
                for e in self.comp_e:
                    e.comp._lr_abort()
                raise
            return None

        return fut.then(finish)


def _as_tensor(addr, count):
    """A float32 tensor over C memory (no copy); valid until the next call on its owner."""
    if count == 0:
        return torch.empty(0, dtype=_F32)
    return torch.frombuffer((ctypes.c_float * count).from_address(addr), dtype=_F32)


def _global_rank(group, r):
    if group is None or group is dist.group.WORLD:
        return r
    f = getattr(dist, "get_global_rank", None) or dist.distributed_c10d._get_global_rank
    return f(group, r)


def link_probe(nbytes=_PROBE_BYTES, process_group=None):
    """Measures the link over a gloo process group as gcomp_mpi_link_probe does over MPI
    (collective: every rank of the group calls it): ring steps (send to the next rank,
    receive from the previous), each after a barrier: one of nbytes, untimed (it empties a
    shaper's burst), three of 8 bytes, three chains of _PROBE_CHAIN 8-byte steps back to
    back, three pairs of nbytes/2 and nbytes (a probe whose nbytes step is shorter than
    twenty latencies measures the pairs again 4x larger, twice at most); a step's time is
    its slowest rank's.  Returns (bandwidth, latency): payload bytes per second each way,
    (nbytes - nbytes/2) over the median nbytes step less the median nbytes/2 step (at most
    1.5x nbytes over the median nbytes step less the fastest 8-byte one), and the
    seconds a step adds to the fastest chain over the fastest single step (one 8-byte step
    after a barrier also pays the ranks' skew leaving it), the same on every rank, for
    Adapt.observe_link; (0, 0) for one rank.  Over gloo a
    point-to-point step costs about a round trip (on netsim with 5 ms each way: 10.4 ms a
    step in the chain, where MPI's is 5.1 ms), and so, by the hook's measured steps, do its
    collectives' steps: the reading is what a step of the hook's exchanges pays."""
    nbytes = operator.index(nbytes)
    if not 1024 <= nbytes <= 1 << 30:
        raise ValueError(f"link_probe: nbytes must be 1 KiB..1 GiB, got {nbytes}")
    group = process_group if process_group is not None else dist.group.WORLD
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    if world < 2:
        return 0.0, 0.0
    nxt, prv = _global_rank(group, (rank + 1) % world), _global_rank(group, (rank - 1) % world)
    try:
        return _probe_ring(group, nxt, prv, nbytes)
    except RuntimeError as e:
        f = _gloo_failure(e, "link probe")
        if f is None:
            raise
        raise f from e


_PROBE_CHAIN = 5  # 8-byte ring steps back to back, as gcomp_mpi_link_probe's chain
_PROBE_GROW = 4  # a probe too short against the latency grows by this, twice at most
_PROBE_CAP = 1.5  # the difference's reading, at most this times one step's over 8 bytes


def _probe_pass(group, nxt, prv, nbytes, lat):
    """One pass of gcomp_mpi_link_probe's steps (see there); the slowest rank's seconds."""
    sizes = (8, nbytes // 2, nbytes, 8)
    times = torch.zeros(4, 3, dtype=torch.float64)
    order = ([(-1, 0)] + ([(0, 0), (0, 1), (0, 2), (3, 0), (3, 1), (3, 2)] if lat else [])
             + [(k, rep) for rep in range(3) for k in (1, 2)])
    for k, rep in order:
        n = nbytes if k < 0 else sizes[k]
        send, recv = torch.zeros(n, dtype=torch.uint8), torch.empty(n, dtype=torch.uint8)
        dist.barrier(group=group)
        t0 = time.perf_counter()
        for _ in range(_PROBE_CHAIN if k == 3 else 1):
            reqs = [dist.irecv(recv, src=prv, group=group), dist.isend(send, dst=nxt, group=group)]
            for q in reqs:
                q.wait()
        if k >= 0:  # the untimed first step empties a shaper's burst
            times[k, rep] = time.perf_counter() - t0
    # the slowest rank's time of each step: a rank that left the barrier late finds part of
    # its message there already and alone would read the link as faster than it is
    dist.all_reduce(times, op=dist.ReduceOp.MAX, group=group)
    return times.sort(dim=1).values


def _probe_ring(group, nxt, prv, nbytes):
    times = _probe_pass(group, nxt, prv, nbytes, True)
    small = float(times[0, 1])
    # in a chain each step waits for the previous rank's last one: the skew is paid once;
    # the fastest of each, since a stall only adds
    per = (float(times[3, 0]) - float(times[0, 0])) / (_PROBE_CHAIN - 1)
    lat = per if per > 0 else small
    # a step shorter than twenty latencies measures TCP's window more than the link: grow
    for _ in range(2):
        if not (float(times[2, 0]) < 20 * lat and nbytes * _PROBE_GROW <= 1 << 30):
            break
        nbytes *= _PROBE_GROW
        times = _probe_pass(group, nxt, prv, nbytes, False)
    # a stall, or a bucket refilled while the link sat idle, is one step in three at most:
    # the median of each size.  Where two of three stall the difference can be far too
    # small (one probe read 33x the link over gloo on busy cores): a large step cannot be
    # faster than its size at the link's rate after the fastest small step's start
    half, big = float(times[1, 1]), float(times[2, 1])
    fast = float(times[0, 0])
    one = (nbytes - 8) / (big - fast) if big > fast else nbytes / big
    bw = (nbytes - nbytes // 2) / (big - half) if big > half else one
    return min(bw, _PROBE_CAP * one), lat


def _gloo_failure(e, what):
    """A gloo error from one of the hook's collectives, as the gradcomp error it means (None
    for any other error).  gloo says where in its transport it failed; what the caller needs
    is which of the two it was: a rank that did not answer within the process group's
    timeout, or one whose connection closed (it died) - the group is unusable after either."""
    msg = str(e)
    # A pair that timed out in one collective closes, and a collective still waiting on it
    # fails with "Application timeout caused pair closure": a timeout, not a death.
    timeouts = ("Timed out", "timed out", "Application timeout")
    marks = ("gloo", "Connection", "connection", "pair closure") + timeouts
    if not any(m in msg for m in marks):
        return None
    # gloo's own line (a callback's error arrives wrapped in torch's words around it),
    # from its source location ("[<path>/gloo/transport/...]") on where it has one
    first = next((ln.strip() for ln in msg.splitlines() if any(m in ln for m in marks)), msg.strip())
    at = re.search(r"\[[^\]\s]*gloo/", first)
    first = first[at.start():] if at else first
    if any(m in msg for m in timeouts):
        return _err.CollectiveTimeout(
            f"gradcomp.torch: {what}: a rank did not answer within the process group's timeout "
            f"(stalled or dead; init_process_group(timeout=...)): {first}",
            status=_err.E_TIMEOUT, status_name="GCOMP_E_TIMEOUT")
    return _err.CommunicatorFailed(
        f"gradcomp.torch: {what}: the process group lost a rank (its connection closed: it died "
        f"or left); the group cannot be used again: {first}",
        status=_err.E_FAILED, status_name="GCOMP_E_FAILED")


def gradcomp_hook(state, bucket):
    """The DDP communication hook (register it with a GradcompState)."""
    try:
        return _hook(state, bucket)
    except RuntimeError as e:
        f = _gloo_failure(e, f"step {state.step}, bucket {bucket.index()}")
        if f is None:
            raise
        raise f from e


def _hook(state, bucket):
    t0 = time.perf_counter_ns()
    step = state.step
    group = state.process_group if state.process_group is not None else dist.group.WORLD
    world = dist.get_world_size(group)
    buf = bucket.buffer()
    grads = bucket.gradients()
    params = bucket.parameters()
    ad = state.adapt
    if bucket.index() == 0:
        state._clock_first(t0)
    if ad is not None and state._adapt_due and bucket.index() == 0:
        state._adapt_decide(group)
    nseen = len(state._entries)
    entries = [state._entry(p, g) for p, g in zip(params, grads)]
    if state.check_specs and len(state._entries) != nseen:
        state._check(entries, group)
    if ad is not None:
        # DDP's bucket of each tensor, for the bandwidth controller
        if bucket.index() == 0 or state._layout is None:
            state._layout = [0] * len(ad)
        for e in entries:
            if e.tensor_index is not None:
                state._layout[e.tensor_index] = bucket.index() + 1
        # what the controllers see: each gradient and what is held back
        t_obs = time.perf_counter_ns()
        for e, g in zip(entries, grads):
            if e.adapt_index is None:
                continue
            if g.numel() != ad.numels[e.tensor_index]:  # C reads that many floats from g
                raise _err.MismatchError(
                    f"gradcomp.torch: parameter {e.key}: {g.numel()} elements, the adaptive "
                    f"controllers were made for {ad.numels[e.tensor_index]}", status=_err.E_MISMATCH)
            rp = _core._lib.gcomp_compressor_residual(e.comp._h)
            st_ = _core._lib.gcomp_adapt_observe(ad._h, e.adapt_index, g.data_ptr(),
                                                 ctypes.cast(rp, ctypes.c_void_p) if rp else None)
            if st_ and st_ != _err.E_NONFINITE:  # a NaN is left out; the exchange refuses it
                _core._raise(st_, f"gradcomp.torch: observing parameter {e.key}")
        state._obs_ns += time.perf_counter_ns() - t_obs

    st = state.stats
    routes = [e.route() for e in entries]
    dense = [g for r, g in zip(routes, grads) if r == "dense"]
    st["dense_bytes"] += 4 * sum(g.numel() for g in dense)
    gath = [(e, g) for e, r, g in zip(entries, routes, grads) if r == "gather"]
    lowr = [(e, g) for e, r, g in zip(entries, routes, grads) if r == "lowrank"]
    lr = _LowRankStep(state, [e for e, _ in lowr], [g for _, g in lowr]) if lowr else None
    commit = None
    if lr is not None and lr.dense_g:
        dense = dense + lr.dense_g  # PowerSGD's dense steps join the fp32 all_reduce
        commit = lr.commit_dense
    futs = []
    try:
        if lr is not None and lr.comp_e and lr.dtype == _F32 and dense:
            f = lr.run(group, world, dense, commit)
        else:
            if dense:
                whole = buf if len(dense) == len(entries) else None
                futs.append(_dense_path(state, group, world, dense, whole, commit))
            f = lr.run(group, world) if lr is not None else None
        if f is not None:
            futs.append(f)
    except BaseException:
        if lr is not None:
            lr.abort()
        raise
    if gath:
        futs.append(_gather_path(state, group, world, bucket.index(), [e for e, _ in gath],
                                 [g for _, g in gath]))
    st["bytes_sent"] = st["message_bytes"] + st["dense_bytes"]
    t_ret = time.perf_counter_ns()
    state._sync_ns += t_ret - t0
    if bucket.is_last():
        state._clock_last(t_ret)
        state.step += 1
        st["steps"] += 1
        if ad is not None and state._layout != state._groups:
            # DDP rebuilds its buckets after the first step, the same on every rank: the
            # predictions follow, so that dense is priced as DDP sends it (a few buckets,
            # not a message a parameter).
            ad.set_exchanges(state._layout)
            state._groups = state._layout
        if ad is not None and ad.end_step():
            state._adapt_due = True

    def done(f):
        try:
            for x in f.value():
                x.wait()  # re-raises the first error of any path
        except RuntimeError as e:
            g = _gloo_failure(e, f"step {step}, bucket {bucket.index()}'s exchange")
            if g is None:
                raise
            raise g from e
        t = time.perf_counter_ns()
        with state._lock:  # buckets complete on gloo's threads, perhaps two at once
            st["hook_ns"] += t - t0
            state._t_done = t if state._t_done is None else max(state._t_done, t)
        return buf

    if not futs:
        return _completed(buf)
    return torch.futures.collect_all(futs).then(done)


def hook(spec_or_policy, process_group=None, model=None, check_specs=True, total_steps=0,
         probe_bytes=None):
    """Returns (hook, state) for `ddp_model.register_comm_hook(state, hook)`.

    spec_or_policy: a spec string (LayerPolicy(spec): tensors under 1024 elements and
    1-D tensors go dense), a C policy string ("spec=...;min_elements=...;glob=spec"), a
    LayerPolicy, an adaptive method "adapt:..." (AdaptivePolicy; needs model, and
    total_steps for interval=auto), or any picklable callable (key, shape) -> spec or None
    (dense).  model: the DDP model or its module, to key compressors (and error messages)
    by parameter name.  process_group: None for the default group.  probe_bytes: the
    bandwidth controller's link probe (link_probe) at the decisions that ask for one; None:
    512 KiB, as `gradcomp train`; 0: no probe, feed state.observe_link yourself.  Works
    with the gloo backend on CPU tensors.
    """
    return gradcomp_hook, GradcompState(spec_or_policy, process_group, model, check_specs,
                                        total_steps, probe_bytes)


# ---- the model as `gradcomp plan` reads it -----------------------------------------------------

def _per_sample_macs(module, output, batch):
    """Multiply-adds a sample of one call of `module`, for each of its own parameters."""
    out = output[0] if isinstance(output, (tuple, list)) else output
    if not torch.is_tensor(out) or batch < 1:
        return {}
    outs = out.numel() / batch
    own = dict(module.named_parameters(recurse=False))
    if isinstance(module, torch.nn.Linear):
        work = {"weight": outs * module.in_features, "bias": outs}
    elif isinstance(module, torch.nn.modules.conv._ConvNd):
        k = math.prod(module.kernel_size) * module.in_channels // module.groups
        work = {"weight": outs * k, "bias": outs}
    else:  # norms, embeddings, anything else: a pass over the output
        work = {}
    return {name: work.get(name, outs) for name in own}


def tensor_list(model, example=None):
    """The model's trainable parameters as `gradcomp plan --model FILE` reads them: one line
    a tensor, `name d0 d1 ...` (a conv weight out x in x kh x kw), in registration order,
    which the cost model takes as forward order (the backward pass makes gradients final
    from the last line up).  A parameter shared by several modules is listed once.

    example: a batch the model accepts (a tensor, or a tuple of arguments).  With it, one
    forward pass under torch.no_grad() measures each layer's output, and every line gains
    macs=M: the multiply-adds a sample of the backward work before that gradient is final
    (a Linear or Conv weight: its forward multiply-adds; a bias, a norm, an embedding: the
    elements of the output), summed over the calls of a module that runs more than once;
    0 for a parameter whose module did not run.  Without it the cost model spreads the
    backward pass by element count, which is wrong for convolutions (docs/COST_MODEL.md).
    """
    # named_parameters() lists a shared parameter once
    params = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    work = None
    if example is not None:
        args = example if isinstance(example, tuple) else (example,)
        first = next((a for a in args if torch.is_tensor(a)), None)
        if first is None or first.dim() == 0:
            raise ValueError("tensor_list: example must hold a batched tensor")
        batch = first.shape[0]
        work = {}
        handles = []

        def record(module, inputs, output):
            for pname, m in _per_sample_macs(module, output, batch).items():
                key = id(getattr(module, pname))
                work[key] = work.get(key, 0.0) + m

        for module in model.modules():
            if any(True for _ in module.parameters(recurse=False)):
                handles.append(module.register_forward_hook(record))
        try:
            with torch.no_grad():
                model(*args)
        finally:
            for h in handles:
                h.remove()
    lines = []
    for name, p in params:
        dims = " ".join(str(d) for d in p.shape) or "1"
        line = f"{name} {dims}"
        if work is not None:
            line += " macs=%d" % round(work.get(id(p), 0.0))
        lines.append(line)
    return "\n".join(lines) + "\n"


def write_tensor_list(model, path, example=None):
    """Writes tensor_list(model, example) to `path`, with a comment naming the model."""
    with open(path, "w") as f:
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        f.write(f"# {type(model).__name__}: {trainable} trainable parameters "
                "(gradcomp.torch.write_tensor_list)\n")
        f.write(tensor_list(model, example))


# ---- over MPI: the Horovod-style optimizer (gradcomp/optimizer.py) ----------------------------
# Imported on first use: it needs mpi4py, which initialises MPI, and the gloo hook above
# must not.
_OPTIMIZER_NAMES = ("DistributedOptimizer", "broadcast_parameters", "broadcast_optimizer_state")


def __getattr__(name):
    if name in _OPTIMIZER_NAMES:
        from . import optimizer

        return getattr(optimizer, name)
    raise AttributeError(f"module 'gradcomp.torch' has no attribute {name!r}")
