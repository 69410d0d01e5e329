"""_native.py - finds libgradcomp.so and declares its C API for ctypes.

Why ctypes and not a CPython extension: the package then needs no compiler, no Python
headers and no build step, works on any CPython 3 that can load the shared library, and
the same files run from the source tree (PYTHONPATH=python) and from an installed copy.
The cost is ~1 us per call, negligible next to encoding a tensor.  ctypes drops the GIL
around every foreign call, so a DDP hook's decode on a gloo thread overlaps the next
bucket's encode on the main thread.

The structures below mirror include/gradcomp.h field for field (ctypes applies the same
alignment rules as the C compiler); tests/python/test_core.py checks their sizes and
offsets against the header with a C compiler when one is present.

Library search order (first hit wins):
  1. $GRADCOMP_LIB (a path to the .so; an error when it does not exist),
  2. the package's own directory (an installed copy: `cmake --install` puts it there),
  3. the build tree next to the sources: <repo>/build*/libgradcomp.so, newest first,
     leaving out AddressSanitizer / ThreadSanitizer builds (`make check` leaves one in
     build-asan/): their runtime must be loaded before anything else, so loading them into
     a plain interpreter aborts it; set $GRADCOMP_LIB, with the runtime in LD_PRELOAD, to
     use one,
  4. ctypes.util.find_library("gradcomp") (the system's library path).
"""

import ctypes
import ctypes.util
import glob
import mmap
import os

c_size_p = ctypes.POINTER(ctypes.c_size_t)


class ParamInfo(ctypes.Structure):
    """gcomp_param_info."""

    _fields_ = [
        ("name", ctypes.c_char_p),
        ("type", ctypes.c_int),
        ("min", ctypes.c_double),
        ("max", ctypes.c_double),
        ("min_exclusive", ctypes.c_int),
        ("deflt", ctypes.c_char_p),
        ("choices", ctypes.c_char_p),
        ("help", ctypes.c_char_p),
    ]


class CodecInfo(ctypes.Structure):
    """gcomp_codec_info."""

    _fields_ = [
        ("name", ctypes.c_char_p),
        ("id", ctypes.c_uint16),
        ("flags", ctypes.c_uint),
        ("help", ctypes.c_char_p),
        ("params", ctypes.POINTER(ParamInfo)),
        ("nparams", ctypes.c_size_t),
    ]


class ErrorInfo(ctypes.Structure):
    """gcomp_error."""

    _fields_ = [("status", ctypes.c_int), ("message", ctypes.c_char * 256)]


class MessageInfo(ctypes.Structure):
    """gcomp_message_info."""

    _fields_ = [
        ("format_version", ctypes.c_uint),
        ("codec_id", ctypes.c_uint16),
        ("codec_name", ctypes.c_char_p),
        ("flags", ctypes.c_uint32),
        ("n", ctypes.c_uint64),
        ("payload_len", ctypes.c_uint32),
        ("fingerprint", ctypes.c_uint64),
        ("payload_crc", ctypes.c_uint32),
        ("elements_sent", ctypes.c_uint64),
        ("index_coding", ctypes.c_char_p),
        ("value_coding", ctypes.c_char_p),
    ]


class SpecInfo(ctypes.Structure):
    """gcomp_spec_info."""

    _fields_ = [
        ("codec", ctypes.POINTER(CodecInfo)),
        ("values", ctypes.c_char_p),
        ("feedback", ctypes.c_char_p),
        ("flags", ctypes.c_uint),
        ("value_type", ctypes.c_int),
        ("value_bits", ctypes.c_double),
        ("density", ctypes.c_double),
        ("phases", ctypes.c_uint),
        ("seed", ctypes.c_uint64),
        ("fingerprint", ctypes.c_uint64),
    ]


class Stats(ctypes.Structure):
    """gcomp_stats."""

    _fields_ = [
        ("messages", ctypes.c_uint64),
        ("bytes_in", ctypes.c_uint64),
        ("bytes_out", ctypes.c_uint64),
        ("elements_sent", ctypes.c_uint64),
        ("encode_ns", ctypes.c_uint64),
        ("decoded", ctypes.c_uint64),
        ("decode_ns", ctypes.c_uint64),
    ]


