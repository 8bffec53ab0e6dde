"""keel: chat turns with tools on a local model, through libkeel.so (ctypes).

    import keel

    with keel.Engine("model.gguf", n_ctx=8192) as engine:
        messages = [{"role": "user", "content": "Weather in Paris?"}]
        result = engine.complete(messages, tools=TOOLS, max_tokens=256)
        if result.tool_calls:                           # keel.ToolCall objects
            messages.append(result.message())
            messages += [keel.tool_message(c, {"sky": "rain"}) for c in result.tool_calls]
        for ev in engine.stream(messages, tools=TOOLS):  # the next turn reuses the cache
            if isinstance(ev, keel.TextDelta):
                print(ev.text, end="", flush=True)
            elif isinstance(ev, keel.Done):
                print("\\ncached tokens:", ev.usage.cached_tokens)

Engine(model, **options) opens keel_engine_open with the options as JSON;
complete() and stream() take keel_complete's request options as keyword
arguments (max_tokens, temperature, kv_compact, tool_choice, grammar, ...;
include/keel.h lists them). Errors raise a KeelError subclass carrying
keel's status (.status, .status_name) and message (.message).

libkeel.so is found through KEEL_LIBRARY (a path), then next to the package,
then ctypes.util.find_library("keel"), then /usr/local/lib and /usr/lib
(keel.library_path() says which was loaded).

Thread-safety:
  - One turn at a time per Engine: a complete() or stream() while another
    runs on the same engine raises StateError (use one Engine per thread,
    or n_slots > 1 and the server, for concurrent conversations). Engines
    are independent of each other.
  - cancel(), stats() and count_tokens() may be called from any thread at
    any time; cancel() makes the running turn end at its next step with
    finish_reason "cancelled" (a cancel during a long prefill interrupts it).
  - close() may be called from any thread: it cancels a running turn, waits
    for it and for calls in progress, then frees the engine; later calls
    raise StateError. Not from inside an on_event callback (StateError).
  - complete() runs keel on the calling thread and calls on_event there;
    stream() runs keel on a worker thread of the package and hands the
    events to the thread that iterates. ctypes releases the GIL during keel
    calls, so other Python threads run meanwhile.
  - keel's code fits a 256 KiB thread stack (design rule 8): complete() works
    on a threading.Thread started after threading.stack_size(256 * 1024),
    on-event callbacks included (python/tests/test_threads.py measures the
    stack a turn touches). keel's own worker threads have their own stacks.
  - Ctrl-C while complete() runs on the main thread cancels the turn (at the
    next event) and raises KeyboardInterrupt after keel returned.
"""

from ._errors import (CacheFullError, CancelledError, ContextError, FormatError, InternalError, InvalidArgumentError,
                      KeelError, KeelIOError, KeelLibraryError, NotFoundError, OutOfMemoryError, RangeError,
                      ScratchError, SizeOverflowError, StateError, UnsupportedError, error_class)
from ._engine import Engine, Stream
from ._types import (Completion, Done, Event, LogprobEvent, Memory, PromptEvent, ReasoningDelta, TextDelta, Timings,
                     ToolCall, ToolCallDelta, ToolCallEvent, ToolCallStart, Usage, tool_message)

__version__ = "0.1.0"

__all__ = [
    "Engine", "Stream", "Completion", "ToolCall", "Usage", "Timings", "Memory", "tool_message",
    "Event", "PromptEvent", "TextDelta", "ReasoningDelta", "ToolCallStart", "ToolCallDelta", "ToolCallEvent",
    "LogprobEvent", "Done",
    "KeelError", "KeelLibraryError", "InvalidArgumentError", "OutOfMemoryError", "SizeOverflowError", "RangeError",
    "FormatError", "KeelIOError", "UnsupportedError", "NotFoundError", "CacheFullError", "ScratchError",
    "StateError", "CancelledError", "ContextError", "InternalError", "error_class",
    "library_path", "version",
]


def library_path():
    """The path of the libkeel.so in use (loads it)."""
    from ._lib import load
    return load()[0]


def version():
    """libkeel's version string (keel_version)."""
    from ._lib import load
    return load()[1].keel_version().decode()
