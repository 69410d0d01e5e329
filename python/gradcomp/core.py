"""core.py - the gradcomp C API as Python objects: Compressor, decode_add, inspect, codecs.

Buffers are passed to C by address, never copied: a NumPy array (anything with
__array_interface__), a CPU torch tensor (data_ptr), or any object with the buffer
protocol.  Each must be C-contiguous float32 with exactly the tensor's element count;
anything else is a TypeError (wrong kind or dtype) or ValueError (size, layout, read-only
where the call writes).  Silent conversion was rejected: a hidden copy of a gradient
would cost a full memory pass per call and, for outputs, would write into the copy
instead of the caller's tensor.

Messages go out as `bytes` (encode) or straight into a caller's byte buffer
(encode_into, which the torch hook uses to write into the tensor it all-gathers).
"""

import ctypes
import math
import operator

from . import _native
from . import errors as _err

_lib, LIBRARY_PATH = _native.load()

# Codec flag bits (gcomp_codec_info.flags), from include/gradcomp.h.
FLAG_NAMES = {
    1 << 0: "sparse",
    1 << 1: "linear",
    1 << 2: "stochastic",
    1 << 3: "quantizer",
    1 << 4: "multiphase",
    1 << 5: "needs_shape",
}
# Spec property bits (gcomp_spec_info.flags, GCOMP_SPEC_*), from include/gradcomp.h.
SPEC_FLAG_NAMES = {
    1 << 0: "sparse",
    1 << 1: "linear",
    1 << 2: "seeded_positions",
    1 << 3: "private_draws",
    1 << 4: "shared_draws",
    1 << 5: "multiphase",
    1 << 6: "needs_shape",
    1 << 7: "quantizer",
    1 << 8: "contraction",
    1 << 9: "saturating",
    1 << 10: "feedback",
    1 << 11: "momentum",
    1 << 12: "fixed_feedback",
    1 << 13: "unbiased",
}
_VALUE_TYPES = {0: None, 1: "f32", 2: "f16", 3: "bf16"}
_PARAM_TYPES = {0: "int", 1: "float", 2: "enum", 3: "bool"}
HEADER_SIZE = 40  # GCOMP_HEADER_SIZE: the message header in wire format version 1
_SIZE_MAX = ctypes.c_size_t(-1).value


def _size_arg(v):
    """A count for a size_t parameter.  ctypes wraps ints modulo 2**64 (2**64 arrived as 0,
    "n must be > 0"), so anything above SIZE_MAX is passed as SIZE_MAX: above every limit,
    the library then names its own (GCOMP_E_LIMIT, "at most 2^32-1")."""
    return v if v <= _SIZE_MAX else _SIZE_MAX


def _s(b):
    return b.decode("utf-8", "replace") if b is not None else None


def status_name(status):
    """gcomp_status_str(status)."""
    return _s(_lib.gcomp_status_str(int(status)))


def library_version():
    """The loaded libgradcomp's version string."""
    return _s(_lib.gcomp_version())


def _raise(status, context=None, detail=None):
    name = status_name(status)
    msg = detail or name
    if context:
        msg = f"{context}: {msg}"
    if detail and name not in msg:
        msg = f"{msg} ({name})"
    raise _err.error_class(status)(msg, status=status, status_name=name)


def _check(status, context=None, err=None):
    if status != _err.OK:
        detail = None
        if err is not None and err.status == status and err.message:
            detail = _s(err.message)
        _raise(status, context, detail)


# ---- buffers --------------------------------------------------------------------------


def _is_torch_tensor(obj):
    t = type(obj)
    return t.__module__.startswith("torch") and hasattr(obj, "data_ptr") and hasattr(obj, "is_contiguous")


def _numpy():
    import numpy

    return numpy


