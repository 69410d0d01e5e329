"""gradcomp.mpi - compressed collectives over MPI from Python (ctypes over libgradcomp_mpi).

    from mpi4py import MPI                       # initialises MPI (mpirun -np P python3 ...)
    import gradcomp.mpi as gm

    comm = gm.Communicator(MPI.COMM_WORLD, timeout=60)
    bucket = comm.bucket([gm.Tensor("fc1.weight", "topk:density=0.01,feedback=ef", (1024, 784)),
                          gm.Tensor("fc1.bias", "none", (1024,))])
    bucket.allreduce([w_grad, b_grad])           # numpy arrays or CPU tensors, averaged in place
    bucket.start([w_grad, b_grad]); ...; bucket.wait()     # or non-blocking, with test()
    outer = comm.outer(tensors, weights, local_steps=32)     # local SGD / DiLoCo (Outer)
    for i in comm.adapt_decide(adapt):           # adaptive methods (gradcomp.Adapt): one decision
        bucket.retune(i, adapt.spec(i))          # with every rank, applied between two allreduces
    ps = comm.parameter_server(servers=1)        # MXNet kvstore / BytePS (ParameterServer)

include/gradcomp_mpi.h is the manual of what runs underneath: the strategies (allgather,
sparse, allreduce, rsag, ps, hierarchical), the pipelined sub-buckets, the set-up check that
turns ranks with different settings into MismatchError on every rank, the timeouts that turn
a dead or stalled peer into CollectiveTimeout / MPIError instead of a hang, and the state
blobs that checkpoints carry.  This module adds no algorithm of its own: it marshals buffers
(by address, never copied), maps every status to the package's exceptions
(gradcomp/errors.py) and owns the C objects' lifetimes.  gradcomp.torch.DistributedOptimizer
is built on it.

How MPI gets initialised, and where the MPI_Comm comes from: mpi4py (Debian's
python3-mpi4py), and nothing else.  The alternative - the package calling MPI_Init itself
when mpi4py is absent - was rejected:
  * libgradcomp_mpi never calls MPI_Init or MPI_Finalize (the library contract), so a second
    helper library would have to, and it would have to redo what mpi4py already does right:
    negotiate the thread level, finalise at interpreter exit only after every object that
    holds an MPI handle is gone, and not finalise an MPI someone else initialised;
  * the MPI_Comm handle's ABI differs between MPIs (a pointer in Open MPI, an int in MPICH);
    mpi4py knows it for the MPI it was built with (MPI._sizeof, MPI._handleof), a helper
    would hard-code one;
  * users of mpirun from Python already have mpi4py, and it gives them any communicator
    (MPI.COMM_WORLD.Split(...) for a subset of ranks), not only the world;
  * two owners of MPI_Init in one process (the helper's, and mpi4py imported later by the
    user's own code) is a known source of "MPI_Init called twice" aborts.
So `import gradcomp.mpi` needs mpi4py and says how to install it when it is missing; the
rest of the package (gradcomp, gradcomp.torch's gloo hook) never imports it.  At import this
module checks that mpi4py and libgradcomp_mpi use the same MPI library.

Threads: the library needs MPI_THREAD_FUNNELED or more (mpi4py asks for MULTIPLE by default);
a communicator and its buckets are used by one thread at a time - the one that may call MPI.
Process exit: objects are freed when collected (or by close()); mpi4py finalises MPI after
that.  After a peer died, MPI_Finalize itself may wait for it: report, save what you need
(Bucket.state_bytes works on a failed bucket) and leave with os._exit.

Library search order for libgradcomp_mpi.so (the core, libgradcomp.so, is found as
gradcomp/_native.py says and must be loaded first): $GRADCOMP_MPI_LIB, the package's own
directory, the build tree of the loaded core (<build>/src/mpi/), <repo>/build*/src/mpi/
newest first (sanitizer builds left out, as for the core), the system's library path.
"""

import ctypes
import ctypes.util
import glob
import math
import operator
import os
import pickle
import time
import weakref

try:
    from mpi4py import MPI
except ImportError as e:  # pragma: no cover - depends on the machine
    raise ImportError(
        "gradcomp.mpi needs mpi4py for MPI_Init and the communicator handle: "
        "apt-get install python3-mpi4py (Debian), then run under mpirun"
    ) from e

from . import _native
from . import core as _core
from . import errors as _err

_P = ctypes.c_void_p
_S = ctypes.c_size_t
_I = ctypes.c_int
_SP = ctypes.POINTER(ctypes.c_size_t)
_EP = ctypes.POINTER(_native.ErrorInfo)

# MPI_Comm is a pointer in Open MPI and an int in MPICH: mpi4py knows which.
_COMM_T = _P if MPI._sizeof(MPI.Comm) == ctypes.sizeof(_P) else ctypes.c_int

# Strategy values and the op, from include/gradcomp_mpi.h.
AUTO, ALLGATHER, SPARSE, ALLREDUCE, RSAG, PS = 0, 1, 2, 3, 4, 5
HIERARCHICAL = 0x100
SUM, AVERAGE = 0, 1
# gcomp_mpi_outer_optimizer.
OUTER_SGD, OUTER_NESTEROV = 0, 1
# gcomp_mpi_ps_mode.
PS_SYNC, PS_ASYNC = 0, 1


class Options(ctypes.Structure):
    """gcomp_mpi_options."""

    _fields_ = [("timeout_s", ctypes.c_double), ("ranks_per_node", ctypes.c_int)]


class TensorDesc(ctypes.Structure):
    """gcomp_mpi_tensor."""

    _fields_ = [
        ("name", ctypes.c_char_p),
        ("spec", ctypes.c_char_p),
        ("n", _S),
        ("rows", _S),
        ("cols", _S),
        ("strategy", ctypes.c_int),
    ]


class BucketOptions(ctypes.Structure):
    """gcomp_mpi_bucket_options."""

    _fields_ = [("bucket_bytes", _S), ("ps", ctypes.c_void_p)]  # ps: a gcomp_mpi_ps * (ParameterServer)


class Stats(ctypes.Structure):
    """gcomp_mpi_stats."""

    _fields_ = [
        ("calls", ctypes.c_uint64),
        ("bytes_sent", ctypes.c_uint64),
        ("bytes_received", ctypes.c_uint64),
        ("node_bytes", ctypes.c_uint64),
        ("codec_ns", ctypes.c_uint64),
        ("wire_ns", ctypes.c_uint64),
        ("elapsed_ns", ctypes.c_uint64),
        ("overlap_ns", ctypes.c_uint64),
    ]


class OuterOptions(ctypes.Structure):
    """gcomp_mpi_outer_options."""

    _fields_ = [
        ("local_steps", ctypes.c_uint),
        ("optimizer", ctypes.c_int),
        ("lr", ctypes.c_double),
        ("momentum", ctypes.c_double),
        ("fragments", ctypes.c_uint),
        ("delay", ctypes.c_int),
        ("mix", ctypes.c_double),
        ("ef_decay", ctypes.c_double),
        ("fragment_of", ctypes.POINTER(ctypes.c_uint)),
        ("bucket_bytes", _S),
    ]


class PSOptimizer(ctypes.Structure):
    """gcomp_mpi_ps_optimizer."""

    _fields_ = [
        ("lr", ctypes.c_float),
        ("momentum", ctypes.c_float),
        ("weight_decay", ctypes.c_float),
        ("rescale", ctypes.c_float),
        ("nesterov", ctypes.c_int),
    ]


class PSOptions(ctypes.Structure):
    """gcomp_mpi_ps_options."""

    _fields_ = [
        ("servers", ctypes.c_int),
        ("server_ranks", ctypes.POINTER(ctypes.c_int)),
        ("mode", ctypes.c_int),
        ("update", ctypes.c_int),
        ("optimizer", PSOptimizer),
        ("pull", ctypes.c_char_p),
        ("part_bytes", _S),
        ("max_staleness", ctypes.c_uint64),
    ]


