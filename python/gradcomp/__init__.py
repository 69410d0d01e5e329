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

The library is found through $GRADCOMP_LIB, the package's directory, the build tree
(<repo>/build*/libgradcomp.so) or the system's library path, in that order.
"""

from .errors import (  # noqa: F401
    ArgumentError,
    BufferTooSmall,
    CorruptMessage,
    Error,
    LimitError,
    MismatchError,
    NonFiniteError,
    OutOfMemory,
    ProtocolError,
    SpecError,
    StateError,
    UnsupportedError,
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
    # `gradcomp.torch` is imported on first use so the core works without PyTorch.
    if name == "torch":
        import importlib

        return importlib.import_module(".torch", __name__)
    raise AttributeError(f"module 'gradcomp' has no attribute {name!r}")
