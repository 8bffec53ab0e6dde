"""Finding and loading libkeel.so, and the ctypes prototypes of the calls the
package makes (include/keel.h, sections "Status" and "Engine").

Lookup order (first that exists wins; a named path that fails to load is an
error, not a reason to try the next):
  1. the environment variable KEEL_LIBRARY (a path to libkeel.so);
  2. next to the package: keel/libkeel.so, then libkeel.so in the directory
     holding the keel package;
  3. ctypes.util.find_library("keel") (ldconfig's cache: /usr/lib, ...);
  4. the standard install paths: /usr/local/lib, /usr/lib and their
     multiarch directories (libkeel.so, then libkeel.so.0).
"""

import ctypes
import ctypes.util
import os
import sysconfig
import threading
from ctypes import (CFUNCTYPE, POINTER, Structure, c_bool, c_char, c_char_p, c_float, c_int, c_int32, c_int64,
                    c_size_t, c_uint64, c_void_p)

from ._errors import KeelLibraryError

# keel_event_kind (keel.h)
EVENT_CONTENT = 0
EVENT_REASONING = 1
EVENT_TOOL_BEGIN = 2
EVENT_TOOL_ARGS = 3
EVENT_TOOL_END = 4
EVENT_DONE = 5
EVENT_PROMPT = 6
EVENT_LOGPROB = 7


class KeelEvent(Structure):
    """struct keel_event, field for field (C enums are int on every ABI keel
    targets). Its pointers are valid only during the callback."""
    _fields_ = [
        ("kind", c_int),
        ("request", c_uint64),
        ("index", c_int32),
        ("text", c_void_p),      # len bytes, not NUL-terminated
        ("len", c_size_t),
        ("id", c_char_p),
        ("name", c_char_p),
        ("response", c_char_p),
        ("status", c_int),
        ("error", c_char_p),
        ("n_prompt_tokens", c_int32),
        ("n_cached_tokens", c_int32),
        ("token", c_int32),
        ("logprob", c_float),
    ]

    def data(self):
        return ctypes.string_at(self.text, self.len) if self.len else b""


# typedef bool (*keel_event_fn)(void *user, const keel_event *ev);
EVENT_FN = CFUNCTYPE(c_bool, c_void_p, POINTER(KeelEvent))

_PROTOTYPES = [
    ("keel_version", c_char_p, []),
    ("keel_strerror", c_char_p, [c_int]),
    ("keel_status_name", c_char_p, [c_int]),
    ("keel_engine_open", c_int, [c_char_p, POINTER(c_void_p), POINTER(c_char)]),
    ("keel_engine_close", None, [c_void_p]),
    ("keel_engine_last_error", c_char_p, [c_void_p]),
    ("keel_complete", c_int, [c_void_p, c_char_p, c_char_p, c_char_p, EVENT_FN, c_void_p, POINTER(c_char), c_size_t]),
    ("keel_engine_cancel", None, [c_void_p]),
    ("keel_engine_reset", c_int, [c_void_p]),
    ("keel_engine_stats", c_int, [c_void_p, POINTER(c_char), c_size_t, POINTER(c_size_t)]),
    ("keel_engine_count_tokens", c_int, [c_void_p, c_char_p, POINTER(c_int64)]),
    ("keel_engine_slot_save", c_int, [c_void_p, c_int32, c_char_p, POINTER(c_char), c_size_t]),
    ("keel_engine_slot_restore", c_int, [c_void_p, c_int32, c_char_p, POINTER(c_char), c_size_t]),
]

_lock = threading.Lock()
_loaded = None  # (path, CDLL)


def _candidates():
    env = os.environ.get("KEEL_LIBRARY")
    if env:
        return [env], True
    here = os.path.dirname(os.path.abspath(__file__))
    paths = [os.path.join(here, "libkeel.so"), os.path.join(os.path.dirname(here), "libkeel.so")]
    found = ctypes.util.find_library("keel")
    if found:
        paths.append(found)
    dirs = ["/usr/local/lib", "/usr/lib"]
    multiarch = sysconfig.get_config_var("MULTIARCH")
    if multiarch:
        dirs = ["/usr/local/lib/" + multiarch, "/usr/local/lib", "/usr/lib/" + multiarch, "/usr/lib"]
    for d in dirs:
        paths += [os.path.join(d, "libkeel.so"), os.path.join(d, "libkeel.so.0")]
    return paths, False


def _exists(p):
    # find_library gives a bare name (libkeel.so.0) that the dynamic loader resolves
    return os.path.exists(p) or os.sep not in p


def library_path():
    """The path of the libkeel.so the package uses (loading it if needed)."""
    return load()[0]


def load():
    """(path, ctypes.CDLL) of libkeel.so, loaded once per process."""
    global _loaded
    with _lock:
        if _loaded is not None:
            return _loaded
        paths, named = _candidates()
        tried = []
        for p in paths:
            if not named and not _exists(p):
                tried.append(p)
                continue
            try:
                lib = ctypes.CDLL(p)
            except OSError as e:
                if named:
                    raise KeelLibraryError(f"KEEL_LIBRARY={p}: cannot load: {e}") from None
                tried.append(f"{p} ({e})")
                continue
            try:
                for name, restype, argtypes in _PROTOTYPES:
                    f = getattr(lib, name)
                    f.restype = restype
                    f.argtypes = argtypes
            except AttributeError as e:
                raise KeelLibraryError(f"{p} is not a libkeel.so this package can use: {e}") from None
            _loaded = (p, lib)
            return _loaded
        raise KeelLibraryError("libkeel.so not found: set KEEL_LIBRARY to its path (e.g. build/libkeel.so "
                               "after make build), or install keel (make install). Tried: " + ", ".join(tried))