class PSStats(ctypes.Structure):
    """gcomp_mpi_ps_stats."""

    _fields_ = [
        ("pushes", ctypes.c_uint64),
        ("applied", ctypes.c_uint64),
        ("pulls", ctypes.c_uint64),
        ("bytes_pushed", ctypes.c_uint64),
        ("bytes_pulled", ctypes.c_uint64),
        ("busy_ns", ctypes.c_uint64),
        ("queue_max", ctypes.c_uint64),
        ("queue_sum", ctypes.c_uint64),
        ("stale_max", ctypes.c_uint64),
        ("stale_sum", ctypes.c_uint64),
        ("dropped", ctypes.c_uint64),
        ("refused", ctypes.c_uint64),
        ("workers_lost", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
    ]


PROTOTYPES = {
    "gcomp_mpi_strategy_parse": (_I, [ctypes.c_char_p, ctypes.POINTER(_I)]),
    "gcomp_mpi_strategy_name": (ctypes.c_char_p, [_I]),
    "gcomp_mpi_strategy_auto": (_I, [ctypes.c_char_p, _I, ctypes.POINTER(_I)]),
    "gcomp_mpi_options_default": (None, [ctypes.POINTER(Options)]),
    "gcomp_mpi_comm_create": (_I, [ctypes.POINTER(_P), _COMM_T, ctypes.POINTER(Options), ctypes.c_double, _EP]),
    "gcomp_mpi_comm_free": (_I, [_P]),
    "gcomp_mpi_comm_status": (_I, [_P, _EP]),
    "gcomp_mpi_comm_reset": (_I, [_P, ctypes.c_double, _EP]),
    "gcomp_mpi_comm_rank": (_I, [_P]),
    "gcomp_mpi_comm_size": (_I, [_P]),
    "gcomp_mpi_comm_nodes": (_I, [_P]),
    "gcomp_mpi_comm_node": (_I, [_P]),
    "gcomp_mpi_bucket_options_default": (None, [ctypes.POINTER(BucketOptions)]),
    "gcomp_mpi_bucket_create": (
        _I,
        [ctypes.POINTER(_P), _P, ctypes.POINTER(TensorDesc), _S, ctypes.POINTER(BucketOptions), ctypes.c_double, _EP],
    ),
    "gcomp_mpi_bucket_free": (None, [_P]),
    "gcomp_mpi_bucket_count": (_S, [_P]),
    "gcomp_mpi_bucket_strategy": (_I, [_P, _S]),
    "gcomp_mpi_allreduce": (_I, [_P, ctypes.POINTER(_P), _I, ctypes.c_double, _EP]),
    "gcomp_mpi_start": (_I, [_P, ctypes.POINTER(_P), _I, _EP]),
    "gcomp_mpi_test": (_I, [_P, ctypes.POINTER(_I), _EP]),
    "gcomp_mpi_wait": (_I, [_P, ctypes.c_double, _EP]),
    "gcomp_mpi_wait_all": (_I, [ctypes.POINTER(_P), _S, ctypes.c_double, _SP, _EP]),
    "gcomp_mpi_wait_each": (_I, [ctypes.POINTER(_P), _S, ctypes.c_double, _EP, _SP, _EP]),
    "gcomp_mpi_message": (_I, [_P, _S, _S, ctypes.POINTER(_P), _SP, _SP, _SP]),
    "gcomp_mpi_message_count": (_S, [_P, _S]),
    "gcomp_mpi_owner_residual": (_I, [_P, _S, ctypes.POINTER(ctypes.POINTER(ctypes.c_float)), _SP, _SP]),
    "gcomp_mpi_owner_spec": (ctypes.c_char_p, [_P, _S]),
    "gcomp_mpi_worker_spec": (ctypes.c_char_p, [_P, _S]),
    "gcomp_mpi_compressor": (_P, [_P, _S]),
    "gcomp_mpi_bucket_state_size": (_S, [_P]),
    "gcomp_mpi_bucket_save_state": (_I, [_P, _P, _S, _SP, _EP]),
    "gcomp_mpi_bucket_load_state": (_I, [_P, _P, _S, _EP]),
    "gcomp_mpi_stats_get": (_I, [_P, _S, ctypes.POINTER(Stats)]),
    "gcomp_mpi_stats_reset": (None, [_P]),
    # the outer step of local SGD / DiLoCo (src/mpi/mpi_outer.c)
    "gcomp_mpi_outer_options_default": (None, [ctypes.POINTER(OuterOptions)]),
    "gcomp_mpi_outer_create": (
        _I,
        [ctypes.POINTER(_P), _P, ctypes.POINTER(TensorDesc), _S, ctypes.POINTER(_P), ctypes.POINTER(OuterOptions),
         ctypes.c_double, _EP],
    ),
    "gcomp_mpi_outer_free": (None, [_P]),
    "gcomp_mpi_outer_step": (_I, [_P, ctypes.POINTER(_P), ctypes.c_double, _EP]),
    "gcomp_mpi_outer_progress": (_I, [_P, _EP]),
    "gcomp_mpi_outer_flush": (_I, [_P, ctypes.POINTER(_P), ctypes.c_double, _EP]),
    "gcomp_mpi_outer_global": (ctypes.POINTER(ctypes.c_float), [_P, _S]),
    "gcomp_mpi_outer_average": (ctypes.POINTER(ctypes.c_float), [_P, _S]),
    "gcomp_mpi_outer_count": (_S, [_P]),
    "gcomp_mpi_outer_fragments": (_S, [_P]),
    "gcomp_mpi_outer_locate": (_I, [_P, _S, _SP, _SP]),
    "gcomp_mpi_outer_bucket": (_P, [_P, _S]),
    "gcomp_mpi_outer_local_steps": (ctypes.c_uint, [_P]),
    "gcomp_mpi_outer_delay": (ctypes.c_uint, [_P]),
    "gcomp_mpi_outer_offset": (ctypes.c_uint64, [_P, _S]),
    "gcomp_mpi_outer_steps": (ctypes.c_uint64, [_P]),
    "gcomp_mpi_outer_syncs": (ctypes.c_uint64, [_P, _S]),
    "gcomp_mpi_outer_in_flight": (_I, [_P, _S]),
    "gcomp_mpi_outer_stats": (_I, [_P, ctypes.POINTER(Stats)]),
    "gcomp_mpi_outer_state_size": (_S, [_P]),
    "gcomp_mpi_outer_save_state": (_I, [_P, _P, _S, _SP, ctypes.c_double, _EP]),
    "gcomp_mpi_outer_load_state": (_I, [_P, _P, _S, _EP]),
    # the parameter server (src/mpi/mpi_ps*.c)
    "gcomp_mpi_ps_options_default": (None, [ctypes.POINTER(PSOptions)]),
    "gcomp_mpi_ps_create": (_I, [ctypes.POINTER(_P), _P, ctypes.POINTER(PSOptions), ctypes.c_double, _EP]),
    "gcomp_mpi_ps_free": (_I, [_P]),
    "gcomp_mpi_ps_is_server": (_I, [_P]),
    "gcomp_mpi_ps_index": (_I, [_P]),
    "gcomp_mpi_ps_workers": (_I, [_P]),
    "gcomp_mpi_ps_servers": (_I, [_P]),
    "gcomp_mpi_ps_serve": (_I, [_P, ctypes.c_double, _EP]),
    "gcomp_mpi_ps_shutdown": (_I, [_P, ctypes.c_double, _EP]),
    "gcomp_mpi_ps_init": (_I, [_P, ctypes.POINTER(_P), ctypes.c_double, _EP]),
    "gcomp_mpi_ps_pull": (_I, [_P, ctypes.POINTER(_P), ctypes.c_double, _EP]),
    "gcomp_mpi_ps_set_lr": (_I, [_P, ctypes.c_float]),
    "gcomp_mpi_ps_set_optimizer": (_I, [_P, _S, ctypes.POINTER(PSOptimizer)]),
    "gcomp_mpi_ps_part_count": (_S, [_P, _S]),
    "gcomp_mpi_ps_part": (_I, [_P, _S, _S, _SP, _SP, ctypes.POINTER(_I)]),
    "gcomp_mpi_ps_server_rank": (_I, [_P, _I]),
    "gcomp_mpi_ps_worker_rank": (_I, [_P, _I]),
    "gcomp_mpi_ps_compressor": (_P, [_P, _S, _S]),
    "gcomp_mpi_ps_residual": (_I, [_P, _S, _P]),
    "gcomp_mpi_ps_stored": (_I, [_P, _S, _P, _SP]),
    "gcomp_mpi_ps_version": (ctypes.c_uint64, [_P, _S]),
    "gcomp_mpi_ps_stats_get": (_I, [_P, _I, ctypes.POINTER(PSStats)]),
    "gcomp_mpi_ps_key_stats": (_I, [_P, _S, ctypes.POINTER(PSStats)]),
    "gcomp_mpi_ps_stats_reset": (None, [_P]),
    "gcomp_mpi_ps_state_size": (_S, [_P]),
    "gcomp_mpi_ps_save_state": (_I, [_P, _P, _S, _SP, _EP]),
    "gcomp_mpi_ps_load_state": (_I, [_P, _P, _S, _EP]),
    # adaptive compression (src/mpi/mpi_retune.c, src/mpi/mpi_adapt.c)
    "gcomp_mpi_bucket_retune": (_I, [_P, _S, ctypes.c_char_p, ctypes.c_double, _EP]),
    "gcomp_mpi_adapt_decide": (_I, [_P, _P, ctypes.c_double, _SP, _EP]),
    "gcomp_mpi_link_probe": (
        _I, [_P, _S, ctypes.c_double, ctypes.POINTER(ctypes.c_double), ctypes.POINTER(ctypes.c_double), _EP]),
}
# Functions that came after the first binding (the outer step, issue 18; the parameter
# server; adaptive compression, issue 17) are optional as groups, as in _native.OPTIONAL:
# the module loads without them, and Outer / ParameterServer and the methods that need an
# adaptive function raise UnsupportedError naming the missing function when the library
# lacks it.
_ADAPTIVE = ("gcomp_mpi_bucket_retune", "gcomp_mpi_adapt_decide", "gcomp_mpi_link_probe")
OPTIONAL = {name for name in PROTOTYPES
            if name.startswith(("gcomp_mpi_outer_", "gcomp_mpi_ps_")) or name in _ADAPTIVE}


def _candidates():
    env = os.environ.get("GRADCOMP_MPI_LIB")
    if env:
        if not os.path.exists(env):
            raise OSError(f"GRADCOMP_MPI_LIB={env!r} does not exist")
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    out = sorted(glob.glob(os.path.join(here, "libgradcomp_mpi.so*")))
    core_dir = os.path.dirname(os.path.abspath(_core.LIBRARY_PATH))
    out += [p for p in (os.path.join(core_dir, "src", "mpi", "libgradcomp_mpi.so"),
                        os.path.join(core_dir, "libgradcomp_mpi.so")) if os.path.exists(p)]
    repo = os.path.dirname(os.path.dirname(here))
    out += _native.built_libraries(os.path.join(repo, "build*", "src", "mpi",
                                                "libgradcomp_mpi.so"))
    found = ctypes.util.find_library("gradcomp_mpi")
    if found:
        out.append(found)
    return out


def _load():
    tried = []
    for path in _candidates():
        try:
            # RTLD_GLOBAL: Open MPI's plugins resolve libmpi's symbols through the global
            # namespace (mpi4py loads libmpi the same way).
            lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            tried.append(f"{path}: {e}")
            continue
        for name, (res, args) in PROTOTYPES.items():
            fn = getattr(lib, name, None)
            if fn is None:
                if name in OPTIONAL:
                    continue
                raise OSError(f"{path} lacks {name}: too old for this package")
            fn.restype, fn.argtypes = res, args
        return lib, path
    raise OSError(
        "gradcomp.mpi: cannot find libgradcomp_mpi.so; build it (cmake --build, with Open MPI "
        "installed) or set GRADCOMP_MPI_LIB" + "".join("\n  " + t for t in tried)
    )


_lib, LIBRARY_PATH = _load()


def _mpi_library_version(lib):
    fn = getattr(lib, "MPI_Get_library_version", None)
    if fn is None:
        return None
    buf = ctypes.create_string_buffer(8192)
    ln = ctypes.c_int()
    fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_char_p, ctypes.POINTER(ctypes.c_int)]
    if fn(buf, ctypes.byref(ln)) != 0:
        return None
    return buf.value.decode("utf-8", "replace")


def _check_same_mpi():
    ours, theirs = _mpi_library_version(_lib), MPI.Get_library_version()
    if ours is not None and ours.strip("\0\n ") != theirs.strip("\0\n "):
        raise ImportError(
            "gradcomp.mpi: mpi4py and libgradcomp_mpi use different MPI libraries:\n"
            f"  mpi4py:           {theirs.splitlines()[0] if theirs else '?'}\n"
            f"  libgradcomp_mpi:  {ours.splitlines()[0] if ours else '?'}\n"
            "build gradcomp against the MPI that mpi4py uses"
        )


_check_same_mpi()


def _s(b):
    return b.decode("utf-8", "replace") if b is not None else None


def _check(st, context, err=None):
    _core._check(st, context, err)


def _need(name):
    fn = getattr(_lib, name, None)
    if fn is None:
        raise _err.UnsupportedError(f"{LIBRARY_PATH} lacks {name}", status=_err.E_UNSUPPORTED,
                                    status_name=_core.status_name(_err.E_UNSUPPORTED))
    return fn


# ---- strategies ------------------------------------------------------------------------


def strategy_value(strategy):
    """A strategy as the C enum value: an int is returned as is, a name ("auto",
    "allgather", "sparse", "allreduce", "rsag", "ps", "hierarchical", "hierarchical:rsag",
    ...) is parsed by the library.  Raises ArgumentError for an unknown name."""
    if isinstance(strategy, int):
        return strategy
    if strategy is None:
        return AUTO
    out = ctypes.c_int()
    st = _lib.gcomp_mpi_strategy_parse(str(strategy).encode(), ctypes.byref(out))
    if st:
        _core._raise(st, f"strategy {strategy!r}",
                     "unknown strategy; use auto, allgather, sparse, allreduce, rsag, ps, "
                     "hierarchical or hierarchical:NAME")
    return out.value


def strategy_name(value):
    """The library's name of a strategy value ("allgather", "hierarchical:rsag", ...)."""
    return _s(_lib.gcomp_mpi_strategy_name(int(value)))


def strategy_auto(spec, nranks=0):
    """The strategy the library picks for `spec` when asked for "auto" (a name)."""
    return strategy_name(_strategy_auto_value(spec, nranks))


def _strategy_auto_value(spec, nranks=0):
    out = ctypes.c_int()
    st = _lib.gcomp_mpi_strategy_auto(_core._spec_bytes(spec), int(nranks), ctypes.byref(out))
    _check(st, f"spec {spec!r}")
    return out.value


def default_sub_bucket_bytes():
    """The library's default sub-bucket size of a Bucket (bucket_bytes=None)."""
    opt = BucketOptions()
    _lib.gcomp_mpi_bucket_options_default(ctypes.byref(opt))
    return opt.bucket_bytes


def cost_strategy(requested, spec):
    """The strategy a tensor of `spec` runs with when `requested` (a name or value) is asked
    for, as a value the cost model takes (gcomp_adapt_options.strategy, gcomp_cost_strategy:
    the MPI values): "auto" resolved by the library (gcomp_mpi_strategy_auto), the
    hierarchical bit kept."""
    v = strategy_value(requested)
    base = v & 0xFF
    if base == AUTO:
        base = _strategy_auto_value(spec, 0)
    return base | (v & HIERARCHICAL)


# ---- bounded helpers on the caller's MPI communicator ---------------------------------


def _mpi4py_comm(comm):
    if comm is None:
        return MPI.COMM_WORLD
    if isinstance(comm, Communicator):
        return comm.control
    if isinstance(comm, MPI.Comm):
        return comm
    raise TypeError(f"expected an mpi4py communicator or gradcomp.mpi.Communicator, got {type(comm).__name__}")


# Requests abandoned at a timeout, with the buffers MPI may still write into, and the
# communicators they were posted on: kept for the life of the process (never freed under
# MPI's feet, as the library does with its own).
_ABANDONED = []