class TensorDesc(ctypes.Structure):
    """gcomp_tensor_desc."""

    _fields_ = [
        ("name", ctypes.c_char_p),
        ("n", ctypes.c_size_t),
        ("rows", ctypes.c_size_t),
        ("cols", ctypes.c_size_t),
    ]


class LayerPlan(ctypes.Structure):
    """gcomp_layer_plan."""

    _fields_ = [
        ("spec", ctypes.c_char_p),
        ("rule", ctypes.c_int),
        ("reason", ctypes.c_char_p),
        ("pattern", ctypes.c_char_p),
        ("bytes", ctypes.c_size_t),
        ("dense_bytes", ctypes.c_size_t),
    ]


class AdaptOptions(ctypes.Structure):
    """gcomp_adapt_options."""

    _fields_ = [
        ("total_steps", ctypes.c_uint64),
        ("workers", ctypes.c_int),
        ("nodes", ctypes.c_int),
        ("strategy", ctypes.c_void_p),
        ("strategy_ctx", ctypes.c_void_p),
        ("calibration", ctypes.c_void_p),
        ("min_elements", ctypes.c_size_t),
        ("dense_spec", ctypes.c_char_p),
    ]


class AdaptReport(ctypes.Structure):
    """gcomp_adapt_report."""

    _fields_ = [
        ("decisions", ctypes.c_uint64),
        ("step", ctypes.c_uint64),
        ("bandwidth", ctypes.c_double),
        ("latency", ctypes.c_double),
        ("compute_s", ctypes.c_double),
        ("predicted_step_s", ctypes.c_double),
        ("metric", ctypes.c_double),
        ("uniform_level", ctypes.c_int),
        ("budget", ctypes.c_double),
        ("critical", ctypes.c_size_t),
        ("error", ctypes.c_double),
        ("error_uniform", ctypes.c_double),
        ("measure_s", ctypes.c_double),
        ("next_measure_step", ctypes.c_uint64),
    ]


_P = ctypes.c_void_p
_S = ctypes.c_size_t
_I = ctypes.c_int

