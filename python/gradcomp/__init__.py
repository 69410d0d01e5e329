"""gradcomp - gradient compression for data-parallel training, from Python.

A thin layer over libgradcomp (ctypes; the compression runs in C):

    import gradcomp, numpy as np
    c = gradcomp.Compressor("topk:density=0.01,feedback=ef", n=1 << 20)
    msg = c.encode(grad)                    # bytes; grad is any float32 buffer, not copied
    acc = np.zeros(1 << 20, np.float32)
    gradcomp.decode_add(msg, acc, 0.5)      # on every receiver

    gradcomp.list_codecs()                  # codecs and their parameters, from C's tables
    gradcomp.canonical("topk")              # 'topk:density=0.01,values=f32,feedback=none,seed=0'

PyTorch DDP: `hook, state = gradcomp.torch.hook("powersgd:rank=4")`, then
`ddp_model.register_comm_hook(state, hook)` (see gradcomp/torch.py).

Over MPI (mpirun -np P python3 train.py; needs mpi4py): gradcomp.mpi (communicators and
buckets of libgradcomp_mpi: allgather, sparse allreduce, allreduce, rsag, hierarchical) and
gradcomp.torch.DistributedOptimizer (Horovod-style; gradcomp/optimizer.py).  Neither is
imported here, so `import gradcomp` never initialises MPI.

The library is found through $GRADCOMP_LIB, the package's directory, the build tree
(<repo>/build*/libgradcomp.so) or the system's library path, in that order.
"""

from .errors import (  # noqa: F401
    ArgumentError,
    BufferTooSmall,
    CollectiveTimeout,
    CommunicatorFailed,
    CorruptMessage,
    Error,
    IOFailure,
    LimitError,
    MismatchError,
    MPIError,
    NonFiniteError,
    OutOfMemory,
    ProtocolError,
    SpecError,
    StateError,
    UnsupportedError,
    UnsupportedFormat,
)
from .core import (  # noqa: F401
    HEADER_SIZE,
    LIBRARY_PATH,
    Compressor,
    Policy,
    canonical,
    codec_info,
    codec_names,
    common_params,
    decode_add,
    describe,
    inspect,
    library_version,
    list_codecs,
    spec_bytes_estimate,
    spec_fingerprint,
    spec_get,
    spec_get_number,
    spec_set,
    status_name,
)

from .adapt import Adapt  # noqa: F401,E402

__version__ = "0.1.0"


def __getattr__(name):
    # `gradcomp.torch` and `gradcomp.mpi` are imported on first use, so the core works
    # without PyTorch and never initialises MPI by itself.
    if name in ("torch", "mpi"):
        import importlib

        return importlib.import_module("." + name, __name__)
    raise AttributeError(f"module 'gradcomp' has no attribute {name!r}")
