"""Shared helpers for the gradcomp Python tests.

The library comes from $GRADCOMP_LIB (ctest sets it to the freshly built one) or the
package's own search (python/gradcomp/_native.py).  Codecs that other issues add later
(twobit, powersgd, ...) are looked up in the C registry, never assumed: a test that needs
one is skipped, saying which codec has not landed, until it is there.
"""

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "python"))

import gradcomp  # noqa: E402

# The MPI half runs under mpirun, on its own (ctest python.mpi.np2/np4; see mpi/conftest.py).
collect_ignore = ["mpi"]


def has_codec(name):
    return gradcomp.codec_info(name) is not None


def needs_codec(name):
    return pytest.mark.skipif(
        not has_codec(name),
        reason=f"NOT LANDED: codec {name!r} is not in this libgradcomp's registry yet",
    )


try:
    import torch  # noqa: F401

    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False

needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="PyTorch is not installed (apt-get install python3-torch)")
