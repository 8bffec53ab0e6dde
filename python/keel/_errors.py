"""Exceptions: one class per keel_status (keel.h, KEEL_STATUS_TABLE), all
subclasses of KeelError, which carries the status code, its name and keel's
message."""

# keel_status codes (keel.h): the values are ABI
OK = 0
EINVAL = 1
ENOMEM = 2
EOVERFLOW = 3
ERANGE = 4
EFORMAT = 5
EIO = 6
EUNSUPPORTED = 7
ENOENT = 8
EFULL = 9
ESCRATCH = 10
ESTATE = 11
ECANCELED = 12
ECONTEXT = 13
EINTERNAL = 14


class KeelError(Exception):
    """A keel call failed.

    Attributes: status (keel_status code, an int), status_name ("KEEL_EINVAL"),
    message (keel's detail, e.g. the path and the system's reason), func (the
    keel call), response (the turn's Completion when the failed request got
    one, e.g. usage.prompt_tokens of a prompt too long, else None)."""

    status = None

    def __init__(self, message, status=None, status_name=None, func=None, response=None):
        if status is not None:
            self.status = status
        self.status_name = status_name or _NAMES.get(self.status, "")
        self.message = message
        self.func = func
        self.response = response
        head = f"{func}: " if func else ""
        name = f"{self.status_name}: " if self.status_name else ""
        super().__init__(f"{head}{name}{message}")


class KeelLibraryError(KeelError, ImportError):
    """libkeel.so could not be found or loaded (no keel status)."""


class InvalidArgumentError(KeelError, ValueError):
    """KEEL_EINVAL: a bad option, malformed JSON, a template error (named in the message)."""
    status = EINVAL


class OutOfMemoryError(KeelError, MemoryError):
    """KEEL_ENOMEM."""
    status = ENOMEM


class SizeOverflowError(KeelError):
    """KEEL_EOVERFLOW: size arithmetic overflow."""
    status = EOVERFLOW


class RangeError(KeelError):
    """KEEL_ERANGE: a value out of range."""
    status = ERANGE


class FormatError(KeelError):
    """KEEL_EFORMAT: malformed input data (a model or session file)."""
    status = EFORMAT


class KeelIOError(KeelError, OSError):
    """KEEL_EIO: input/output error (the path and the system's reason in the message)."""
    status = EIO

    def __str__(self):  # OSError's own __str__ would show only the first argument
        return Exception.__str__(self)


class UnsupportedError(KeelError):
    """KEEL_EUNSUPPORTED: an unsupported feature or type."""
    status = EUNSUPPORTED


class NotFoundError(KeelError, LookupError):
    """KEEL_ENOENT."""
    status = ENOENT


class CacheFullError(KeelError):
    """KEEL_EFULL: the cache has no room."""
    status = EFULL


class ScratchError(KeelError):
    """KEEL_ESCRATCH: a scratch arena is exhausted."""
    status = ESCRATCH


class StateError(KeelError):
    """KEEL_ESTATE: refused in this state (e.g. another complete() runs on the engine)."""
    status = ESTATE


class CancelledError(KeelError):
    """KEEL_ECANCELED: raised only where no result can be returned (the engine
    is closing); a cancelled turn returns a Completion with finish_reason
    "cancelled"."""
    status = ECANCELED


class ContextError(KeelError):
    """KEEL_ECONTEXT: the prompt is longer than the cache can ever hold."""
    status = ECONTEXT


class InternalError(KeelError):
    """KEEL_EINTERNAL: an internal invariant was violated (a bug in keel)."""
    status = EINTERNAL


_CLASSES = {c.status: c for c in (InvalidArgumentError, OutOfMemoryError, SizeOverflowError, RangeError,
                                  FormatError, KeelIOError, UnsupportedError, NotFoundError, CacheFullError,
                                  ScratchError, StateError, CancelledError, ContextError, InternalError)}
# keel_status_name() of each code, for messages made without the library
_NAMES = {code: "KEEL_" + name for name, code in (
    ("EINVAL", EINVAL), ("ENOMEM", ENOMEM), ("EOVERFLOW", EOVERFLOW), ("ERANGE", ERANGE), ("EFORMAT", EFORMAT),
    ("EIO", EIO), ("EUNSUPPORTED", EUNSUPPORTED), ("ENOENT", ENOENT), ("EFULL", EFULL), ("ESCRATCH", ESCRATCH),
    ("ESTATE", ESTATE), ("ECANCELED", ECANCELED), ("ECONTEXT", ECONTEXT), ("EINTERNAL", EINTERNAL))}


def error_class(status):
    """The KeelError subclass of a status (KeelError itself for a code this
    version does not know)."""
    return _CLASSES.get(status, KeelError)


def make_error(status, message, status_name=None, func=None, response=None):
    return error_class(status)(message, status=status, status_name=status_name, func=func, response=response)