def float_buffer(obj, n=None, writable=False, what="array"):
    """Address and element count of a C-contiguous float32 buffer, without copying.

    Returns (address, count).  The caller keeps `obj` alive for the duration of the call.
    """
    if _is_torch_tensor(obj):
        if str(obj.dtype) != "torch.float32":
            raise TypeError(f"{what}: expected a float32 tensor, got {obj.dtype}")
        if obj.device.type != "cpu":
            raise ValueError(f"{what}: expected a CPU tensor, got device {obj.device}")
        if not obj.is_contiguous():
            raise ValueError(f"{what}: tensor is not contiguous (call .contiguous() first)")
        ptr, count = obj.data_ptr(), obj.numel()
    elif hasattr(obj, "__array_interface__"):
        ai = obj.__array_interface__
        if ai.get("typestr") not in ("<f4", "=f4"):
            raise TypeError(f"{what}: expected float32 data, got typestr {ai.get('typestr')!r}")
        shape = tuple(ai.get("shape", ()))
        count = math.prod(shape)
        strides = ai.get("strides")
        if strides is not None and count > 1:
            expect, acc = [], 4
            for d in reversed(shape):
                expect.append(acc)
                acc *= d
            expect.reverse()
            if any(s != e for s, e, d in zip(strides, expect, shape) if d > 1):
                raise ValueError(f"{what}: array is not C-contiguous (use numpy.ascontiguousarray)")
        if ai.get("mask") is not None:
            raise TypeError(f"{what}: masked arrays are not supported")
        ptr, readonly = ai["data"]
        if writable and readonly:
            raise ValueError(f"{what}: array is read-only")
    else:
        try:
            mv = memoryview(obj)
        except TypeError:
            raise TypeError(
                f"{what}: expected a float32 NumPy array, CPU torch tensor or buffer, got "
                f"{type(obj).__name__}"
            ) from None
        if mv.format not in ("f", "<f", "=f") or mv.itemsize != 4:
            raise TypeError(f"{what}: expected float32 items, got format {mv.format!r}")
        if not mv.c_contiguous:
            raise ValueError(f"{what}: buffer is not C-contiguous")
        if writable and mv.readonly:
            raise ValueError(f"{what}: buffer is read-only")
        count = mv.nbytes // 4
        ptr = _numpy().frombuffer(mv, dtype="<f4").__array_interface__["data"][0] if count else 0
    if n is not None and count != n:
        raise ValueError(f"{what}: expected {n} float32 elements, got {count}")
    if count and not ptr:
        raise ValueError(f"{what}: NULL data pointer")
    return ptr, count


def byte_buffer(obj, writable=False, what="message"):
    """Address and size in bytes of a contiguous byte buffer, without copying.

    Accepts bytes, bytearray, memoryview, NumPy arrays and CPU torch tensors (any dtype,
    as raw bytes).  Returns (address_or_bytes, nbytes): for `bytes` the object itself,
    which ctypes passes by address.
    """
    if isinstance(obj, bytes):
        if writable:
            raise TypeError(f"{what}: bytes are immutable; pass a bytearray or tensor")
        return obj, len(obj)
    if _is_torch_tensor(obj):
        if obj.device.type != "cpu":
            raise ValueError(f"{what}: expected a CPU tensor, got device {obj.device}")
        if not obj.is_contiguous():
            raise ValueError(f"{what}: tensor is not contiguous")
        return obj.data_ptr(), obj.numel() * obj.element_size()
    if hasattr(obj, "__array_interface__"):
        np = _numpy()
        a = np.asarray(obj)
        if not a.flags.c_contiguous:
            raise ValueError(f"{what}: array is not C-contiguous")
        if writable and not a.flags.writeable:
            raise ValueError(f"{what}: array is read-only")
        return a.__array_interface__["data"][0], a.nbytes
    try:
        mv = memoryview(obj)
    except TypeError:
        raise TypeError(f"{what}: expected bytes or a byte buffer, got {type(obj).__name__}") from None
    if not mv.c_contiguous:
        raise ValueError(f"{what}: buffer is not contiguous")
    if writable and mv.readonly:
        raise ValueError(f"{what}: buffer is read-only")
    if mv.nbytes == 0:
        return None, 0
    if not mv.readonly:
        return ctypes.addressof(ctypes.c_char.from_buffer(mv)), mv.nbytes
    return _numpy().frombuffer(mv, dtype="u1").__array_interface__["data"][0], mv.nbytes


# ---- specs and codecs -----------------------------------------------------------------


def _spec_bytes(spec):
    if isinstance(spec, bytes):
        b = spec
    elif isinstance(spec, str):
        b = spec.encode("utf-8")
    else:
        raise TypeError(f"spec must be a str, got {type(spec).__name__}")
    if b"\0" in b:
        # C would read the text up to the NUL and accept that prefix as the whole spec.
        raise _err.SpecError(f"spec {spec!r}: contains a NUL character", status=_err.E_SPEC,
                             status_name=status_name(_err.E_SPEC))
    return b


