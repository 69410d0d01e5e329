"""test_reliability.py - what a careless or hostile caller hands the Python binding, each a
bug that was found (the reliability issue) and must stay fixed, and the binding's side of
the out-of-memory sweep (tests/unit/test_oom.c does the C side).
"""

import ctypes
import math
import struct

import numpy as np
import pytest

import gradcomp
from gradcomp import core


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c ^= b
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 & -(c & 1))
    return c ^ 0xFFFFFFFF


def message(spec="topk:density=0.1", n=100):
    c = gradcomp.Compressor(spec, n)
    g = np.linspace(-1, 1, n, dtype=np.float32)
    return bytearray(c.encode(g))


def fix_header(m):
    m[36:40] = struct.pack("<I", crc32c(bytes(m[:36])))
    return m


def test_huge_n_names_the_limit():
    # 2**64 used to wrap to 0 in ctypes and come back as "n must be > 0".
    for n in (2**64, 2**64 + 5, 2**70, 2**32):
        with pytest.raises(gradcomp.LimitError) as ei:
            gradcomp.Compressor("topk", n)
        assert "2^32-1" in str(ei.value)
        assert str(n) in str(ei.value)
    with pytest.raises(gradcomp.LimitError):
        gradcomp.spec_bytes_estimate("topk", 2**64)
    with pytest.raises(ValueError):
        gradcomp.Compressor("topk", 0)


def test_spec_with_nul_is_refused():
    # C reads a string up to its NUL: "topk\0:density=0.5" was accepted as "topk".
    for spec in ("topk\0:density=0.5", b"topk\0", "\0"):
        with pytest.raises(gradcomp.SpecError) as ei:
            gradcomp.Compressor(spec, 10)
        assert "NUL" in str(ei.value)
        with pytest.raises(gradcomp.SpecError):
            gradcomp.canonical(spec)
    with pytest.raises(gradcomp.SpecError):
        gradcomp.Policy("spec=topk\0")


def test_encode_into_offset_must_be_an_integer():
    c = gradcomp.Compressor("topk:density=0.1", 100)
    g = np.ones(100, np.float32)
    out = bytearray(c.bound + 8)
    for bad in (1.5, "1", None):
        with pytest.raises(TypeError) as ei:
            c.encode_into(g, out, offset=bad)
        assert not isinstance(ei.value, ctypes.ArgumentError)
        assert "offset" in str(ei.value)
    assert c.encode_into(g, out, offset=np.int64(8)) > 0  # integer-like types are fine


def test_unsupported_is_not_corrupt():
    m = message()
    newer = fix_header(bytearray(m))
    newer[4] = 2  # a newer format version, header intact
    fix_header(newer)
    unknown = bytearray(m)
    unknown[6:8] = struct.pack("<H", 999)  # a codec this library lacks
    fix_header(unknown)
    damaged = bytearray(m)
    damaged[50] ^= 0x40  # payload CRC mismatch
    for msg, status in ((newer, gradcomp.errors.E_VERSION), (unknown, gradcomp.errors.E_CODEC_ID)):
        with pytest.raises(gradcomp.UnsupportedFormat) as ei:
            gradcomp.decode_add(bytes(msg), None)
        assert ei.value.status == status
        # still what older handlers catch, and an UnsupportedError
        assert isinstance(ei.value, gradcomp.CorruptMessage)
        assert isinstance(ei.value, gradcomp.UnsupportedError)
    with pytest.raises(gradcomp.CorruptMessage) as ei:
        gradcomp.decode_add(bytes(damaged), None)
    assert not isinstance(ei.value, gradcomp.UnsupportedFormat)


@pytest.mark.parametrize("spec", ["topk:density=0.1", "randomk:density=0.2", "none", "qsgd"])
def test_non_finite_scale_is_refused(spec):
    # Sparse codecs used to return OK and fill the accumulator with +-Inf.
    m = bytes(message(spec))
    c = gradcomp.Compressor(spec, 100)
    for scale in (math.inf, -math.inf, math.nan):
        acc = np.zeros(100, np.float32)
        with pytest.raises(gradcomp.ArgumentError):
            gradcomp.decode_add(m, acc, scale)
        with pytest.raises(gradcomp.ArgumentError):
            c.decode_add(m, acc, scale)
        assert not acc.any()


def test_state_with_impossible_shape_is_a_state_error():
    c = gradcomp.Compressor("powersgd:rank=2", 200, shape=(10, 20))
    blob = bytearray(c.state_bytes())
    blob[24:32] = struct.pack("<Q", 7)  # rows 7: 7 x 20 != 200
    blob[-4:] = struct.pack("<I", crc32c(bytes(blob[:-4])))
    with pytest.raises(gradcomp.StateError):  # was ArgumentError (create's check)
        gradcomp.Compressor.from_state(bytes(blob))
    with pytest.raises(gradcomp.StateError):
        c.load_state(bytes(blob))


# ---- out of memory through the binding ------------------------------------------------------


def fail_after(k):
    fn = getattr(core._lib, "gcomp__test_fail_alloc_after", None)
    if fn is None:
        pytest.skip("this libgradcomp has no allocation-failure hook")
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = None
    fn(k if k >= 0 else ctypes.c_size_t(-1).value)


@pytest.mark.parametrize("spec,shape", [("topk:density=0.05,feedback=ef", None),
                                        ("dgc:density=0.05", None),
                                        ("powersgd:rank=2", (20, 50)),
                                        ("qsgd:feedback=none", None)])
def test_out_of_memory_is_memoryerror_and_changes_nothing(spec, shape):
    n = 1000
    g = np.sin(np.arange(n, dtype=np.float32))
    completed = False
    for k in range(200):
        try:
            fail_after(k)
            try:
                c = gradcomp.Compressor(spec, n, shape=shape)
            except MemoryError as e:
                assert isinstance(e, gradcomp.OutOfMemory)
                continue
            before = c.state_bytes()
            try:
                msg = c.encode(g)
            except gradcomp.OutOfMemory:
                fail_after(-1)
                assert c.state_bytes() == before  # nothing held back is lost
                continue
            acc = np.zeros(n, np.float32)
            try:
                c.decode_add(msg, acc)
                gradcomp.decode_add(msg, acc)
                c2 = gradcomp.Compressor.from_state(c.state_bytes(), shape=shape)
                c2.close()
                p = gradcomp.Policy("spec=" + spec + ";min_elements=10")
                p.choose("w", shape or (n,))
            except gradcomp.OutOfMemory:
                continue
            completed = True
            break
        finally:
            fail_after(-1)
    assert completed, f"{spec}: never completed with memory back"