# name: (restype, argtypes).  Functions that are optional (added by later issues) are
# listed in OPTIONAL; the package works without them and says so when they are used.
PROTOTYPES = {
    "gcomp_status_str": (ctypes.c_char_p, [_I]),
    "gcomp_version": (ctypes.c_char_p, []),
    "gcomp_codec_count": (_S, []),
    "gcomp_codec_at": (ctypes.POINTER(CodecInfo), [_S]),
    "gcomp_codec_find": (ctypes.POINTER(CodecInfo), [ctypes.c_char_p]),
    "gcomp_codec_by_id": (ctypes.POINTER(CodecInfo), [ctypes.c_uint16]),
    "gcomp_common_params": (ctypes.POINTER(ParamInfo), [c_size_p]),
    "gcomp_spec_canonical": (
        _I,
        [ctypes.c_char_p, ctypes.c_char_p, _S, ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ErrorInfo)],
    ),
    "gcomp_spec_describe": (_I, [ctypes.c_char_p, _S, ctypes.POINTER(SpecInfo), ctypes.POINTER(ErrorInfo)]),
    "gcomp_spec_get": (_I, [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, _S, ctypes.POINTER(ErrorInfo)]),
    "gcomp_spec_get_number": (
        _I,
        [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_double), ctypes.POINTER(ErrorInfo)],
    ),
    "gcomp_spec_set": (
        _I,
        [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, _S, ctypes.POINTER(ErrorInfo)],
    ),
    "gcomp_compressor_create": (
        _I,
        [ctypes.POINTER(_P), ctypes.c_char_p, _S, _S, _S, ctypes.POINTER(ErrorInfo)],
    ),
    "gcomp_compressor_free": (None, [_P]),
    "gcomp_compressor_spec": (ctypes.c_char_p, [_P]),
    "gcomp_compressor_fingerprint": (ctypes.c_uint64, [_P]),
    "gcomp_compressor_codec": (ctypes.POINTER(CodecInfo), [_P]),
    "gcomp_compressor_size": (_S, [_P]),
    "gcomp_encode_bound": (_S, [_P]),
    "gcomp_encode": (_I, [_P, _P, _P, _S, c_size_p]),
    "gcomp_compressor_decode_add": (_I, [_P, _P, _S, _P, ctypes.c_float]),
    "gcomp_decode_add": (_I, [_P, _S, _P, _S, ctypes.c_float]),
    "gcomp_message_inspect": (_I, [_P, _S, ctypes.POINTER(MessageInfo)]),
    "gcomp_state_bound": (_S, [_P]),
    "gcomp_state_save": (_I, [_P, _P, _S, c_size_p]),
    "gcomp_state_load": (_I, [_P, _P, _S]),
    "gcomp_compressor_from_state": (_I, [ctypes.POINTER(_P), _P, _S, ctypes.POINTER(ErrorInfo)]),
    "gcomp_state_reset": (None, [_P]),
    "gcomp_compressor_residual": (ctypes.POINTER(ctypes.c_float), [_P]),
    "gcomp_compressor_step": (ctypes.c_uint64, [_P]),
    "gcomp_compressor_set_epoch": (_I, [_P, ctypes.c_double]),
    "gcomp_compressor_stats": (None, [_P, ctypes.POINTER(Stats)]),
    "gcomp_compressor_stats_reset": (None, [_P]),
    # layer-wise policy (src/adapt/policy.c)
    "gcomp_policy_create": (_I, [ctypes.POINTER(_P), ctypes.c_char_p, ctypes.POINTER(ErrorInfo)]),
    "gcomp_policy_free": (None, [_P]),
    "gcomp_policy_choose": (_I, [_P, ctypes.POINTER(TensorDesc), ctypes.POINTER(LayerPlan), ctypes.POINTER(ErrorInfo)]),
    "gcomp_spec_bytes_estimate": (_I, [ctypes.c_char_p, _S, _S, _S, c_size_p, ctypes.POINTER(ErrorInfo)]),
    # low-rank multi-phase protocol (src/lowrank/powersgd.c)
    "gcomp_lowrank_begin": (_I, [_P, _P, ctypes.POINTER(_P), c_size_p, ctypes.POINTER(ctypes.c_uint)]),
    "gcomp_lowrank_after_p": (_I, [_P, ctypes.POINTER(_P), c_size_p]),
    "gcomp_lowrank_after_q": (_I, [_P, ctypes.POINTER(_P), c_size_p]),
    "gcomp_lowrank_finish": (_I, [_P, _P, ctypes.c_float]),
    "gcomp_lowrank_abort": (None, [_P]),
    "gcomp_lowrank_residual": (_I, [_P, _P]),
    "gcomp_lowrank_shape": (_I, [_P, ctypes.POINTER(ctypes.c_uint), c_size_p, c_size_p]),
    # retune and adaptive controllers (src/core/retune.c, src/adapt/adapt*.c)
    "gcomp_compressor_retune": (_I, [_P, ctypes.c_char_p, ctypes.POINTER(ErrorInfo)]),
    "gcomp_adapt_create": (
        _I,
        [ctypes.POINTER(_P), ctypes.c_char_p, ctypes.POINTER(TensorDesc), _S,
         ctypes.POINTER(AdaptOptions), ctypes.POINTER(ErrorInfo)],
    ),
    "gcomp_adapt_free": (None, [_P]),
    "gcomp_adapt_count": (_S, [_P]),
    "gcomp_adapt_spec": (ctypes.c_char_p, [_P, _S]),
    "gcomp_adapt_managed": (_I, [_P, _S]),
    "gcomp_adapt_level": (_I, [_P, _S]),
    "gcomp_adapt_changed": (_I, [_P, _S]),
    "gcomp_adapt_uses": (_I, [_P, ctypes.c_char_p]),
    "gcomp_adapt_ladder_size": (_S, [_P]),
    "gcomp_adapt_candidate": (ctypes.c_char_p, [_P, _S]),
    "gcomp_adapt_fingerprint": (ctypes.c_uint64, [_P]),
    "gcomp_adapt_interval": (ctypes.c_uint64, [_P]),
    "gcomp_adapt_measure_interval": (ctypes.c_uint64, [_P]),
    "gcomp_adapt_predicted": (ctypes.c_double, [_P, ctypes.c_size_t]),
    "gcomp_adapt_observe": (_I, [_P, _S, _P, _P]),
    "gcomp_adapt_measuring": (_I, [_P]),
    "gcomp_adapt_observe_compute": (None, [_P, ctypes.c_double, ctypes.c_double, ctypes.c_double]),
    "gcomp_adapt_observe_link": (None, [_P, ctypes.c_double, ctypes.c_double]),
    "gcomp_adapt_observe_link_time": (None, [_P, ctypes.c_double]),
    "gcomp_adapt_link_due": (_I, [_P]),
    "gcomp_adapt_observe_metric": (None, [_P, ctypes.c_double]),
    "gcomp_adapt_observe_lr": (None, [_P, ctypes.c_double]),
    "gcomp_adapt_set_course": (_I, [_P, _P, _P, _S, ctypes.POINTER(ErrorInfo)]),
    "gcomp_adapt_set_exchanges": (_I, [_P, _P, _S, _S, ctypes.POINTER(ErrorInfo)]),
    "gcomp_adapt_state_bound": (_S, [_P]),
    "gcomp_adapt_save_state": (_I, [_P, _P, _S, c_size_p]),
    "gcomp_adapt_load_state": (_I, [_P, _P, _S, ctypes.POINTER(ErrorInfo)]),
    "gcomp_adapt_end_step": (None, [_P, ctypes.POINTER(_I)]),
    "gcomp_adapt_stats_size": (_S, [_P]),
    "gcomp_adapt_stats": (_I, [_P, _P, _S, c_size_p]),
    "gcomp_adapt_decide": (_I, [_P, _P, _S, _I, c_size_p, ctypes.POINTER(ErrorInfo)]),
    "gcomp_adapt_get_report": (None, [_P, ctypes.POINTER(AdaptReport)]),
}
OPTIONAL = {
    "gcomp_spec_describe",
    "gcomp_spec_get",
    "gcomp_spec_get_number",
    "gcomp_spec_set",
    "gcomp_policy_create",
    "gcomp_policy_free",
    "gcomp_policy_choose",
    "gcomp_spec_bytes_estimate",
    "gcomp_lowrank_begin",
    "gcomp_lowrank_after_p",
    "gcomp_lowrank_after_q",
    "gcomp_lowrank_finish",
    "gcomp_lowrank_abort",
    "gcomp_lowrank_residual",
    "gcomp_lowrank_shape",
    "gcomp_compressor_retune",
}
# The adaptive controllers came with the retune: optional as a group.
OPTIONAL |= {name for name in PROTOTYPES if name.startswith("gcomp_adapt_")}