def _canonical(spec):
    cap = 1024
    while True:
        out = ctypes.create_string_buffer(cap)
        fp = ctypes.c_uint64()
        err = _native.ErrorInfo()
        st = _lib.gcomp_spec_canonical(_spec_bytes(spec), out, cap, ctypes.byref(fp), ctypes.byref(err))
        if st == _err.E_DST_SIZE and cap < (1 << 20):
            cap *= 4
            continue
        _check(st, f"spec {spec!r}", err)
        return _s(out.value), fp.value


def canonical(spec):
    """The canonical form of `spec` (every parameter with its value, defaults included).

    Raises SpecError naming the bad codec, key or value."""
    return _canonical(spec)[0]


def spec_fingerprint(spec):
    """The 64-bit fingerprint that every message made with `spec` carries."""
    return _canonical(spec)[1]


def _needs(name):
    fn = getattr(_lib, name, None)
    if fn is None:
        raise _err.UnsupportedError(f"{LIBRARY_PATH} lacks {name}", status=_err.E_UNSUPPORTED)
    return fn


def describe(spec, n=0):
    """What `spec` is, for a tensor of `n` elements (0: the worst case over every size), as
    gcomp_spec_describe says: {"codec", "values", "feedback", "flags", "properties"
    (["sparse", "linear", "contraction", ...]), "value_type" ("f32", "f16", "bf16" or
    None), "value_bits", "density", "phases", "seed", "fingerprint"}.  Decide on these
    instead of on codec names or spec text.  Raises SpecError."""
    info = _native.SpecInfo()
    err = _native.ErrorInfo()
    st = _needs("gcomp_spec_describe")(_spec_bytes(spec), int(n), ctypes.byref(info), ctypes.byref(err))
    _check(st, f"spec {spec!r}", err)
    return {
        "codec": _s(info.codec.contents.name),
        "values": _s(info.values),
        "feedback": _s(info.feedback),
        "flags": info.flags,
        "properties": [name for bit, name in SPEC_FLAG_NAMES.items() if info.flags & bit],
        "value_type": _VALUE_TYPES.get(info.value_type),
        "value_bits": info.value_bits,
        "density": info.density,
        "phases": info.phases,
        "seed": info.seed,
        "fingerprint": info.fingerprint,
    }


def _keeps_momentum(spec):
    """True when the compressor of `spec` keeps the momentum (DGC), as the core describes
    the spec (GCOMP_SPEC_MOMENTUM): no spec text is read here."""
    return "momentum" in describe(spec)["properties"]


def _mixes_momentum(specs):
    """True when `specs` (an adaptive ladder) holds both specs that keep the momentum in
    the compressor and specs that leave it to the optimizer: a switch between them must
    move each parameter's momentum."""
    return len({_keeps_momentum(sp) for sp in specs}) > 1


def spec_get(spec, key):
    """The value of parameter `key` of `spec` (given or default) as the canonical form writes
    it, e.g. spec_get("topk", "density") == "0.01".  Raises SpecError when `key` is not a
    parameter of this spec (the message lists those that are)."""
    out = ctypes.create_string_buffer(128)
    err = _native.ErrorInfo()
    st = _needs("gcomp_spec_get")(_spec_bytes(spec), _spec_bytes(key), out, len(out), ctypes.byref(err))
    _check(st, f"spec {spec!r}", err)
    return _s(out.value)


def spec_get_number(spec, key):
    """As spec_get, as a float: ENUM parameters give the index of the choice, BOOL 0 or 1."""
    out = ctypes.c_double()
    err = _native.ErrorInfo()
    st = _needs("gcomp_spec_get_number")(_spec_bytes(spec), _spec_bytes(key), ctypes.byref(out), ctypes.byref(err))
    _check(st, f"spec {spec!r}", err)
    return out.value


_WARMUP = {}


def warmup_epochs(spec):
    """The epochs of a spec's DGC warm-up (its warmup= key), 0.0 for a spec without one.
    Such a warm-up follows the epoch the caller gives (set_epoch): the front ends refuse to
    start one that was never given an epoch, which would stay at warmup_start for good."""
    w = _WARMUP.get(spec)
    if w is None:
        try:
            w = spec_get_number(spec, "warmup")
        except _err.SpecError:
            w = 0.0
        _WARMUP[spec] = w
    return w


