"""The MPI half of the Python suite: run under mpirun, every rank runs every test.

    mpirun -np 4 python3 -m pytest -q -p no:cacheprovider tests/python/mpi

(ctest runs it at 2 and 4 ranks: python.mpi.np2, python.mpi.np4.)  Without mpirun every test
is skipped, saying so; `pytest tests/python` leaves this folder out (tests/python/conftest.py).

Ranks stay in step: every test function is wrapped (pytest_pyfunc_call below) so that, when
it ends, the ranks exchange their verdicts through a bounded allgather; a test that failed
on one rank fails on every rank, naming the rank and its error, and no rank moves on to
the next test's collectives while another is still in this one.  Library objects use short
timeouts (TIMEOUT) so a rank that failed half-way leaves its peers with CollectiveTimeout,
not a hang, and the verdict exchange outlasts them.
"""

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, os.path.dirname(HERE))  # tests/python: its conftest helpers

UNDER_MPIRUN = any(k in os.environ for k in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"))
TIMEOUT = 30.0  # library collectives in these tests
VERDICT_TIMEOUT = 360.0  # longer than any set-up bound (300 s by default)


def c_layout(body):
    """Compiles `body` (statements of main, with F(T, m) printing offsetof and S(T) sizeof)
    against gradcomp_mpi.h with mpicc and returns the lines it prints; skips without mpicc."""
    import shutil
    import subprocess
    import tempfile

    cc = shutil.which("mpicc")
    if not cc:
        pytest.skip("no mpicc to read the header's layout")
    prog = (
        "#include <stddef.h>\n#include <stdio.h>\n#include \"gradcomp_mpi.h\"\n"
        '#define F(T, m) printf(#T "." #m " %zu\\n", offsetof(T, m))\n'
        '#define S(T) printf(#T " %zu\\n", sizeof(T))\n'
        "int main(void) {\n" + body + "\n  return 0;\n}\n"
    )
    with tempfile.TemporaryDirectory() as d:
        src, exe = os.path.join(d, "layout.c"), os.path.join(d, "layout")
        with open(src, "w") as f:
            f.write(prog)
        subprocess.run([cc, "-I", os.path.join(REPO, "include"), src, "-o", exe], check=True)
        out = subprocess.run([exe], check=True, capture_output=True, text=True).stdout
    return [line for line in out.split("\n") if line]


def check_layout(lines, types, enums, minimum):
    """Checks the lines c_layout printed against ctypes: "E v..." equals `enums` (the enum
    values, in the order printed), "T.m offset" is types[T].m's offset, "T size" is
    sizeof(types[T]).  Asserts at least `minimum` lines were checked; returns how many."""
    import ctypes

    checked = 0
    for line in lines:
        what, *vals = line.split()
        if what == "E":
            assert [int(v) for v in vals] == list(enums)
        elif "." in what:
            t, m = what.split(".")
            assert getattr(types[t], m).offset == int(vals[0]), what
        else:
            assert ctypes.sizeof(types[what]) == int(vals[0]), what
        checked += 1
    assert checked >= minimum
    return checked


def nonfinite_step(model, opt, x, y):
    """One step whose batch holds a NaN on the last rank: step() must raise NonFiniteError on
    every rank (the library refuses the exchange everywhere, never sends the NaN)."""
    import torch
    from mpi4py import MPI

    import gradcomp

    if MPI.COMM_WORLD.rank == MPI.COMM_WORLD.size - 1:
        x = x.clone()
        x[0, 0] = float("nan")
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    with pytest.raises(gradcomp.NonFiniteError):
        opt.step()


def digest(*items):
    """sha256 over the bytes (C order) of numpy arrays and torch tensors, in order; an item may
    also be an iterable of them (a list, a generator) or a torch module (its parameters(), in
    order).  digest(a, b) == digest([a, b]).  torch is only looked at when a test imported it."""
    import hashlib

    import numpy as np

    torch = sys.modules.get("torch")
    h = hashlib.sha256()

    def add(x):
        if isinstance(x, (np.ndarray, np.generic)):
            h.update(np.ascontiguousarray(x).tobytes())
        elif torch is not None and isinstance(x, torch.Tensor):
            h.update(np.ascontiguousarray(x.detach().cpu().numpy()).tobytes())
        elif torch is not None and isinstance(x, torch.nn.Module):
            for p in x.parameters():
                add(p)
        else:
            for y in x:
                add(y)

    for item in items:
        add(item)
    return h.hexdigest()


def pytest_collection_modifyitems(config, items):
    if not UNDER_MPIRUN:
        skip = pytest.mark.skip(reason="run under mpirun: mpirun -np 2 python3 -m pytest tests/python/mpi")
        for item in items:
            item.add_marker(skip)


def pytest_report_header(config):
    if not UNDER_MPIRUN:
        return "tests/python/mpi: SKIPPED - run under mpirun (ctest -R python.mpi)"
    from mpi4py import MPI

    return f"tests/python/mpi: rank {MPI.COMM_WORLD.rank} of {MPI.COMM_WORLD.size}"


_VERDICTS = []


def _verdict_comm():
    # A private duplicate: the verdict exchange must never match a collective that a rank
    # still inside the test runs on COMM_WORLD.
    if not _VERDICTS:
        from mpi4py import MPI

        _VERDICTS.append(MPI.COMM_WORLD.Dup())
    return _VERDICTS[0]


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    import gradcomp.mpi as gm

    vcomm = _verdict_comm()
    args = {a: pyfuncitem.funcargs[a] for a in pyfuncitem._fixtureinfo.argnames}
    error = None
    try:
        pyfuncitem.obj(**args)
    except BaseException as e:  # noqa: B902 - skips and failures both travel
        error = e
    mine = None if error is None else (type(error).__name__, str(error)[:2000],
                                       isinstance(error, pytest.skip.Exception))
    verdicts = gm.allgather_object(mine, vcomm, VERDICT_TIMEOUT)
    if error is not None:
        raise error
    others = [(r, v) for r, v in enumerate(verdicts) if v is not None and not v[2]]
    if others:
        r, (cls, msg, _) = others[0]
        raise AssertionError(f"rank {r} failed this test: {cls}: {msg}")
    skips = [(r, v) for r, v in enumerate(verdicts) if v is not None]
    if skips:
        pytest.skip(f"rank {skips[0][0]}: {skips[0][1][1]}")
    return True
