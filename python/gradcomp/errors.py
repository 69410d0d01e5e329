"""errors.py - gradcomp statuses as Python exceptions.

Every failing C call raises a subclass of gradcomp.Error carrying `.status` (the numeric
gcomp_status), `.status_name` (gcomp_status_str) and the C library's own message when the
call provides one (gcomp_error.message).  The classes group statuses by what a caller
does about them: fix the spec (SpecError), drop the message (CorruptMessage), upgrade the
library (UnsupportedFormat), check the other ranks' settings (MismatchError), skip the step
(NonFiniteError), ...  Argument
errors also derive from ValueError and out-of-memory from MemoryError, so generic
handlers keep working.  A status added to the C enum later maps to plain Error with its
C name, so nothing breaks when the library grows.
"""

# Status numbers from include/gradcomp.h (never renumbered once released).
OK = 0
E_ARG = 1
E_NOMEM = 2
E_SPEC = 3
E_UNKNOWN_CODEC = 4
E_DST_SIZE = 5
E_TRUNCATED = 6
E_BAD_MAGIC = 7
E_VERSION = 8
E_CODEC_ID = 9
E_CHECKSUM = 10
E_CORRUPT = 11
E_MISMATCH = 12
E_NONFINITE = 13
E_STATE = 14
E_LIMIT = 15
E_PROTOCOL = 16
E_TIMEOUT = 17
E_MPI = 18
E_FAILED = 19
E_UNSUPPORTED = 20
E_IO = 21


class Error(Exception):
    """A gradcomp call failed.  `.status` is the C gcomp_status value."""

    def __init__(self, message, status=None, status_name=None):
        super().__init__(message)
        self.status = status
        self.status_name = status_name


class ArgumentError(Error, ValueError):
    """GCOMP_E_ARG: an invalid argument (size 0, a shape that does not fit, ...)."""


class OutOfMemory(Error, MemoryError):
    """GCOMP_E_NOMEM."""


class SpecError(Error, ValueError):
    """GCOMP_E_SPEC, GCOMP_E_UNKNOWN_CODEC: the spec string is wrong."""


class BufferTooSmall(Error):
    """GCOMP_E_DST_SIZE (never raised when the package sizes the buffer itself)."""


class CorruptMessage(Error, ValueError):
    """The message (or state blob) cannot be used: damaged, truncated, not gradcomp's
    (GCOMP_E_TRUNCATED, E_BAD_MAGIC, E_CHECKSUM, E_CORRUPT), or from a newer library
    (UnsupportedFormat, a subclass)."""


class MismatchError(Error):
    """GCOMP_E_MISMATCH: sizes or spec fingerprints differ (ranks with different settings)."""


class NonFiniteError(Error, ArithmeticError):
    """GCOMP_E_NONFINITE: the gradient holds NaN or Inf; the compressor's state is unchanged."""


class StateError(Error):
    """GCOMP_E_STATE: a saved state is corrupt or belongs to another tensor."""


class LimitError(Error):
    """GCOMP_E_LIMIT: a size exceeds what the format allows."""


class ProtocolError(Error):
    """GCOMP_E_PROTOCOL: multi-phase calls (PowerSGD) made in the wrong order."""


class UnsupportedError(Error):
    """GCOMP_E_UNSUPPORTED: not available for this codec or in this build."""


class UnsupportedFormat(CorruptMessage, UnsupportedError):
    """GCOMP_E_VERSION, GCOMP_E_CODEC_ID: an intact message or state from a newer format
    version, or naming a codec this library does not have -- upgrade the library on this
    rank, do not drop the data as damaged.  The C side keeps corrupt and unsupported apart
    (the header CRC is checked first); this class keeps the split.  It derives from
    CorruptMessage, so handlers written before it existed still catch it, and from
    UnsupportedError."""


class CollectiveTimeout(Error, TimeoutError):
    """GCOMP_E_TIMEOUT: a collective did not complete within its timeout (a dead or stalled
    peer); the communicator is failed from then on (gradcomp.mpi).  From the DDP hook
    (gradcomp.torch): the process group's timeout (init_process_group(timeout=...))."""


class MPIError(Error):
    """GCOMP_E_MPI: an MPI call returned an error (often a peer that died); the
    communicator is failed from then on (gradcomp.mpi)."""


class CommunicatorFailed(Error):
    """GCOMP_E_FAILED: the communicator failed earlier (timeout or MPI error) and stays
    failed until reset (gradcomp.mpi.Communicator.reset) or freed; from the DDP hook
    (gradcomp.torch): its gloo process group lost a rank, whose connection closed."""


class IOFailure(Error, OSError):
    """GCOMP_E_IO: a file or data-set could not be read or written."""


_CLASSES = {
    E_ARG: ArgumentError,
    E_NOMEM: OutOfMemory,
    E_SPEC: SpecError,
    E_UNKNOWN_CODEC: SpecError,
    E_DST_SIZE: BufferTooSmall,
    E_TRUNCATED: CorruptMessage,
    E_BAD_MAGIC: CorruptMessage,
    E_VERSION: UnsupportedFormat,
    E_CODEC_ID: UnsupportedFormat,
    E_CHECKSUM: CorruptMessage,
    E_CORRUPT: CorruptMessage,
    E_MISMATCH: MismatchError,
    E_NONFINITE: NonFiniteError,
    E_STATE: StateError,
    E_LIMIT: LimitError,
    E_PROTOCOL: ProtocolError,
    E_UNSUPPORTED: UnsupportedError,
    E_TIMEOUT: CollectiveTimeout,
    E_MPI: MPIError,
    E_FAILED: CommunicatorFailed,
    E_IO: IOFailure,
}


def error_class(status):
    return _CLASSES.get(status, Error)