def no_epoch_error(where, key, spec, call):
    """The refusal of a warm-up that was never given an epoch."""
    return _err.ArgumentError(
        f"{where}: {key}'s spec {spec!r} has a DGC warm-up of {warmup_epochs(spec):g} epochs, "
        f"which follows the epoch you give: call {call}(epoch) before the first step and as "
        f"training goes on (fractional epochs are fine); without it every step would stay at "
        f"the warm-up's first density", status=_err.E_ARG)


def spec_set(spec, key, value):
    """The canonical form of `spec` with `key` set to `value` (a str, or a number or bool
    written as the spec grammar takes it).  values= and feedback= bring their own keys (and
    drop the old ones the new coder or feedback lacks).  Raises SpecError."""
    if isinstance(value, bool):
        value = "1" if value else "0"
    elif isinstance(value, float):
        value = repr(value)
    cap = 1024
    out = ctypes.create_string_buffer(cap)
    err = _native.ErrorInfo()
    st = _needs("gcomp_spec_set")(
        _spec_bytes(spec), _spec_bytes(key), _spec_bytes(str(value)), out, cap, ctypes.byref(err)
    )
    _check(st, f"spec {spec!r}", err)
    return _s(out.value)


def _params(ptr, count):
    out = []
    for i in range(count):
        p = ptr[i]
        choices = _s(p.choices)
        out.append(
            {
                "name": _s(p.name),
                "type": _PARAM_TYPES.get(p.type, str(p.type)),
                "min": p.min,
                "max": p.max,
                "min_exclusive": bool(p.min_exclusive),
                "default": _s(p.deflt),
                "choices": choices.split("|") if choices is not None else None,
                "help": _s(p.help),
            }
        )
    return out


def _codec_dict(ci):
    c = ci.contents
    return {
        "name": _s(c.name),
        "id": c.id,
        "flags": c.flags,
        "properties": [name for bit, name in FLAG_NAMES.items() if c.flags & bit],
        "help": _s(c.help),
        "params": _params(c.params, c.nparams),
    }


def list_codecs():
    """Every codec of the loaded library, read from its C parameter tables.

    Each entry: {"name", "id", "flags", "properties" (["sparse", "linear", ...]), "help",
    "params": [{"name", "type", "min", "max", "min_exclusive", "default", "choices",
    "help"}, ...]}.  The keys every codec also takes are in common_params()."""
    out = []
    for i in range(_lib.gcomp_codec_count()):
        ci = _lib.gcomp_codec_at(i)
        if ci:
            out.append(_codec_dict(ci))
    return out


def codec_names():
    return [c["name"] for c in list_codecs()]


def codec_info(name_or_id):
    """The entry of list_codecs() for a codec name or wire id, or None."""
    if isinstance(name_or_id, int):
        ci = _lib.gcomp_codec_by_id(name_or_id)
    else:
        ci = _lib.gcomp_codec_find(_spec_bytes(name_or_id))
    return _codec_dict(ci) if ci else None


def common_params():
    """Parameters every codec accepts (feedback=, seed=, and the feedback kinds' keys)."""
    n = ctypes.c_size_t()
    ptr = _lib.gcomp_common_params(ctypes.byref(n))
    return _params(ptr, n.value) if ptr else []


# ---- messages -------------------------------------------------------------------------


def decode_add(msg, out, scale=1.0):
    """Decodes any message (stateless; untrusted bytes) and adds `scale` times its tensor
    into `out` (float32, modified in place).  `out=None` only validates the message.
    Raises CorruptMessage, MismatchError (size differs), ..."""
    mp, ml = byte_buffer(msg)
    if out is None:
        ap, an = None, 0
    else:
        ap, an = float_buffer(out, writable=True, what="out")
    _check(_lib.gcomp_decode_add(mp, ml, ap, an, float(scale)), "decode_add")


