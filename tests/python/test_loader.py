"""The library search leaves out sanitizer builds: loading an ASan library into a plain
interpreter aborts it (the runtime must come first), and `make check` leaves one in
build-asan/ that is newer than build/."""

import os

from gradcomp import _native


def _fake_lib(path, needed, mtime):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        # What the dynamic section's string table holds for a sanitizer build.
        f.write(b"\x7fELF" + b"\0" * 60 + needed + b"\0libm.so.6\0")
    os.utime(path, (mtime, mtime))


def test_sanitizer_builds_are_left_out(tmp_path, monkeypatch):
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    plain = str(tmp_path / "build" / "libgradcomp.so")
    asan = str(tmp_path / "build-asan" / "libgradcomp.so")
    tsan = str(tmp_path / "build-tsan" / "libgradcomp.so")
    other = str(tmp_path / "build-rel" / "libgradcomp.so")
    _fake_lib(plain, b"libc.so.6", 1000)
    _fake_lib(asan, b"libasan.so.8", 3000)
    _fake_lib(tsan, b"libtsan.so.2", 4000)
    _fake_lib(other, b"libc.so.6", 2000)
    found = _native.built_libraries(str(tmp_path / "build*" / "libgradcomp.so"))
    assert found == [other, plain]


def test_sanitizer_build_kept_when_its_runtime_is_preloaded(tmp_path, monkeypatch):
    asan = str(tmp_path / "build-asan" / "libgradcomp.so")
    _fake_lib(asan, b"libasan.so.8", 3000)
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/libasan.so.8")
    assert not _native.needs_early_runtime(asan)
    monkeypatch.setenv("LD_PRELOAD", "")
    assert _native.needs_early_runtime(asan)


def test_a_missing_or_empty_file_is_not_a_sanitizer_build(tmp_path):
    assert not _native.needs_early_runtime(str(tmp_path / "nothing.so"))
    empty = tmp_path / "empty.so"
    empty.write_bytes(b"")
    assert not _native.needs_early_runtime(str(empty))