def _wait_requests(reqs, timeout, what, keep=(), comm=None):
    """Waits for mpi4py requests with a deadline, polling like the library does (yield,
    then short sleeps once the wait has lasted 20 ms).  A request that never completes is
    left pending (MPI cannot cancel a collective) together with `keep` (its buffers) and
    `comm`, which must then never be freed; the caller's communicator is in an undefined
    state, as after any timeout."""
    t0 = time.monotonic()
    deadline = t0 + (timeout if timeout and timeout > 0 else 300.0)
    while not MPI.Request.Testall(reqs):
        now = time.monotonic()
        if now >= deadline:
            _ABANDONED.append((reqs, keep, comm))
            raise _err.CollectiveTimeout(
                f"gradcomp.mpi: {what} did not complete within {deadline - t0:.3g} s "
                "(a peer is dead or stalled)", status=_err.E_TIMEOUT, status_name="GCOMP_E_TIMEOUT")
        time.sleep(0 if now - t0 < 0.02 else 5e-5)


def _abandoned_on(comm):
    return any(c is comm for _, _, c in _ABANDONED)


def allgather_object(obj, comm=None, timeout=None):
    """Every rank's picklable `obj`, as a list in rank order, on every rank.

    Collective over `comm` (an mpi4py communicator, a Communicator - then over its private
    duplicate, so it never meets the caller's own collectives - or None for COMM_WORLD),
    bounded by `timeout` seconds (None: 300): non-blocking MPI_Iallgather(v)
    with a deadline, so a dead peer gives CollectiveTimeout instead of a hang (unlike
    mpi4py's own comm.allgather).  For set-up checks and diagnostics, not for bulk data."""
    import numpy as np

    c = _mpi4py_comm(comm)
    data = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
    size = c.Get_size()
    mine = np.array([data.size], np.int64)
    lens = np.zeros(size, np.int64)
    _wait_requests([c.Iallgather(mine, lens)], timeout, "allgather of object sizes", (mine, lens), c)
    counts = [int(x) for x in lens]
    displs = [0] * size
    for r in range(1, size):
        displs[r] = displs[r - 1] + counts[r - 1]
    out = np.empty(max(sum(counts), 1), np.uint8)
    req = c.Iallgatherv(data, [out, counts, displs, MPI.BYTE])
    _wait_requests([req], timeout, "allgather of objects", (data, out), c)
    return [pickle.loads(out[displs[r]:displs[r] + counts[r]].tobytes()) for r in range(size)]


def all_agree(value, comm=None, timeout=None):
    """True on every rank when every rank passed the same 64-bit `value` (an int or a
    string/bytes, hashed), False on every rank otherwise: one MPI_Iallreduce (MAX) of the
    value and its complement, bounded by `timeout`."""
    import hashlib

    import numpy as np

    if not isinstance(value, int):
        raw = value.encode() if isinstance(value, str) else bytes(value)
        value = int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "little")
    v = int(value) & ((1 << 64) - 1)
    buf = np.array([v, v ^ ((1 << 64) - 1)], np.uint64)
    out = np.zeros(2, np.uint64)
    c = _mpi4py_comm(comm)
    _wait_requests([c.Iallreduce(buf, out, op=MPI.MAX)], timeout, "agreement check", (buf, out), c)
    return int(out[0]) == int(out[1]) ^ ((1 << 64) - 1)


# ---- buffers -----------------------------------------------------------------------------


def _float_ptrs(arrays, ns, what, of="bucket", writable=True):
    if len(arrays) != len(ns):
        raise ValueError(f"{what}: expected {len(ns)} arrays (one per tensor of the {of}), got {len(arrays)}")
    ptrs = (_P * len(ns))()
    for i, (a, n) in enumerate(zip(arrays, ns)):
        ptrs[i] = _core.float_buffer(a, n, writable=writable, what=f"{what}[{i}]")[0]
    return ptrs


# ---- the communicator ---------------------------------------------------------------------


class Communicator(_core._Closable):
    """A gradcomp communicator (gcomp_mpi_comm) over an MPI communicator.

    Communicator(comm=None, timeout=None, ranks_per_node=0, setup_timeout=None): collective
    over `comm` (an mpi4py communicator; None: MPI.COMM_WORLD), which must outlive this
    object.  timeout: the default, in seconds, for every blocking call that passes none
    (None: the library's 300 s).  setup_timeout: the bound of this creation and the default
    for bucket creation (None: max(timeout, 300 s)): ranks reach set-up at very different
    times (imports, data loading), steps at nearly the same.  ranks_per_node: 0 groups ranks
    into nodes by shared memory (the hierarchical strategy's nodes); k > 0 makes nodes of
    k consecutive ranks (to exercise hierarchical on one machine).
    Raises ArgumentError, CollectiveTimeout, MPIError, OutOfMemory.
    """

    def __init__(self, comm=None, timeout=None, ranks_per_node=0, setup_timeout=None):
        comm = _mpi4py_comm(comm)
        if not MPI.Is_initialized() or MPI.Is_finalized():
            raise _err.ArgumentError("gradcomp.mpi: MPI is not initialised (or already finalised)",
                                     status=_err.E_ARG)
        if MPI.Query_thread() < MPI.THREAD_FUNNELED:
            raise _err.ArgumentError(
                "gradcomp.mpi: MPI was initialised with MPI_THREAD_SINGLE; the library needs "
                "MPI_THREAD_FUNNELED or more (mpi4py.rc.thread_level)", status=_err.E_ARG)
        self.mpi_comm = comm
        self.control = None
        o = Options()
        _lib.gcomp_mpi_options_default(ctypes.byref(o))
        if timeout is not None:
            if not timeout > 0:
                raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
            o.timeout_s = float(timeout)
        o.ranks_per_node = int(ranks_per_node)
        self.timeout = o.timeout_s
        self.setup_timeout = float(setup_timeout) if setup_timeout else max(o.timeout_s, 300.0)
        self.ranks_per_node = o.ranks_per_node
        h = _P()
        err = _native.ErrorInfo()
        self._h = None
        self._buckets = []
        st = _lib.gcomp_mpi_comm_create(ctypes.byref(h), MPI._handleof(comm), ctypes.byref(o),
                                        self.setup_timeout, ctypes.byref(err))
        _check(st, "gradcomp.mpi.Communicator", err)
        self._h = h
        # A private duplicate for this package's own small collectives (set-up checks,
        # diagnostics), so they can never match a collective the caller runs on `comm`.
        # MPI_Comm_idup: bounded like everything else.
        try:
            ctl, req = comm.Idup()
            _wait_requests([req], self.setup_timeout, "MPI_Comm_idup of the control communicator", (ctl,), comm)
        except BaseException:
            self.close()
            raise
        self.control = ctl

    _what = "gradcomp.mpi: communicator"

    @property
    def rank(self):
        return _lib.gcomp_mpi_comm_rank(self._handle())

    @property
    def size(self):
        return _lib.gcomp_mpi_comm_size(self._handle())

    @property
    def nodes(self):
        """Number of nodes (see ranks_per_node)."""
        return _lib.gcomp_mpi_comm_nodes(self._handle())

    @property
    def node(self):
        """This rank's node index."""
        return _lib.gcomp_mpi_comm_node(self._handle())

    def status(self):
        """None while usable; after a timeout or MPI error, the exception that failed it
        (not raised)."""
        err = _native.ErrorInfo()
        st = _lib.gcomp_mpi_comm_status(self._handle(), ctypes.byref(err))
        if st == _err.OK:
            return None
        try:
            _check(st, "gradcomp.mpi.Communicator", err)
        except _err.Error as e:
            return e
        return None

    @property
    def failed(self):
        return self.status() is not None

    def reset(self, timeout=None):
        """Collective: makes a failed communicator usable again (every peer must be alive and
        call it).  Buckets made before stay failed: close them and make new ones."""
        err = _native.ErrorInfo()
        st = _lib.gcomp_mpi_comm_reset(self._handle(), float(timeout or 0), ctypes.byref(err))
        _check(st, "gradcomp.mpi.Communicator.reset", err)

    def bucket(self, tensors, bucket_bytes=None, timeout=None, ps=None):
        """Bucket(self, tensors, ...): see Bucket."""
        return Bucket(self, tensors, bucket_bytes=bucket_bytes, timeout=timeout, ps=ps)

    def parameter_server(self, **options):
        """ParameterServer(self, ...): the parameter server; see ParameterServer."""
        return ParameterServer(self, **options)

    def outer(self, tensors, weights, **options):
        """Outer(self, tensors, weights, ...): the outer step of local SGD / DiLoCo; see Outer."""
        return Outer(self, tensors, weights, **options)

    # -- adaptive compression (include/gradcomp_mpi.h, "adaptive compression") --
    def adapt_decide(self, adapt, timeout=None):
        """One adaptive decision with every rank (collective; gcomp_mpi_adapt_decide):
        allgathers every rank's statistics of `adapt` (a gradcomp.Adapt, whose end_step()
        said a decision is due) on the communicator's own duplicate and decides on them in
        rank order, so every rank takes the same decision whatever it observed itself.
        Returns the indices of the tensors whose spec changed (apply each with
        Bucket.retune(..., adapt.spec(i)), in this order, on every rank).  timeout: None for
        the communicator's default.  Raises MismatchError on every rank when the ranks run
        different adaptive methods or models, CollectiveTimeout / MPIError when a peer is
        gone, LimitError, OutOfMemory."""
        from . import adapt as _adapt

        if not isinstance(adapt, _adapt.Adapt):
            raise TypeError(f"adapt_decide needs a gradcomp.Adapt, got {type(adapt).__name__}")
        fn = _need("gcomp_mpi_adapt_decide")
        ah = adapt._handle()
        changed = _S()
        err = _native.ErrorInfo()
        _check(fn(self._handle(), ah, float(timeout or 0), ctypes.byref(changed), ctypes.byref(err)),
               "gradcomp.mpi adaptive decision", err)
        return [i for i in range(len(adapt)) if _core._lib.gcomp_adapt_changed(ah, i)]

    def link_probe(self, nbytes=512 << 10, timeout=None):
        """Measures the ring's slowest link (collective; gcomp_mpi_link_probe): ring
        steps after a barrier, one of `nbytes` untimed (1 KiB..1 GiB; the C trainer probes
        512 KiB, twice a shaper's burst), three of 8 bytes, three pairs of nbytes/2 and
        nbytes, each timed by its slowest rank.  Returns (bandwidth, latency), the same on
        every rank: payload bytes per second in each direction, from the two large sizes'
        difference, and the 8-byte step's seconds, both 0 on one rank; feed them to
        Adapt.observe_link.  Raises ArgumentError for nbytes out of range,
        CollectiveTimeout / MPIError when a peer is gone."""
        fn = _need("gcomp_mpi_link_probe")
        n = operator.index(nbytes)
        if n < 0:
            raise _err.ArgumentError(f"gradcomp.mpi link_probe: nbytes = {n}: probe 1 KiB..1 GiB",
                                     status=_err.E_ARG, status_name=_core.status_name(_err.E_ARG))
        bw, lat = ctypes.c_double(), ctypes.c_double()
        err = _native.ErrorInfo()
        _check(fn(self._handle(), n, float(timeout or 0), ctypes.byref(bw), ctypes.byref(lat), ctypes.byref(err)),
               "gradcomp.mpi link probe", err)
        return bw.value, lat.value

    def close(self):
        """Frees the communicator and the buckets, outer steps and parameter servers still
        open on it (local)."""
        h = getattr(self, "_h", None)
        if not h:
            return
        for ref in list(getattr(self, "_buckets", [])):
            b = ref()
            if b is not None:
                b.close()
        self._buckets = []
        healthy = self.status() is None
        self._h = None
        if not MPI.Is_finalized():
            _lib.gcomp_mpi_comm_free(h)
            if self.control is not None and healthy and not _abandoned_on(self.control):
                self.control.Free()  # not with a request abandoned on it
        self.control = None

    def __repr__(self):
        if not self._h:
            return "gradcomp.mpi.Communicator(closed)"
        return (f"gradcomp.mpi.Communicator(rank {self.rank} of {self.size}, "
                f"{self.nodes} node(s), timeout {self.timeout:g} s)")


# ---- tensors and buckets --------------------------------------------------------------------