def inspect(msg):
    """Header fields of a message (checked, values not decoded) as a dict."""
    mp, ml = byte_buffer(msg)
    info = _native.MessageInfo()
    _check(_lib.gcomp_message_inspect(mp, ml, ctypes.byref(info)), "inspect")
    return {
        "format_version": info.format_version,
        "codec_id": info.codec_id,
        "codec": _s(info.codec_name),
        "flags": info.flags,
        "n": info.n,
        "payload_len": info.payload_len,
        "length": HEADER_SIZE + info.payload_len,
        "fingerprint": info.fingerprint,
        "payload_crc": info.payload_crc,
        "elements_sent": info.elements_sent,
        "index_coding": _s(info.index_coding),
        "value_coding": _s(info.value_coding),
    }




# ---- the compressor -------------------------------------------------------------------


def _matrix_shape(shape, n):
    """(rows, cols) for C from a tensor shape: 2-D as is, N-D as (shape[0], rest), like
    PowerSGD's view of a conv kernel; vectors and scalars (0, 0)."""
    if shape is None:
        return 0, 0
    shape = tuple(int(d) for d in shape)
    if any(d < 0 for d in shape):
        raise ValueError(f"shape {shape}: negative dimension")
    if math.prod(shape) != n:
        raise ValueError(f"shape {shape} holds {math.prod(shape)} elements, not n={n}")
    if len(shape) < 2:
        return 0, 0
    return shape[0], n // shape[0] if shape[0] else 0