def needs_early_runtime(path):
    """True when the library at path needs ASan's or TSan's runtime and this process was not
    started with it: the runtime then aborts the process at load time (it must come first in
    the initial library list), which no OSError can catch."""
    preload = os.environ.get("LD_PRELOAD", "")
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return any(m.find(rt) >= 0 and rt.decode() not in preload
                       for rt in (b"libasan.so", b"libtsan.so"))
    except (OSError, ValueError):
        return False


def built_libraries(pattern):
    """The libraries of the build trees matching pattern, newest first, without those that
    need a sanitizer runtime this process lacks."""
    built = [p for p in glob.glob(pattern) if not needs_early_runtime(p)]
    return sorted(built, key=os.path.getmtime, reverse=True)


def _candidates():
    env = os.environ.get("GRADCOMP_LIB")
    if env:
        if not os.path.exists(env):
            raise OSError(f"GRADCOMP_LIB={env!r} does not exist")
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    out = sorted(glob.glob(os.path.join(here, "libgradcomp.so*")))
    repo = os.path.dirname(os.path.dirname(here))
    out += built_libraries(os.path.join(repo, "build*", "libgradcomp.so"))
    found = ctypes.util.find_library("gradcomp")
    if found:
        out.append(found)
    return out


def load():
    """Loads the library and sets every prototype; returns (CDLL, path)."""
    tried = []
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            tried.append(f"{path}: {e}")
            continue
        for name, (res, args) in PROTOTYPES.items():
            fn = getattr(lib, name, None)
            if fn is None:
                if name in OPTIONAL:
                    continue
                raise OSError(f"{path} lacks {name}: too old for this package")
            fn.restype = res
            fn.argtypes = args
        return lib, path
    raise OSError(
        "gradcomp: cannot find libgradcomp.so; build it (cmake --build) or set GRADCOMP_LIB"
        + ("".join("\n  " + t for t in tried) if tried else "")
    )


def declare(lib, name, restype, argtypes):
    """Declares an optional function; returns it, or None when this library lacks it."""
    fn = getattr(lib, name, None)
    if fn is not None:
        fn.restype = restype
        fn.argtypes = argtypes
    return fn