def _rows_cols(shape):
    """The matrix view C takes: 2-D as is, N-D as (shape[0], rest) like PowerSGD's view of a
    conv kernel, vectors (0, 0)."""
    if len(shape) < 2:
        return 0, 0
    n = math.prod(shape)
    return shape[0], (n // shape[0] if shape[0] else 0)


class Tensor:
    """One tensor of a bucket: Tensor(name, spec, shape_or_n, strategy="auto").

    shape_or_n: an int (a vector) or a shape tuple (a matrix view for codecs that need
    one, such as powersgd).  strategy: a name or value (strategy_value).  The same
    description must be given on every rank, in the same order."""

    __slots__ = ("name", "spec", "shape", "n", "rows", "cols", "strategy")

    def __init__(self, name, spec, shape, strategy="auto"):
        self.name = str(name)
        self.spec = spec
        self.shape = (int(shape),) if isinstance(shape, int) else tuple(int(d) for d in shape)
        self.n = math.prod(self.shape)
        if self.n <= 0:
            raise ValueError(f"tensor {self.name!r}: shape {self.shape} holds no element")
        self.rows, self.cols = _rows_cols(self.shape)
        self.strategy = strategy_value(strategy)

    def __repr__(self):
        return f"gradcomp.mpi.Tensor({self.name!r}, {self.spec!r}, {self.shape}, {strategy_name(self.strategy)!r})"


class _BorrowedCompressor(_core.Compressor):
    """A bucket's own compressor of one tensor: read its residual, statistics, step and
    spec, or set its epoch; never encode with it (the bucket does)."""

    def __init__(self, h, n, shape, bucket):
        self._init(h, n, shape)
        self._bucket = bucket  # keeps the C object alive

    def close(self):
        self._h = None

    def __reduce__(self):
        raise TypeError("a bucket's compressor cannot be pickled; save the bucket's state_bytes()")


class Bucket(_core._Closable):
    """A fixed list of tensors exchanged together (gcomp_mpi_bucket).

    Bucket(comm, tensors, bucket_bytes=None, timeout=None, ps=None): collective over the
    communicator; creates each tensor's compressors from its spec and runs the set-up
    check: ranks whose tensors differ in spec, size, shape, strategy or name all raise
    MismatchError naming the first tensor that differs.  tensors: Tensor objects or
    (name, spec, shape[, strategy]) tuples.  bucket_bytes: the pipelining sub-bucket size
    in dense bytes (None: 4 MiB; 0: no limit); must be the same on every rank.  timeout:
    the bound of this creation (None: the communicator's setup_timeout).
    Each rank must start the allreduces of one bucket in the same order; different
    buckets are independent (each has its own MPI communicator) and may be in flight
    together.  Used by one thread at a time.

    ps: a ParameterServer of this communicator (None: the collectives).  Every tensor is
    then a key of the server (tensors left at strategy "auto" get "ps", "hierarchical"
    gets "hierarchical:ps"; other strategies are refused by the library), and every rank,
    servers included, creates the same buckets in the same order.  On workers,
    allreduce / start / wait are MXNet's kv.pushpull (push the compressed gradient, pull
    the sum, or the weights the servers updated), init() is kv.init and pull() kv.pull; a
    server only serves them (ParameterServer.serve).  The bucket keeps its server alive;
    closing the server closes its buckets first.
    """

    def __init__(self, comm, tensors, bucket_bytes=None, timeout=None, ps=None):
        self._h = None
        self.ps = None
        if not isinstance(comm, Communicator):
            raise TypeError("Bucket needs a gradcomp.mpi.Communicator")
        if ps is not None:
            if not isinstance(ps, ParameterServer):
                raise TypeError(f"ps must be a gradcomp.mpi.ParameterServer, got {type(ps).__name__}")
            if ps.comm is not comm:
                raise ValueError("Bucket: the parameter server belongs to another communicator; create the "
                                 "bucket on the server's own (ps.comm)")
            ps_h = ps._handle()
        ts = [t if isinstance(t, Tensor) else Tensor(*t) for t in tensors]
        if not ts:
            raise ValueError("a bucket needs at least one tensor")
        self.comm = comm
        self.ps = ps
        self.tensors = ts
        self._inflight = None
        self.name = ts[0].name if len(ts) == 1 else f"{ts[0].name}..{ts[-1].name}"
        self._ns = [t.n for t in ts]
        self._specs = [_core._spec_bytes(t.spec) for t in ts]
        self._names = [t.name.encode("utf-8") for t in ts]
        desc = (TensorDesc * len(ts))()
        for i, t in enumerate(ts):
            strategy = t.strategy
            if ps is not None and strategy & 0xFF == AUTO:
                strategy |= PS  # a server's bucket carries keys only: "auto" means through it
            desc[i] = TensorDesc(self._names[i], self._specs[i], t.n, t.rows, t.cols, strategy)
        opt = BucketOptions()
        _lib.gcomp_mpi_bucket_options_default(ctypes.byref(opt))
        if bucket_bytes is not None:
            opt.bucket_bytes = int(bucket_bytes)
        if ps is not None:
            opt.ps = ps_h
        self.bucket_bytes = opt.bucket_bytes
        h = _P()
        err = _native.ErrorInfo()
        st = _lib.gcomp_mpi_bucket_create(ctypes.byref(h), comm._handle(), desc, len(ts), ctypes.byref(opt),
                                          float(timeout or comm.setup_timeout), ctypes.byref(err))
        _check(st, f"gradcomp.mpi.Bucket({self.name})", err)
        self._h = h
        comm._buckets = [r for r in comm._buckets if r() is not None]
        comm._buckets.append(weakref.ref(self))
        if ps is not None:
            # Freed before the server (gcomp_mpi_ps_free refuses a server with live buckets).
            ps._buckets = [r for r in ps._buckets if r() is not None]
            ps._buckets.append(weakref.ref(self))
        self._state_size = _lib.gcomp_mpi_bucket_state_size(h)

    # -- lifetime --
    @property
    def _what(self):
        return f"gradcomp.mpi: bucket {self.name}"

    def close(self):
        """Frees the bucket (local).  One still in flight on a healthy communicator is
        waited for first (bounded by the communicator's timeout)."""
        h = getattr(self, "_h", None)
        if not h:
            return
        if self._inflight is not None and self.comm._h and not self.comm.failed:
            try:
                self.wait()
            except _err.Error:
                pass
        self._h = None
        self._inflight = None
        if not MPI.Is_finalized():
            _lib.gcomp_mpi_bucket_free(h)

    def __len__(self):
        return len(self.tensors)

    def __repr__(self):
        via = "" if self.ps is None else ", through a parameter server"
        return f"gradcomp.mpi.Bucket({self.name!r}, {len(self.tensors)} tensor(s){via})"

    # -- the exchange --
    def _op(self, op):
        if op in (AVERAGE, "average", "avg", "mean"):
            return AVERAGE
        if op in (SUM, "sum"):
            return SUM
        raise ValueError(f"op must be 'average' or 'sum', got {op!r}")

    def allreduce(self, arrays, op="average", timeout=None):
        """Blocking allreduce: on return each array (this rank's gradient on entry; a
        float32 C-contiguous NumPy array or CPU tensor of the tensor's size, written in
        place, never copied) holds the sum or average over ranks of what every rank's
        codec sent.  Raises the call's status as an exception (NonFiniteError and
        MismatchError on every rank, CollectiveTimeout / MPIError when a peer is gone)."""
        ptrs = _float_ptrs(arrays, self._ns, "allreduce")
        err = _native.ErrorInfo()
        st = _lib.gcomp_mpi_allreduce(self._handle(), ptrs, self._op(op), float(timeout or 0), ctypes.byref(err))
        _check(st, f"gradcomp.mpi allreduce of bucket {self.name}", err)

    def start(self, arrays, op="average"):
        """Starts a non-blocking allreduce (compresses everything, sends what it can) and
        returns; the arrays are borrowed (kept alive here) until test() says done or wait()
        returns: do not read or write them before."""
        ptrs = _float_ptrs(arrays, self._ns, "start")
        err = _native.ErrorInfo()
        st = _lib.gcomp_mpi_start(self._handle(), ptrs, self._op(op), ctypes.byref(err))
        _check(st, f"gradcomp.mpi start of bucket {self.name}", err)
        self._inflight = list(arrays)

    @property
    def in_flight(self):
        return self._inflight is not None

    # -- the parameter server's own calls (workers) --
    def init(self, arrays, timeout=None):
        """kv.init (parameter-server buckets, workers; gcomp_mpi_ps_init): worker 0's arrays
        become what the servers store for the tensors (the weights in update and async
        modes), and every worker's arrays are overwritten with them; the servers' update
        counts and momentum restart at 0.  Every worker of the bucket calls it; blocking,
        bounded by `timeout` (None: the communicator's default).  Raises ArgumentError on a
        server or for a bucket without one, NonFiniteError on every worker for a NaN or Inf
        in worker 0's values (nothing stored)."""
        fn = _need("gcomp_mpi_ps_init")
        ptrs = _float_ptrs(arrays, self._ns, "init")
        err = _native.ErrorInfo()
        st = fn(self._handle(), ptrs, float(timeout or 0), ctypes.byref(err))
        _check(st, f"gradcomp.mpi init of bucket {self.name}", err)

    def pull(self, arrays, timeout=None):
        """kv.pull (parameter-server buckets, workers; gcomp_mpi_ps_pull): each array
        receives what the servers store for its tensor now, dense float32: the weights
        (update and async modes) or the last round's sum (aggregate).  Any worker alone;
        blocking, bounded by `timeout`.  Raises ArgumentError on a server, ProtocolError in
        update mode before init()."""
        fn = _need("gcomp_mpi_ps_pull")
        ptrs = _float_ptrs(arrays, self._ns, "pull")
        err = _native.ErrorInfo()
        st = fn(self._handle(), ptrs, float(timeout or 0), ctypes.byref(err))
        _check(st, f"gradcomp.mpi pull of bucket {self.name}", err)

    def test(self):
        """Makes progress without blocking; True once the allreduce has finished (an idle
        bucket: True).  Raises the allreduce's error when it finished with one."""
        done = ctypes.c_int()
        err = _native.ErrorInfo()
        st = _lib.gcomp_mpi_test(self._handle(), ctypes.byref(done), ctypes.byref(err))
        if st or done.value:
            self._inflight = None
        _check(st, f"gradcomp.mpi test of bucket {self.name}", err)
        return bool(done.value)

    def wait(self, timeout=None):
        """Waits at most `timeout` seconds (None: the communicator's default) for the
        allreduce in flight; raises its error, CollectiveTimeout on timeout (the
        communicator is then failed)."""
        err = _native.ErrorInfo()
        st = _lib.gcomp_mpi_wait(self._handle(), float(timeout or 0), ctypes.byref(err))
        self._inflight = None
        _check(st, f"gradcomp.mpi wait of bucket {self.name}", err)

    # -- adaptive compression --
    def retune(self, i, spec, timeout=None):
        """Changes tensor i's spec between two allreduces, keeping what its compressors hold
        back (gcomp_mpi_bucket_retune): the residual moves to the new spec's feedback, or,
        for a spec that keeps none (dense "none"), goes out with the next message.  The
        tensor keeps its strategy request ("auto": the new spec's own strategy).  Every
        rank must retune the same tensor to the same spec before the same allreduce (an
        adaptive decision, Communicator.adapt_decide, gives every rank the same one).  A
        switch that keeps the strategy and sub-bucket plan is local, and a rank that made
        it alone fails the next allreduce with MismatchError on every rank; any other
        switch is collective (one small allreduce on the communicator's own duplicate,
        bounded by `timeout`, None: the communicator's default): ranks that asked for
        different specs all raise MismatchError, and a rank that does not call retune
        makes the others raise CollectiveTimeout.  A retune to the spec the tensor has
        does nothing.  Raises ProtocolError while an allreduce is in flight; SpecError;
        ArgumentError (index out of range); UnsupportedError (the strategy request cannot
        carry the spec, or a switch between sparse/rsag and another strategy, which would
        drop the owners' residuals; any switch of a bucket created with ps=, refused here
        before any communication: a server's keys keep their spec); MismatchError,
        CollectiveTimeout, MPIError.  On any error the bucket is as before.  state_bytes() changes size with the specs: a
        bucket that loads a state must have the specs in force when it was saved."""
        fn = _need("gcomp_mpi_bucket_retune")
        h = self._handle()
        i = operator.index(i)
        if not 0 <= i < len(self.tensors):
            # ctypes would wrap a negative index into a huge size_t: the library would say
            # E_ARG too, but without the range.
            raise _err.ArgumentError(f"gradcomp.mpi retune of bucket {self.name}: tensor index {i} out of range "
                                     f"(0..{len(self.tensors) - 1})", status=_err.E_ARG,
                                     status_name=_core.status_name(_err.E_ARG))
        if self.ps is not None and _core.canonical(spec) != self.spec(i):
            # Refused here, alike on every rank and before any communication: the library
            # plans no retune of a server's keys (the header's parameter-server section has
            # none; its sub-bucket set-up fails with GCOMP_E_LIMIT), and a structural retune
            # is a collective of the whole communicator that serving servers never join.
            raise _err.UnsupportedError(f"gradcomp.mpi retune of tensor {self.tensors[i].name!r} to {spec!r}: "
                                        f"bucket {self.name} goes through a parameter server, whose keys keep "
                                        "the spec they were created with", status=_err.E_UNSUPPORTED,
                                        status_name=_core.status_name(_err.E_UNSUPPORTED))
        sb = _core._spec_bytes(spec)
        err = _native.ErrorInfo()
        st = fn(h, i, sb, float(timeout or 0), ctypes.byref(err))
        _check(st, f"gradcomp.mpi retune of tensor {self.tensors[i].name!r} to {spec!r}", err)
        old = self.tensors[i]
        t = Tensor(old.name, _core.canonical(spec), old.shape, old.strategy)
        self.tensors[i] = t
        self._specs[i] = _core._spec_bytes(t.spec)
        self._state_size = _lib.gcomp_mpi_bucket_state_size(h)

    def spec(self, i):
        """Tensor i's spec now, canonical: as created, or as last retuned."""
        return _core.canonical(self.tensors[operator.index(i)].spec)

    # -- what it is and what it did --
    def strategy(self, i):
        """The strategy tensor i actually uses, as a name."""
        return strategy_name(_lib.gcomp_mpi_bucket_strategy(self._handle(), int(i)))

    def strategy_value(self, i):
        return _lib.gcomp_mpi_bucket_strategy(self._handle(), int(i))

    def worker_spec(self, i):
        """The canonical spec this rank's compressors of tensor i encode with (its own seed
        for codecs whose draws only round); None on ranks that compress nothing."""
        return _s(_lib.gcomp_mpi_worker_spec(self._handle(), int(i)))

    def owner_spec(self, i):
        """The spec rsag/sparse owners re-compress tensor i's region with, else None."""
        return _s(_lib.gcomp_mpi_owner_spec(self._handle(), int(i)))

    def messages(self, i):
        """This rank's messages for tensor i in the last completed allreduce: a list of
        (message bytes, offset, count) - each message decodes to elements [offset,
        offset + count) of the tensor (gcomp_mpi_message)."""
        h = self._handle()
        out = []
        m, ln, off, cnt = _P(), _S(), _S(), _S()
        for j in range(_lib.gcomp_mpi_message_count(h, int(i))):
            st = _lib.gcomp_mpi_message(h, int(i), j, ctypes.byref(m), ctypes.byref(ln), ctypes.byref(off),
                                        ctypes.byref(cnt))
            _check(st, "gradcomp.mpi message")
            out.append((ctypes.string_at(m.value, ln.value), off.value, cnt.value))
        return out

    def message_bytes(self, i):
        """Total length of this rank's messages for tensor i in the last allreduce."""
        h = self._handle()
        m, ln = _P(), _S()
        total = 0
        for j in range(_lib.gcomp_mpi_message_count(h, int(i))):
            _lib.gcomp_mpi_message(h, int(i), j, ctypes.byref(m), ctypes.byref(ln), None, None)
            total += ln.value
        return total

    def owner_residual(self, i):
        """(copy of the owner-side residual as a NumPy array, offset) for tensor i on this
        rank (sparse and rsag owners), or None when it keeps none."""
        import numpy as np

        res = ctypes.POINTER(ctypes.c_float)()
        off, cnt = _S(), _S()
        _check(_lib.gcomp_mpi_owner_residual(self._handle(), int(i), ctypes.byref(res), ctypes.byref(off),
                                             ctypes.byref(cnt)), "gradcomp.mpi owner_residual")
        if not res or cnt.value == 0:
            return None
        return np.ctypeslib.as_array(res, shape=(cnt.value,)).copy(), off.value

    def compressor(self, i):
        """The bucket's worker compressor of tensor i (allgather, sparse, allreduce; on
        leaders for hierarchical), or None (rsag keeps one per chunk).  For reading its
        residual, stats or step and for set_epoch; never encode with it."""
        c = _lib.gcomp_mpi_compressor(self._handle(), int(i))
        if not c:
            return None
        t = self.tensors[int(i)]
        return _BorrowedCompressor(_P(c), t.n, t.shape, self)

    def set_epoch(self, epoch):
        """Fractional epoch for the schedules (DGC warm-up) of every compressor that has
        one (gcomp_compressor_set_epoch; on a parameter-server worker, every part's)."""
        h = self._handle()
        for i in range(len(self.tensors)):
            if self.ps is not None:
                cs = [_lib.gcomp_mpi_ps_compressor(h, i, j) for j in range(_lib.gcomp_mpi_ps_part_count(h, i))]
            else:
                cs = [_lib.gcomp_mpi_compressor(h, i)]
            for c in cs:
                if c:
                    _check(_core._lib.gcomp_compressor_set_epoch(c, float(epoch)), "set_epoch")

    def stats(self, i=None):
        """Counters since creation or reset_stats() (gcomp_mpi_stats) as a dict: calls,
        bytes_sent, bytes_received, node_bytes, codec_ns, wire_ns, elapsed_ns, overlap_ns.
        i=None: the whole bucket; else tensor i (its wire time is its sub-bucket's)."""
        s = Stats()
        idx = ctypes.c_size_t(-1).value if i is None else int(i)
        _check(_lib.gcomp_mpi_stats_get(self._handle(), idx, ctypes.byref(s)), "gradcomp.mpi stats")
        return {name: getattr(s, name) for name, _ in Stats._fields_}

    def reset_stats(self):
        _lib.gcomp_mpi_stats_reset(self._handle())

    # -- checkpoints --
    def state_bytes(self):
        """This rank's state (residuals, momentum, PowerSGD's Q, step counters) as a
        versioned, checksummed blob (gcomp_mpi_bucket_save_state).  Local.  Allowed on a
        failed bucket; ProtocolError while an allreduce is in flight on a healthy one."""
        h = self._handle()
        cap = self._state_size
        buf = ctypes.create_string_buffer(max(cap, 1))
        ln = _S()
        err = _native.ErrorInfo()
        _check(_lib.gcomp_mpi_bucket_save_state(h, buf, cap, ctypes.byref(ln), ctypes.byref(err)),
               f"gradcomp.mpi state of bucket {self.name}", err)
        return ctypes.string_at(buf, ln.value)

    def load_state(self, blob):
        """Loads a blob saved by state_bytes() on this rank, for this bucket (untrusted:
        checked; on any error nothing changes).  All ranks must load blobs of one step."""
        bp, bl = _core.byte_buffer(blob, what="state")
        err = _native.ErrorInfo()
        _check(_lib.gcomp_mpi_bucket_load_state(self._handle(), bp, bl, ctypes.byref(err)),
               f"gradcomp.mpi load_state of bucket {self.name}", err)


# ---- the outer step: local SGD, DiLoCo, Streaming DiLoCo, SparseLoCo -------------------------


_UINT_MAX = (1 << 32) - 1
_OPTIMIZERS = {"sgd": OUTER_SGD, "nesterov": OUTER_NESTEROV}


def wait_all(buckets, timeout=None):
    """Waits for the allreduces in flight on all `buckets` at once (gcomp_mpi_wait_each):
    a bucket whose exchange takes several rounds (PowerSGD's two factors, a sparse
    allreduce) sends its next round as soon as its last one is in, instead of when a wait
    on it begins, so on a link with latency the round trips overlap.  The results are
    those of waiting on each in turn.  Idle buckets count as finished.  Every bucket is
    waited for, also after an error; returns a list with, for each bucket in order, None
    or the error its wait would have raised (CollectiveTimeout on timeout, which fails the
    communicator; `timeout` None: the communicator's default)."""
    buckets = list(buckets)
    n = len(buckets)
    each = (_native.ErrorInfo * n)()
    if n:
        handles = (_P * n)(*[b._handle() for b in buckets])
        err = _native.ErrorInfo()
        st = _lib.gcomp_mpi_wait_each(handles, n, float(timeout or 0), each, None, ctypes.byref(err))
        if st != 0 and all(e.status == 0 for e in each):  # not from one bucket
            _check(st, "gradcomp.mpi wait_all", err)
    errors = []
    for b, e in zip(buckets, each):
        b._inflight = None
        try:
            _check(e.status, f"gradcomp.mpi wait of bucket {b.name}", e)
            errors.append(None)
        except _err.Error as x:
            errors.append(x)
    return errors


def _c_int_option(value, what, lo, hi, owner="gradcomp.mpi.Outer"):
    """An integer option for a C field of range lo..hi.  Only what C cannot see is checked
    here: ctypes would wrap -1 into a huge unsigned value (and 2**32 into 0) without a
    word; the library judges every value that reaches it intact (H = 0, a delay >= H)."""
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an int, got {type(value).__name__}") from None
    if not lo <= v <= hi:
        raise _err.ArgumentError(f"{owner}: {what} = {v} does not fit the C field ({lo}..{hi})",
                                 status=_err.E_ARG, status_name=_core.status_name(_err.E_ARG))
    return v


def _outer_optimizer(optimizer):
    if isinstance(optimizer, str):
        v = _OPTIMIZERS.get(optimizer.lower())
        if v is None:
            raise _err.ArgumentError(f"gradcomp.mpi.Outer: optimizer {optimizer!r}: use 'sgd' or 'nesterov'",
                                     status=_err.E_ARG, status_name=_core.status_name(_err.E_ARG))
        return v
    return _c_int_option(optimizer, "optimizer", -(1 << 31), (1 << 31) - 1)  # C refuses unknown values


class Outer(_core._Closable):
    """The outer step of local SGD / DiLoCo over a fixed list of tensors (gcomp_mpi_outer).

    Outer(comm, tensors, weights, local_steps=None, optimizer=None, lr=None, momentum=None,
    fragments=None, delay=None, mix=None, ef_decay=None, fragment_of=None,
    bucket_bytes=None, timeout=None), or comm.outer(tensors, weights, ...): collective over
    the communicator.  Every rank takes H = local_steps inner optimizer steps on its own and
    calls step(weights) after each; when a sync is due the ranks average their
    pseudo-gradients (the weights of the last sync minus the weights now), compressed by
    each tensor's spec (feedback=ef keeps the residual from sync to sync), and an outer
    optimizer applies the average to the weights of the last sync, which every rank then
    continues from, bit for bit (include/gradcomp_mpi.h, "The outer step", has the formulas
    and the streaming schedule; docs/LOCAL_SGD.md the methods).

    tensors: Tensor objects or (name, spec, shape[, strategy]) tuples, as for Bucket.
    weights: the initial weights, one float32 C-contiguous NumPy array or CPU tensor per
    tensor (read only here, never kept); bit-identical on every rank (checked: a hash).
    Options, None for the library's default (gcomp_mpi_outer_options_default):
      local_steps  H >= 1, inner steps between two syncs of a fragment (16)
      optimizer    "nesterov" (DiLoCo) or "sgd", or OUTER_NESTEROV / OUTER_SGD ("nesterov")
      lr           outer learning rate, finite and > 0 (0.7)
      momentum     outer momentum in [0, 1) (0.9)
      fragments    F, 1..min(len(tensors), H): Streaming DiLoCo when > 1 (1)
      delay        inner steps a sync overlaps, 0..H-1; -1: 0 for F = 1, ceil(H / F) else (-1)
      mix          Streaming DiLoCo's alpha in [0, 1): the live weights' share at a sync (0)
      ef_decay     SparseLoCo's residual decay beta in [0, 1] (1: plain feedback=ef)
      fragment_of  one fragment index per tensor (None: balanced by size)
      bucket_bytes the fragments' buckets' sub-bucket size (4 MiB)
    timeout: the bound of this creation (None: the communicator's setup_timeout).
    Every option must be the same on every rank.  The library judges the values: a bad
    one raises its status with its reason on every rank that was given it (ArgumentError
    for H = 0 or lr <= 0, SpecError for error feedback around a codec that is no
    contraction, MismatchError for options or initial weights that differ across ranks,
    and on the other ranks when one rank's arguments are bad).  What only Python can get
    wrong (a dtype, a length, an int that does not fit its C field) raises TypeError /
    ValueError on that rank, which still takes part in the library's set-up check, so the
    other ranks raise MismatchError instead of waiting for it.

    The weights are the caller's between calls: step() and flush() read and write them in
    place (never copied); the object owns copies of all else.  global_weights(i) and
    average(i) return copies (the object's arrays change at every sync and are freed by
    close(), so a view could outlive them).  Used by one thread at a time.
    """

    def __init__(self, comm, tensors, weights, local_steps=None, optimizer=None, lr=None, momentum=None,
                 fragments=None, delay=None, mix=None, ef_decay=None, fragment_of=None, bucket_bytes=None,
                 timeout=None):
        if not isinstance(comm, Communicator):
            raise TypeError("Outer needs a gradcomp.mpi.Communicator")
        self._h = None
        create = _need("gcomp_mpi_outer_create")
        ch = comm._handle()
        self.comm = comm
        setup_timeout = float(timeout or comm.setup_timeout)
        try:
            ts = [t if isinstance(t, Tensor) else Tensor(*t) for t in tensors]
            if not ts:
                raise ValueError("an outer step needs at least one tensor")
            self.tensors = ts
            self.name = ts[0].name if len(ts) == 1 else f"{ts[0].name}..{ts[-1].name}"
            self._ns = [t.n for t in ts]
            self._specs = [_core._spec_bytes(t.spec) for t in ts]
            self._names = [t.name.encode("utf-8") for t in ts]
            desc = (TensorDesc * len(ts))()
            for i, t in enumerate(ts):
                desc[i] = TensorDesc(self._names[i], self._specs[i], t.n, t.rows, t.cols, t.strategy)
            ptrs = _float_ptrs(weights, self._ns, "Outer weights", of="outer step", writable=False)
            opt = OuterOptions()
            _lib.gcomp_mpi_outer_options_default(ctypes.byref(opt))
            if local_steps is not None:
                opt.local_steps = _c_int_option(local_steps, "local_steps", 0, _UINT_MAX)
            if optimizer is not None:
                opt.optimizer = _outer_optimizer(optimizer)
            if lr is not None:
                opt.lr = float(lr)
            if momentum is not None:
                opt.momentum = float(momentum)
            if fragments is not None:
                opt.fragments = _c_int_option(fragments, "fragments", 0, _UINT_MAX)
            if delay is not None:
                opt.delay = _c_int_option(delay, "delay", -(1 << 31), (1 << 31) - 1)
            if mix is not None:
                opt.mix = float(mix)
            if ef_decay is not None:
                opt.ef_decay = float(ef_decay)
            if bucket_bytes is not None:
                opt.bucket_bytes = _c_int_option(bucket_bytes, "bucket_bytes", 0, _core._SIZE_MAX)
            self._fragment_of = None
            if fragment_of is not None:
                fo = [_c_int_option(f, f"fragment_of[{i}]", 0, _UINT_MAX) for i, f in enumerate(fragment_of)]
                if len(fo) != len(ts):
                    raise ValueError(f"fragment_of: expected {len(ts)} entries (one per tensor), got {len(fo)}")
                self._fragment_of = (ctypes.c_uint * len(fo))(*fo)
                opt.fragment_of = self._fragment_of
        except (TypeError, ValueError, OverflowError):
            # This rank's own arguments are bad: it still takes part in the set-up check
            # (the library refuses NULL weights locally and shares that verdict), so the
            # other ranks raise MismatchError now instead of CollectiveTimeout later.
            try:
                count = len(tensors)
            except TypeError:
                count = 0
            h = _P()
            create(ctypes.byref(h), ch, None, count, None, None, setup_timeout, None)
            if h:  # pragma: no cover - the library refuses NULL weights
                _lib.gcomp_mpi_outer_free(h)
            raise
        self.optimizer = "nesterov" if opt.optimizer == OUTER_NESTEROV else (
            "sgd" if opt.optimizer == OUTER_SGD else opt.optimizer)
        self.lr, self.momentum, self.mix, self.ef_decay = opt.lr, opt.momentum, opt.mix, opt.ef_decay
        self.bucket_bytes = opt.bucket_bytes
        h = _P()
        err = _native.ErrorInfo()
        st = create(ctypes.byref(h), ch, desc, len(ts), ptrs, ctypes.byref(opt), setup_timeout, ctypes.byref(err))
        _check(st, f"gradcomp.mpi.Outer({self.name})", err)
        self._h = h
        comm._buckets = [r for r in comm._buckets if r() is not None]
        comm._buckets.append(weakref.ref(self))  # closed before the communicator, as buckets

    # -- lifetime --
    @property
    def _what(self):
        return f"gradcomp.mpi: outer step {self.name}"

    def close(self):
        """Frees the object and its fragments' buckets (local).  A sync in flight on a
        healthy communicator is waited for first (bounded by the communicator's timeout),
        so close on every rank at the same step, or flush() first."""
        h = getattr(self, "_h", None)
        if not h:
            return
        self._h = None
        if not MPI.Is_finalized():
            _lib.gcomp_mpi_outer_free(h)

    def __len__(self):
        return self.count

    def __repr__(self):
        if not self._h:
            return "gradcomp.mpi.Outer(closed)"
        return (f"gradcomp.mpi.Outer({self.name!r}, {self.count} tensor(s), H={self.local_steps} "
                f"{self.optimizer} lr={self.lr:g} momentum={self.momentum:g}, {self.fragments} fragment(s), "
                f"delay {self.delay})")

    def _tensor(self, i):
        i = operator.index(i)
        if not 0 <= i < len(self._ns):
            raise IndexError(f"tensor index {i} out of range (0..{len(self._ns) - 1})")
        return i

    def _fragment(self, f):
        f = operator.index(f)
        nf = self.fragments
        if not 0 <= f < nf:
            raise IndexError(f"fragment index {f} out of range (0..{nf - 1})")
        return f

    # -- the outer step --
    def step(self, weights, timeout=None):
        """Call after every inner optimizer step, with the live weights (float32
        C-contiguous NumPy arrays or CPU tensors, one per tensor; read and written in
        place, never copied).  Counts the step; completes the syncs due (their outer
        update is written into the weights), moves the others forward and starts the
        fragments due.  Between syncs it only counts.  Returns the number of fragments
        whose sync completed in this call (0 between syncs).  Raises the status of a
        failed exchange (that sync is dropped, as include/gradcomp_mpi.h says):
        NonFiniteError on every rank for a NaN weight, CollectiveTimeout / MPIError when
        a peer is gone.  timeout: None for the communicator's default."""
        h = self._handle()
        ptrs = _float_ptrs(weights, self._ns, "Outer.step", of="outer step")
        before = self._syncs_total(h)
        err = _native.ErrorInfo()
        st = _lib.gcomp_mpi_outer_step(h, ptrs, float(timeout or 0), ctypes.byref(err))
        _check(st, f"gradcomp.mpi outer step of {self.name}", err)
        return self._syncs_total(h) - before

    def _syncs_total(self, h):
        return sum(_lib.gcomp_mpi_outer_syncs(h, f) for f in range(_lib.gcomp_mpi_outer_fragments(h)))

    def progress(self):
        """Moves the exchanges in flight forward without blocking: call it now and then
        during the inner steps when streaming (MPI progresses only inside MPI calls).  A
        failed exchange is raised by the step() that completes it, not here."""
        err = _native.ErrorInfo()
        _check(_lib.gcomp_mpi_outer_progress(self._handle(), ctypes.byref(err)),
               f"gradcomp.mpi outer progress of {self.name}", err)

    def flush(self, weights, timeout=None):
        """Synchronises every fragment now (collective; mix ignored): every rank ends with
        the same weights, written into `weights`.  For the end of training or an
        evaluation that must see all of it.  Raises as step()."""
        ptrs = _float_ptrs(weights, self._ns, "Outer.flush", of="outer step")
        err = _native.ErrorInfo()
        st = _lib.gcomp_mpi_outer_flush(self._handle(), ptrs, float(timeout or 0), ctypes.byref(err))
        _check(st, f"gradcomp.mpi outer flush of {self.name}", err)

    # -- what it holds --
    def _copy_out(self, p, i, out, what):
        import numpy as np

        n = self._ns[i]
        if out is None:
            return np.ctypeslib.as_array(p, shape=(n,)).copy()
        ptr, _ = _core.float_buffer(out, n, writable=True, what=what)
        ctypes.memmove(ptr, p, 4 * n)
        return out

    def global_weights(self, i, out=None):
        """w_sync of tensor i: the weights of its fragment's last sync, bit-identical on
        every rank (the model to evaluate between syncs).  A copy: a new float32 array of
        n elements, or written into `out` (a float32 C-contiguous array of n) and returned."""
        i = self._tensor(i)
        p = _lib.gcomp_mpi_outer_global(self._handle(), i)
        return self._copy_out(p, i, out, "global_weights out")

    def average(self, i, out=None):
        """d of tensor i from its fragment's last completed sync (the ranks' averaged
        pseudo-gradient before the outer optimizer; zeros before the first sync), as a copy
        (or into `out`); None while its fragment's exchange is in flight.  For tests and
        diagnostics."""
        i = self._tensor(i)
        p = _lib.gcomp_mpi_outer_average(self._handle(), i)
        if not p:
            return None
        return self._copy_out(p, i, out, "average out")

    @property
    def count(self):
        """Number of tensors."""
        return _lib.gcomp_mpi_outer_count(self._handle())

    @property
    def fragments(self):
        """Number of fragments F."""
        return _lib.gcomp_mpi_outer_fragments(self._handle())

    @property
    def local_steps(self):
        """H, as resolved at creation."""
        return _lib.gcomp_mpi_outer_local_steps(self._handle())

    @property
    def delay(self):
        """The inner steps between a fragment's start and its completion, as resolved."""
        return _lib.gcomp_mpi_outer_delay(self._handle())

    @property
    def steps(self):
        """Inner steps counted so far (by step(); a loaded state sets it)."""
        return _lib.gcomp_mpi_outer_steps(self._handle())

    def offset(self, f):
        """Fragment f's offset: it starts after the inner steps t >= 1 with
        t mod H = offset mod H."""
        return _lib.gcomp_mpi_outer_offset(self._handle(), self._fragment(f))

    def syncs(self, f):
        """Syncs of fragment f completed and applied (flush included)."""
        return _lib.gcomp_mpi_outer_syncs(self._handle(), self._fragment(f))

    def in_flight(self, f=None):
        """True while fragment f (None: any fragment) has a sync started and not yet
        applied."""
        h = self._handle()
        fs = range(_lib.gcomp_mpi_outer_fragments(h)) if f is None else [self._fragment(f)]
        return any(_lib.gcomp_mpi_outer_in_flight(h, k) for k in fs)

    def locate(self, i):
        """(fragment, index in that fragment's bucket) of tensor i."""
        fr, idx = _S(), _S()
        _check(_lib.gcomp_mpi_outer_locate(self._handle(), self._tensor(i), ctypes.byref(fr), ctypes.byref(idx)),
               "gradcomp.mpi outer locate")
        return fr.value, idx.value

    def compressor(self, i):
        """The worker compressor of tensor i in its fragment's bucket (its error-feedback
        residual, stats, step), or None where the strategy keeps none per tensor (rsag).
        Read it, never encode with it; valid while this object is open."""
        h = self._handle()
        f, idx = self.locate(i)
        c = _lib.gcomp_mpi_compressor(_lib.gcomp_mpi_outer_bucket(h, f), idx)
        if not c:
            return None
        t = self.tensors[self._tensor(i)]
        return _BorrowedCompressor(_P(c), t.n, t.shape, self)

    def stats(self):
        """The fragments' bucket counters summed (gcomp_mpi_outer_stats) as a dict, as
        Bucket.stats(): bytes_sent is what this rank sent over the run."""
        s = Stats()
        _check(_lib.gcomp_mpi_outer_stats(self._handle(), ctypes.byref(s)), "gradcomp.mpi outer stats")
        return {name: getattr(s, name) for name, _ in Stats._fields_}

    # -- checkpoints --
    def state_bytes(self, timeout=None):
        """This rank's state (step count, per tensor w_sync and the outer momentum, per
        fragment its syncs and an average not applied yet, the buckets' residuals) as a
        versioned, CRC-checked blob (gcomp_mpi_outer_save_state).  Exchanges in flight are
        waited for first (at most `timeout`; None: the communicator's default) and their
        averages saved, so every rank must save at the same step.  Save it with the live
        weights and the inner optimizer's state."""
        h = self._handle()
        cap = _lib.gcomp_mpi_outer_state_size(h)
        buf = ctypes.create_string_buffer(max(cap, 1))
        ln = _S()
        err = _native.ErrorInfo()
        _check(_lib.gcomp_mpi_outer_save_state(h, buf, cap, ctypes.byref(ln), float(timeout or 0), ctypes.byref(err)),
               f"gradcomp.mpi state of outer step {self.name}", err)
        return ctypes.string_at(buf, ln.value)

    def load_state(self, blob):
        """Loads a blob saved by state_bytes() on this rank into an object created with the
        same tensors, options and communicator shape (local; untrusted: checked, and on any
        error nothing changes: CorruptMessage, StateError, MismatchError, ProtocolError
        while a sync is in flight).  It then continues bit for bit, given the live weights
        saved with the blob."""
        bp, bl = _core.byte_buffer(blob, what="state")
        err = _native.ErrorInfo()
        _check(_lib.gcomp_mpi_outer_load_state(self._handle(), bp, bl, ctypes.byref(err)),
               f"gradcomp.mpi load_state of outer step {self.name}", err)


# ---- the parameter server: MXNet's kvstore, BytePS -------------------------------------------


_PS_MODES = {"sync": PS_SYNC, "async": PS_ASYNC}
_PS_OPTIMIZER_KEYS = ("lr", "momentum", "weight_decay", "rescale", "nesterov")
_INT_MIN, _INT_MAX = -(1 << 31), (1 << 31) - 1


def _ps_arg_error(msg):
    return _err.ArgumentError(f"gradcomp.mpi.ParameterServer: {msg}", status=_err.E_ARG,
                              status_name=_core.status_name(_err.E_ARG))


def _ps_mode(mode):
    if isinstance(mode, str):
        v = _PS_MODES.get(mode.lower())
        if v is None:
            raise _ps_arg_error(f"mode {mode!r}: use 'sync' or 'async'")
        return v
    return _c_int_option(mode, "mode", _INT_MIN, _INT_MAX, "gradcomp.mpi.ParameterServer")  # C judges it


def _ps_optimizer(base, optimizer, given, what):
    """A gcomp_mpi_ps_optimizer: `base` (a PSOptimizer) with the entries of the `optimizer`
    dict or the keywords in `given` (not both) replaced.  The library judges the values."""
    given = {k: v for k, v in given.items() if v is not None}
    if optimizer is not None:
        if given:
            raise TypeError(f"{what}: give the optimizer as a dict or as keywords "
                            f"({', '.join(sorted(given))}), not both")
        if not isinstance(optimizer, dict):
            raise TypeError(f"{what}: optimizer must be a dict of {', '.join(_PS_OPTIMIZER_KEYS)}, "
                            f"got {type(optimizer).__name__}")
        unknown = sorted(set(optimizer) - set(_PS_OPTIMIZER_KEYS))
        if unknown:
            raise TypeError(f"{what}: unknown optimizer setting(s) {unknown}; the servers' SGD has "
                            f"{', '.join(_PS_OPTIMIZER_KEYS)}")
        given = {k: v for k, v in optimizer.items() if v is not None}
    out = PSOptimizer(base.lr, base.momentum, base.weight_decay, base.rescale, base.nesterov)
    for k, v in given.items():
        if k == "nesterov":
            out.nesterov = _c_int_option(int(v) if isinstance(v, bool) else v, "nesterov", _INT_MIN, _INT_MAX,
                                         what)
        else:
            try:
                setattr(out, k, float(v))
            except (TypeError, ValueError):
                raise TypeError(f"{what}: optimizer {k} must be a number, got {type(v).__name__}") from None
    return out


def _ps_optimizer_dict(o):
    return {"lr": o.lr, "momentum": o.momentum, "weight_decay": o.weight_decay, "rescale": o.rescale,
            "nesterov": bool(o.nesterov)}


class ParameterServer(_core._Closable):
    """A parameter server over a communicator (gcomp_mpi_ps): MXNet's kvstore (dist_sync,
    dist_async, dist_sync_device) and BytePS on one MPI job.

    ParameterServer(comm, servers=None, server_ranks=None, mode="sync", update=False,
    optimizer=None, lr=None, momentum=None, weight_decay=None, rescale=None, nesterov=None,
    pull=None, part_bytes=None, max_staleness=None, timeout=None), or
    comm.parameter_server(...): collective over the communicator, every rank with the same
    options.  Of its P ranks, S serve (by default the last S) and W = P - S are workers;
    every rank runs the same program and asks its role (is_server, index).  Buckets made
    with ps=this server (comm.bucket(tensors, ps=ps)) carry its keys; every rank, servers
    included, creates the same buckets in the same order (their set-up check compares the
    servers' tensors too).  Then servers call serve(), which answers the workers until
    every one of them has called shutdown(); workers call the buckets' allreduce (or
    start / wait: kv.pushpull), init (kv.init) and pull (kv.pull).
    include/gradcomp_mpi.h ("Parameter server") and docs/PARAMETER_SERVER.md describe the
    modes, partitioning, compression, faults and checkpoints.

    Options, None for the library's default (gcomp_mpi_ps_options_default):
      servers        S, 1 <= S < P (1; len(server_ranks) when those are given)
      server_ranks   S distinct ranks that serve (None: the last S)
      mode           "sync" (dist_sync: every worker's push, decoded in worker order, per
                     round) or "async" (dist_async: each push applied on arrival), or
                     PS_SYNC / PS_ASYNC ("sync")
      update         True: the servers hold the weights and apply their SGD step (kv.set_
                     optimizer; implied by async), and pushpull returns the new weights;
                     False (default): they aggregate, and pushpull returns the sum (times
                     1/W for "average") - BytePS, the optimizer on the workers
      optimizer      the servers' SGD for every key, a dict with any of lr (0.01), momentum
                     (0), weight_decay (0), rescale (1: MXNet's rescale_grad), nesterov
                     (False); or the same as keywords lr=, momentum=, ... (not both)
      pull           None (dense pulls, MXNet), "same" (each key's own spec) or a spec for
                     every key: compressed pulls with the servers' own error feedback
                     (BytePS; sync aggregate mode only)
      part_bytes     the largest part of a key, in dense bytes (4 MiB, BytePS's)
      max_staleness  async: pushes staler than this are dropped (0: never)
    timeout: the bound of this creation (None: the communicator's setup_timeout).
    The library judges the values: a bad one raises its status with its reason on every
    rank that was given it (ArgumentError for S >= P, a compressed pull with update, ...;
    SpecError for a bad pull spec), and MismatchError on every rank when the ranks'
    options differ or another rank's are bad.  What only Python can get wrong (a type, an
    int that does not fit its C field, an unknown mode name) raises TypeError /
    ArgumentError on that rank, which still takes part in the library's set-up check, so
    the other ranks raise MismatchError instead of waiting for it.

    Lifetime: a server must outlive its buckets (the C library refuses to free one with
    live buckets).  Each bucket keeps a reference to its server, and close() closes the
    server's buckets still open first (an exchange in flight is waited for, as
    Bucket.close does), then the server; the communicator's close() closes both.  So
    `with comm.parameter_server() as ps:` around the buckets' use is always safe.
    Used by one thread at a time, with its buckets.
    """

    def __init__(self, comm, servers=None, server_ranks=None, mode="sync", update=False, optimizer=None,
                 lr=None, momentum=None, weight_decay=None, rescale=None, nesterov=None, pull=None,
                 part_bytes=None, max_staleness=None, timeout=None):
        if not isinstance(comm, Communicator):
            raise TypeError("ParameterServer needs a gradcomp.mpi.Communicator")
        self._h = None
        self._buckets = []
        create = _need("gcomp_mpi_ps_create")
        ch = comm._handle()
        self.comm = comm
        setup_timeout = float(timeout or comm.setup_timeout)
        what = "gradcomp.mpi.ParameterServer"
        opt = PSOptions()
        _lib.gcomp_mpi_ps_options_default(ctypes.byref(opt))
        try:
            self._server_ranks = None
            if server_ranks is not None:
                sr = [_c_int_option(r, f"server_ranks[{i}]", _INT_MIN, _INT_MAX, what)
                      for i, r in enumerate(server_ranks)]
                if servers is None:
                    servers = len(sr)
                elif _c_int_option(servers, "servers", _INT_MIN, _INT_MAX, what) != len(sr):
                    raise _ps_arg_error(f"servers = {servers} but {len(sr)} server_ranks given")
                self._server_ranks = (ctypes.c_int * max(len(sr), 1))(*sr)
                opt.server_ranks = self._server_ranks
            if servers is not None:
                opt.servers = _c_int_option(servers, "servers", _INT_MIN, _INT_MAX, what)
            opt.mode = _ps_mode(mode)
            opt.update = 1 if update else 0
            opt.optimizer = _ps_optimizer(opt.optimizer, optimizer, dict(lr=lr, momentum=momentum,
                                          weight_decay=weight_decay, rescale=rescale, nesterov=nesterov), what)
            self._pull = None
            if pull is not None and pull != "":
                self._pull = _core._spec_bytes(pull)
                opt.pull = self._pull
            if part_bytes is not None:
                opt.part_bytes = _c_int_option(part_bytes, "part_bytes", 0, _core._SIZE_MAX, what)
            if max_staleness is not None:
                opt.max_staleness = _c_int_option(max_staleness, "max_staleness", 0, (1 << 64) - 1, what)
        except (TypeError, ValueError, OverflowError):
            # This rank's own arguments are bad: it still takes part in the set-up check with
            # options the library refuses locally (0 servers) and shares as a failure, so the
            # other ranks raise MismatchError now instead of CollectiveTimeout later.
            bad = PSOptions()
            _lib.gcomp_mpi_ps_options_default(ctypes.byref(bad))
            bad.servers = 0
            h = _P()
            create(ctypes.byref(h), ch, ctypes.byref(bad), setup_timeout, None)
            if h:  # pragma: no cover - the library refuses 0 servers
                _lib.gcomp_mpi_ps_free(h)
            raise
        h = _P()
        err = _native.ErrorInfo()
        st = create(ctypes.byref(h), ch, ctypes.byref(opt), setup_timeout, ctypes.byref(err))
        _check(st, what, err)
        self._h = h
        self.mode = "async" if opt.mode == PS_ASYNC else "sync"
        self.update = bool(opt.update) or opt.mode == PS_ASYNC
        self.pull_spec = _s(self._pull)
        self.part_bytes = opt.part_bytes
        self.max_staleness = opt.max_staleness
        self._opt = opt.optimizer
        comm._buckets = [r for r in comm._buckets if r() is not None]
        comm._buckets.append(weakref.ref(self))  # closed before the communicator, as buckets

    # -- lifetime --
    _what = "gradcomp.mpi: parameter server"

    def close(self):
        """Closes the server's buckets still open (an exchange in flight is waited for
        first, as Bucket.close does), then frees the server (local).  A worker that has not
        called shutdown() leaves the servers serving until their timeout: shut down first."""
        h = getattr(self, "_h", None)
        if not h:
            return
        for ref in list(self._buckets):
            b = ref()
            if b is not None:
                b.close()
        self._buckets = []
        if MPI.Is_finalized() or not self.comm._h:
            self._h = None  # the communicator went first (the interpreter's exit): leak it
            return
        st = _lib.gcomp_mpi_ps_free(h)
        if st:  # pragma: no cover - every bucket of it was closed above
            _core._raise(st, "gradcomp.mpi.ParameterServer.close",
                         "a bucket created on this server outside this object is still open")
        self._h = None

    def _live_buckets(self):
        self._buckets = [r for r in self._buckets if r() is not None and r()._h]
        return [r() for r in self._buckets]

    def __repr__(self):
        if not self._h:
            return "gradcomp.mpi.ParameterServer(closed)"
        role = f"server {self.index}" if self.is_server else f"worker {self.index}"
        kind = "update" if self.update else "aggregate"
        pull = f", pull {self.pull_spec!r}" if self.pull_spec else ""
        return (f"gradcomp.mpi.ParameterServer({self.workers} worker(s) + {self.servers} server(s), "
                f"{self.mode} {kind}{pull}; this rank: {role})")

    # -- roles --
    @property
    def is_server(self):
        """True on the ranks that serve."""
        return _lib.gcomp_mpi_ps_is_server(self._handle()) == 1

    @property
    def index(self):
        """This rank's index among the workers, or among the servers (kv.rank)."""
        return _lib.gcomp_mpi_ps_index(self._handle())

    @property
    def workers(self):
        """W, the number of workers (kv.num_workers)."""
        return _lib.gcomp_mpi_ps_workers(self._handle())

    @property
    def servers(self):
        """S, the number of servers."""
        return _lib.gcomp_mpi_ps_servers(self._handle())

    @property
    def server_ranks(self):
        """The communicator ranks of the servers, by server index."""
        h = self._handle()
        return [_lib.gcomp_mpi_ps_server_rank(h, s) for s in range(_lib.gcomp_mpi_ps_servers(h))]

    @property
    def worker_ranks(self):
        """The communicator ranks of the workers, by worker index."""
        h = self._handle()
        return [_lib.gcomp_mpi_ps_worker_rank(h, w) for w in range(_lib.gcomp_mpi_ps_workers(h))]

    @property
    def optimizer(self):
        """The servers' SGD settings given at creation, as a dict (per key:
        set_optimizer)."""
        return _ps_optimizer_dict(self._opt)

    # -- the session --
    def serve(self, timeout=None):
        """Servers: serves every bucket of this server until every worker has called
        shutdown() (async: or was declared lost), then returns.  Create the buckets first.
        `timeout` (None: the communicator's default) bounds a sync round, the silence of
        the whole job, and in async mode the silence of one worker.  Call it again for the
        next session.  Raises ArgumentError on a worker, CollectiveTimeout when a worker did
        not push in sync mode (the communicator is then failed), ProtocolError when already
        serving.  A refused push is not an error of serve: see stats()["refused"]."""
        err = _native.ErrorInfo()
        st = _lib.gcomp_mpi_ps_serve(self._handle(), float(timeout or 0), ctypes.byref(err))
        _check(st, "gradcomp.mpi ParameterServer.serve", err)

    def shutdown(self, timeout=None):
        """Workers: tells every server this worker is done with the session (its buckets
        must be idle).  serve() returns on the servers once every worker has.  Raises
        ArgumentError on a server, ProtocolError with a bucket in flight."""
        err = _native.ErrorInfo()
        st = _lib.gcomp_mpi_ps_shutdown(self._handle(), float(timeout or 0), ctypes.byref(err))
        _check(st, "gradcomp.mpi ParameterServer.shutdown", err)

    def set_lr(self, lr):
        """Workers: the learning rate this worker's next pushes carry (a schedule; the
        servers' update modes use it).  None: the servers' own optimizer lr.  In sync mode
        every worker of a round must send the same value (MismatchError otherwise)."""
        v = math.nan if lr is None else float(lr)
        if _lib.gcomp_mpi_ps_set_lr(self._handle(), v):
            raise _ps_arg_error(f"set_lr({lr!r}): the learning rate must be finite and >= 0 (None: the "
                                "servers' own)")

    # -- keys --
    def _key(self, bucket, i, what):
        if not isinstance(bucket, Bucket):
            raise TypeError(f"{what}: expected a gradcomp.mpi.Bucket, got {type(bucket).__name__}")
        if bucket.ps is not self:
            raise ValueError(f"{what}: bucket {bucket.name} is not a bucket of this parameter server")
        h = bucket._handle()
        if i is None:
            return h, None
        i = operator.index(i)
        if not 0 <= i < len(bucket.tensors):
            raise IndexError(f"{what}: tensor index {i} out of range (0..{len(bucket.tensors) - 1})")
        return h, i

    def set_optimizer(self, bucket, i=None, optimizer=None, lr=None, momentum=None, weight_decay=None,
                      rescale=None, nesterov=None):
        """Servers: the SGD of tensor i of `bucket` (None: every tensor), e.g. no weight
        decay for biases (MXNet's wd_mult).  Settings not given keep the server's options
        (ParameterServer.optimizer); a dict or keywords, as at creation.  Local; call it
        before serve(), on every server.  Raises ArgumentError on a worker or for values
        the library refuses."""
        what = "gradcomp.mpi ParameterServer.set_optimizer"
        h, i = self._key(bucket, i, what)
        o = _ps_optimizer(self._opt, optimizer, dict(lr=lr, momentum=momentum, weight_decay=weight_decay,
                                                     rescale=rescale, nesterov=nesterov), what)
        idx = ctypes.c_size_t(-1).value if i is None else i
        if _lib.gcomp_mpi_ps_set_optimizer(h, idx, ctypes.byref(o)):
            if not self.is_server:
                raise _ps_arg_error(f"set_optimizer: rank {self.comm.rank} is a worker; the servers' "
                                    "optimizer is set on the servers")
            raise _ps_arg_error(f"set_optimizer: refused {_ps_optimizer_dict(o)}: lr finite and >= 0, momentum "
                                "in [0, 1), weight_decay finite and >= 0, rescale finite")

    def parts(self, bucket, i):
        """The partition of tensor i of `bucket` (gcomp_mpi_ps_part): a list of
        (offset, n, server) - part j covers elements [offset, offset + n) and lives on
        server index `server` (server_ranks[server] is its rank).  The same on every rank;
        empty on hierarchical non-leaders."""
        h, i = self._key(bucket, i, "gradcomp.mpi ParameterServer.parts")
        out = []
        off, n, srv = _S(), _S(), _I()
        for j in range(_lib.gcomp_mpi_ps_part_count(h, i)):
            _check(_lib.gcomp_mpi_ps_part(h, i, j, ctypes.byref(off), ctypes.byref(n), ctypes.byref(srv)),
                   "gradcomp.mpi ParameterServer.parts")
            out.append((off.value, n.value, srv.value))
        return out

    def compressor(self, bucket, i, j=0):
        """Workers: the compressor of part j of tensor i (its residual, statistics, or
        set_epoch), or None on servers.  Read it, never encode with it; valid while the
        bucket is open."""
        h, i = self._key(bucket, i, "gradcomp.mpi ParameterServer.compressor")
        parts = self.parts(bucket, i)
        j = operator.index(j)
        c = _lib.gcomp_mpi_ps_compressor(h, i, j) if 0 <= j < len(parts) else None
        if not c:
            return None
        return _BorrowedCompressor(_P(c), parts[j][1], None, bucket)

    def residual(self, bucket, i):
        """Workers: a copy of this worker's error-feedback residual of tensor i (its parts'
        residuals at their offsets; zeros where a part keeps none), a float32 array."""
        import numpy as np

        h, i = self._key(bucket, i, "gradcomp.mpi ParameterServer.residual")
        out = np.zeros(bucket._ns[i], np.float32)
        if _lib.gcomp_mpi_ps_residual(h, i, out.ctypes.data):
            raise _ps_arg_error(f"residual: rank {self.comm.rank} keeps no worker residual of tensor {i} "
                                "(a server, or a hierarchical non-leader)")
        return out

    def stored(self, bucket, i):
        """Servers: (a copy of what this server stores for tensor i - the weights, or the
        last round's sum - at the parts it owns, zeros elsewhere; the number of parts it
        owns).  For tests and checks."""
        import numpy as np

        h, i = self._key(bucket, i, "gradcomp.mpi ParameterServer.stored")
        out = np.zeros(bucket._ns[i], np.float32)
        parts = _S()
        if _lib.gcomp_mpi_ps_stored(h, i, out.ctypes.data, ctypes.byref(parts)):
            raise _ps_arg_error(f"stored: rank {self.comm.rank} is a worker; only servers store keys")
        return out, parts.value

    def version(self, bucket, i):
        """Workers: the servers' update count of tensor i as of this worker's last reply
        (sync rounds, or async pushes applied; the smallest over its parts)."""
        h, i = self._key(bucket, i, "gradcomp.mpi ParameterServer.version")
        return _lib.gcomp_mpi_ps_version(h, i)

    # -- statistics --
    @staticmethod
    def _stats_dict(s):
        return {name: getattr(s, name) for name, _ in PSStats._fields_ if name != "reserved"}

    def stats(self, peer=None):
        """This rank's counters since creation or reset_stats() (gcomp_mpi_ps_stats) as a
        dict: pushes, applied, pulls, bytes_pushed, bytes_pulled, busy_ns, queue_max,
        queue_sum, stale_max, stale_sum, dropped, refused, workers_lost.  A worker's own
        traffic, or a server's with every worker; peer=RANK restricts it to that rank."""
        s = PSStats()
        p = -1 if peer is None else operator.index(peer)
        if _lib.gcomp_mpi_ps_stats_get(self._handle(), p, ctypes.byref(s)):
            raise _ps_arg_error(f"stats: peer {peer!r} is not a rank of the communicator (0..{self.comm.size - 1})")
        return self._stats_dict(s)

    def key_stats(self, bucket, i):
        """This rank's counters of tensor i of `bucket` (its parts), as stats()."""
        h, i = self._key(bucket, i, "gradcomp.mpi ParameterServer.key_stats")
        s = PSStats()
        _check(_lib.gcomp_mpi_ps_key_stats(h, i, ctypes.byref(s)), "gradcomp.mpi ParameterServer.key_stats")
        return self._stats_dict(s)

    def reset_stats(self):
        _lib.gcomp_mpi_ps_stats_reset(self._handle())

    # -- checkpoints --
    def save_state(self, bucket=None):
        """What this rank keeps as a server for a bucket's keys beyond its compressors
        (weights, momentum, last sums, update counts, per-key optimizers;
        gcomp_mpi_ps_save_state: versioned, CRC-checked, local), as bytes; a worker's is small:
        the update count of its last reply per part, which its next async push's staleness
        counts from.  bucket=None: a list with one blob per open bucket of this server, in
        creation order.  The compressors (worker residuals, the servers' pull residuals)
        are in each bucket's own Bucket.state_bytes(): save both.  Not while serving or
        with an exchange in flight (ProtocolError): servers save between sessions."""
        if bucket is None:
            return [self.save_state(b) for b in self._live_buckets()]
        h, _ = self._key(bucket, None, "gradcomp.mpi ParameterServer.save_state")
        cap = _lib.gcomp_mpi_ps_state_size(h)
        buf = ctypes.create_string_buffer(max(cap, 1))
        ln = _S()
        err = _native.ErrorInfo()
        _check(_lib.gcomp_mpi_ps_save_state(h, buf, cap, ctypes.byref(ln), ctypes.byref(err)),
               f"gradcomp.mpi parameter-server state of bucket {bucket.name}", err)
        return ctypes.string_at(buf, ln.value)

    def load_state(self, state, bucket=None):
        """Loads what save_state() saved on this rank: a blob into `bucket`, or (bucket=None)
        the list of blobs into this server's open buckets, in creation order, all or
        nothing.  Untrusted: CorruptMessage, StateError (a non-finite weight), MismatchError
        (another rank, layout, tensor or partition) and nothing changes; ProtocolError
        while serving.  Load each bucket's Bucket.load_state() too; fresh objects on the
        same layout then resume bit for bit."""
        if bucket is None:
            buckets = self._live_buckets()
            blobs = list(state)
            if len(blobs) != len(buckets):
                raise _err.MismatchError(
                    f"gradcomp.mpi ParameterServer.load_state: {len(blobs)} blob(s) for {len(buckets)} open "
                    "bucket(s) of this server", status=_err.E_MISMATCH, status_name="GCOMP_E_MISMATCH")
            before = [self.save_state(b) for b in buckets]
            done = 0
            try:
                for b, blob in zip(buckets, blobs):
                    self.load_state(blob, b)
                    done += 1
            except BaseException:
                for b, blob in zip(buckets[:done], before):
                    self.load_state(blob, b)
                raise
            return
        h, _ = self._key(bucket, None, "gradcomp.mpi ParameterServer.load_state")
        bp, bl = _core.byte_buffer(state, what="state")
        err = _native.ErrorInfo()
        _check(_lib.gcomp_mpi_ps_load_state(h, bp, bl, ctypes.byref(err)),
               f"gradcomp.mpi parameter-server load_state of bucket {bucket.name}", err)