class _Closable:
    """close() on exit from a `with` block and at garbage collection (errors there are
    swallowed: the interpreter may be shutting down).  Subclasses define close(), keep the
    C handle in self._h (None once closed) and name themselves in _what for the error of
    _handle() after close."""

    _what = "object"

    def _handle(self):
        h = getattr(self, "_h", None)
        if not h:
            raise ValueError(f"{self._what} is closed")
        return h

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Compressor(_Closable):
    """One tensor's compressor: its spec, its state between steps, its statistics.

    Compressor(spec, n, shape=None): `n` float32 elements; `shape` (optional) is the
    tensor's shape, used by codecs that see a matrix (powersgd): 2-D as is, N-D as
    (shape[0], prod(shape[1:])).  Used by one thread at a time.
    """

    _what = "compressor"

    def __init__(self, spec, n=None, shape=None):
        if n is None:
            if shape is None:
                raise TypeError("Compressor needs n or shape")
            n = math.prod(int(d) for d in shape)
        n = int(n)
        if n <= 0:
            raise ValueError(f"n must be > 0, got {n}")
        rows, cols = _matrix_shape(shape, n)
        h = ctypes.c_void_p()
        err = _native.ErrorInfo()
        st = _lib.gcomp_compressor_create(ctypes.byref(h), _spec_bytes(spec), _size_arg(n),
                                          _size_arg(rows), _size_arg(cols), ctypes.byref(err))
        try:
            _check(st, f"spec {spec!r}", err)
        except _err.Error as e:
            if n > _SIZE_MAX:  # name the n the caller gave, not the SIZE_MAX C saw
                e.args = (str(e).replace(str(_SIZE_MAX), str(n)),)
            raise
        self._init(h, n, shape)

    def _init(self, h, n, shape):
        self._h = h
        self.n = n
        self.shape = tuple(shape) if shape is not None else (n,)
        self._bound = _lib.gcomp_encode_bound(h)
        self._buf = None  # encode buffer, allocated at first encode and reused
        self._len = ctypes.c_size_t()
        self._flags = _lib.gcomp_compressor_codec(h).contents.flags
        self._lr_ptr = ctypes.c_void_p()
        self._lr_rounds = ctypes.c_uint()

    @classmethod
    def from_state(cls, blob, shape=None):
        """A compressor rebuilt from state_bytes() alone (spec and size come from the blob)."""
        bp, bl = byte_buffer(blob, what="state")
        h = ctypes.c_void_p()
        err = _native.ErrorInfo()
        _check(_lib.gcomp_compressor_from_state(ctypes.byref(h), bp, bl, ctypes.byref(err)), "from_state", err)
        self = cls.__new__(cls)
        n = _lib.gcomp_compressor_size(h)
        if shape is not None and math.prod(shape) != n:
            _lib.gcomp_compressor_free(h)
            raise ValueError(f"shape {tuple(shape)} does not hold the state's {n} elements")
        self._init(h, n, shape)
        return self

    # -- lifetime --
    def close(self):
        """Frees the C object now (also done when the object is garbage-collected)."""
        h, self._h = getattr(self, "_h", None), None
        if h:
            _lib.gcomp_compressor_free(h)

    def __reduce__(self):
        return (_from_state_and_shape, (self.state_bytes(), self.shape))

    def __repr__(self):
        return f"gradcomp.Compressor({self.spec!r}, n={self.n})"

    # -- properties --
    @property
    def spec(self):
        """The canonical spec."""
        return _s(_lib.gcomp_compressor_spec(self._handle()))

    @property
    def fingerprint(self):
        return _lib.gcomp_compressor_fingerprint(self._handle())

    @property
    def codec(self):
        """The codec's entry from list_codecs()."""
        return _codec_dict(_lib.gcomp_compressor_codec(self._handle()))

    @property
    def bound(self):
        """Largest message encode() can produce (header included)."""
        return self._bound

    @property
    def step(self):
        """Successful encodes since creation, reset or the loaded state."""
        return _lib.gcomp_compressor_step(self._handle())

    @property
    def stats(self):
        """gcomp_compressor_stats as a dict (messages, bytes_in, bytes_out, ...)."""
        s = _native.Stats()
        _lib.gcomp_compressor_stats(self._handle(), ctypes.byref(s))
        return {name: getattr(s, name) for name, _ in _native.Stats._fields_}

    def reset_stats(self):
        _lib.gcomp_compressor_stats_reset(self._handle())

    @property
    def residual(self):
        """A NumPy copy of the error-feedback residual, or None when the spec keeps none
        (PowerSGD's residual, kept in factored form, is formed on demand)."""
        h = self._handle()
        np = _numpy()
        p = _lib.gcomp_compressor_residual(h)
        if p:
            return np.ctypeslib.as_array(p, shape=(self.n,)).copy()
        if self.multiphase and getattr(_lib, "gcomp_lowrank_residual", None) is not None:
            out = np.empty(self.n, np.float32)
            _check(_lib.gcomp_lowrank_residual(h, out.ctypes.data), "residual")
            return out
        return None

    def retune(self, spec):
        """Changes the spec between two steps, keeping what the compressor holds back
        (include/gradcomp.h, gcomp_compressor_retune): the residual moves to the new
        spec's feedback, or - for a spec that keeps none, such as dense "none" - rides in
        the next message.  On error nothing changes."""
        h = self._handle()
        _needs("gcomp_compressor_retune")
        err = _native.ErrorInfo()
        _check(_lib.gcomp_compressor_retune(h, _spec_bytes(spec), ctypes.byref(err)), f"retune {spec!r}", err)
        self._bound = _lib.gcomp_encode_bound(h)
        self._buf = None
        self._flags = _lib.gcomp_compressor_codec(h).contents.flags

    def set_epoch(self, epoch):
        """Tells schedules (DGC warm-up) which fractional epoch the next encode is in."""
        _check(_lib.gcomp_compressor_set_epoch(self._handle(), float(epoch)), "set_epoch")

    @property
    def multiphase(self):
        """True for codecs driven by the low-rank protocol (PowerSGD) rather than encode."""
        return bool(self._flags & 0x10)

    # -- coding --
    def _encode_ptr(self, gptr, dptr, cap):
        st = _lib.gcomp_encode(self._h, gptr, dptr, cap, ctypes.byref(self._len))
        if st:
            _raise(st, f"encode ({self.spec})")
        return self._len.value

    def encode(self, array):
        """Encodes one step's gradient (n float32, read only) and returns the message.
        With feedback, the state advances only when this succeeds."""
        h = self._handle()
        gptr, _ = float_buffer(array, self.n, what="gradient")
        if self._buf is None:
            self._buf = ctypes.create_string_buffer(max(self._bound, 1))
        st = _lib.gcomp_encode(h, gptr, self._buf, self._bound, ctypes.byref(self._len))
        if st:
            _raise(st, f"encode ({self.spec})")
        return ctypes.string_at(self._buf, self._len.value)

    def encode_into(self, array, out, offset=0):
        """Encodes into the writable byte buffer `out` (bytearray, uint8 array or tensor)
        at byte `offset`; returns the message length.  Give it `bound` bytes to be safe."""
        h = self._handle()
        gptr, _ = float_buffer(array, self.n, what="gradient")
        dptr, dlen = byte_buffer(out, writable=True, what="out")
        try:
            offset = operator.index(offset)
        except TypeError:
            raise TypeError(f"offset must be an integer, got {type(offset).__name__}") from None
        if offset < 0 or offset > dlen:
            raise ValueError(f"offset {offset} outside a buffer of {dlen} bytes")
        st = _lib.gcomp_encode(h, gptr, (dptr or 0) + offset, dlen - offset, ctypes.byref(self._len))
        if st:
            _raise(st, f"encode ({self.spec})")
        return self._len.value

    def decode_add(self, msg, out, scale=1.0):
        """Adds `scale` times the tensor in `msg` into `out` (n float32, in place).
        The message must come from this spec and size (MismatchError otherwise)."""
        h = self._handle()
        mp, ml = byte_buffer(msg)
        ap, _ = float_buffer(out, self.n, writable=True, what="out")
        st = _lib.gcomp_compressor_decode_add(h, mp, ml, ap, float(scale))
        if st:
            _raise(st, f"decode_add ({self.spec})")

    # -- low-rank (PowerSGD) protocol: the caller sums P and Q over ranks in place --
    #
    # One step:  p, rounds = c.lowrank_begin(grad)
    #            rounds == 0: dense step -- reduce grad yourself (or p when it is not None:
    #            grad plus what a retune left to send), then c.lowrank_finish(None)
    #            else, `rounds` times: sum p over ranks in place; q = c.lowrank_after_p();
    #            sum q in place; (between rounds: p = c.lowrank_after_q());
    #            finally c.lowrank_finish(out, 1 / world)   (out = P^ Q^T / world)
    # p and q are float32 NumPy views of the compressor's own buffers (no copy), valid
    # until the next call on the compressor.  include/gradcomp.h has the full contract.

    def _lr_begin(self, gptr):
        n = ctypes.c_size_t()
        st = _lib.gcomp_lowrank_begin(self._h, gptr, ctypes.byref(self._lr_ptr), ctypes.byref(n),
                                      ctypes.byref(self._lr_rounds))
        if st:
            _raise(st, f"lowrank_begin ({self.spec})")
        return self._lr_ptr.value, n.value, self._lr_rounds.value

    def _lr_shape(self):
        """(rounds, P length, Q length) of the step begin starts next; reads no gradient."""
        rounds, np_, nq = ctypes.c_uint(), ctypes.c_size_t(), ctypes.c_size_t()
        st = _needs("gcomp_lowrank_shape")(self._h, ctypes.byref(rounds), ctypes.byref(np_),
                                          ctypes.byref(nq))
        if st:
            _raise(st, f"lowrank_shape ({self.spec})")
        return rounds.value, np_.value, nq.value

    def _lr_next(self, fn, what):
        n = ctypes.c_size_t()
        st = fn(self._h, ctypes.byref(self._lr_ptr), ctypes.byref(n))
        if st:
            _raise(st, f"{what} ({self.spec})")
        return self._lr_ptr.value, n.value

    def _lr_finish(self, optr, scale):
        st = _lib.gcomp_lowrank_finish(self._h, optr, scale)
        if st:
            _raise(st, f"lowrank_finish ({self.spec})")

    def _lr_abort(self):
        _lib.gcomp_lowrank_abort(self._h)

    @staticmethod
    def _view(addr, count):
        np = _numpy()
        if not count:
            return np.empty(0, np.float32)
        return np.ctypeslib.as_array((ctypes.c_float * count).from_address(addr))

    def lowrank_begin(self, grad):
        """Starts a step: returns (P view or None, rounds).  rounds == 0 is a dense step,
        whose view is None (reduce grad) or, after a retune, grad plus what the old spec held
        back (reduce that instead)."""
        self._handle()
        _needs("gcomp_lowrank_begin")
        gptr, _ = float_buffer(grad, self.n, what="gradient")
        addr, n, rounds = self._lr_begin(gptr)
        return (self._view(addr, n) if addr else None), rounds

    def lowrank_after_p(self):
        """After P was summed over ranks: returns the Q buffer to sum."""
        self._handle()
        return self._view(*self._lr_next(_needs("gcomp_lowrank_after_p"), "lowrank_after_p"))

    def lowrank_after_q(self):
        """Between rounds (iters > 1), after Q was summed: returns the next P to sum."""
        self._handle()
        return self._view(*self._lr_next(_needs("gcomp_lowrank_after_q"), "lowrank_after_q"))

    def lowrank_finish(self, out, scale=1.0):
        """Writes out = scale * P^ Q^T (overwrites) and commits the step; out is None on a
        dense step (which it only commits)."""
        self._handle()
        _needs("gcomp_lowrank_finish")
        optr = None if out is None else float_buffer(out, self.n, writable=True, what="out")[0]
        self._lr_finish(optr, float(scale))

    def lowrank_abort(self):
        """Abandons the step in flight; the state stays as it was before begin."""
        _needs("gcomp_lowrank_abort")(self._handle())

    # -- state --
    def state_bytes(self):
        """The compressor's state (residual, momentum, warm start, step) as a versioned blob."""
        h = self._handle()
        cap = _lib.gcomp_state_bound(h)
        buf = ctypes.create_string_buffer(max(cap, 1))
        n = ctypes.c_size_t()
        _check(_lib.gcomp_state_save(h, buf, cap, ctypes.byref(n)), "state_bytes")
        return ctypes.string_at(buf, n.value)

    def load_state(self, blob):
        """Loads a blob from state_bytes() of a compressor with the same spec and shape.
        On any error (StateError, MismatchError, CorruptMessage) the state is unchanged."""
        bp, bl = byte_buffer(blob, what="state")
        _check(_lib.gcomp_state_load(self._handle(), bp, bl), f"load_state ({self.spec})")

    def reset(self):
        """Forgets residuals, momentum, warm starts and the step counter."""
        _lib.gcomp_state_reset(self._handle())


def _from_state_and_shape(blob, shape):
    return Compressor.from_state(blob, shape=shape)


# ---- layer-wise policy ------------------------------------------------------------------


def spec_bytes_estimate(spec, n, shape=None):
    """Steady-state message bytes of `spec` for a tensor of n elements (shape as for
    Compressor), without allocating the tensor's state."""
    rows, cols = _matrix_shape(shape, int(n))
    out = ctypes.c_size_t()
    err = _native.ErrorInfo()
    st = _needs("gcomp_spec_bytes_estimate")(_spec_bytes(spec), _size_arg(int(n)), _size_arg(rows),
                                            _size_arg(cols), ctypes.byref(out), ctypes.byref(err))
    _check(st, f"spec {spec!r}", err)
    return out.value


class Policy:
    """The C layer-wise policy (include/gradcomp.h, gcomp_policy): one spec per tensor.

    Policy("spec=topk:density=0.001,feedback=ef;min_elements=16384;embed*=topk:density=0.0005")
    choose(name, shape) -> {"spec", "rule", "reason", "pattern", "bytes", "dense_bytes"}.
    Pickles as its policy string.
    """

    def __init__(self, text):
        if not isinstance(text, str):
            raise TypeError("policy must be a str")
        if "\0" in text:
            raise _err.SpecError(f"policy {text!r}: contains a NUL character", status=_err.E_SPEC,
                                 status_name=status_name(_err.E_SPEC))
        h = ctypes.c_void_p()
        err = _native.ErrorInfo()
        _check(_needs("gcomp_policy_create")(ctypes.byref(h), text.encode("utf-8"), ctypes.byref(err)),
               f"policy {text!r}", err)
        self._h = h
        self.text = text

    def __del__(self):
        h, self._h = getattr(self, "_h", None), None
        if h:
            _lib.gcomp_policy_free(h)

    def __reduce__(self):
        return (Policy, (self.text,))

    def __repr__(self):
        return f"gradcomp.Policy({self.text!r})"

    def choose(self, name, shape):
        shape = tuple(int(d) for d in shape) or (1,)
        n = math.prod(shape)
        rows, cols = _matrix_shape(shape, n)
        desc = _native.TensorDesc(str(name).encode("utf-8"), _size_arg(n), _size_arg(rows), _size_arg(cols))
        plan = _native.LayerPlan()
        err = _native.ErrorInfo()
        _check(_lib.gcomp_policy_choose(self._h, ctypes.byref(desc), ctypes.byref(plan), ctypes.byref(err)),
               f"policy for tensor {name!r}", err)
        return {
            "spec": _s(plan.spec),
            "rule": plan.rule,
            "reason": _s(plan.reason),
            "pattern": _s(plan.pattern),
            "bytes": plan.bytes,
            "dense_bytes": plan.dense_bytes,
        }
