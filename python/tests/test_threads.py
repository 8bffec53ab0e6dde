"""keel on a thread with a 256 KiB stack (design rule 8): a turn with a tool
call and streamed events on a threading.Thread started after
threading.stack_size(256 KiB), and the stack such a turn touches, measured
on a pthread whose 256 KiB stack is painted first (with a guard page below
it: an overflow crashes instead of passing)."""
import ctypes
import mmap
import os
import threading

import pytest

from conftest import TOOLS

SMALL = 256 * 1024
USER = [{"role": "user", "content": "What is the weather in Oslo?"}]


def two_turns(keel, engine, out):
    """A forced tool call, then the tool's answer, with on_event callbacks (Python on this stack)."""
    pieces = []
    r1 = engine.complete(USER, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, temperature=1,
                         seed=5, max_tokens=300,
                         on_event=pieces.append)
    msgs = USER + [r1.message()] + [keel.tool_message(c, {"temperature": 3}) for c in r1.tool_calls]
    r2 = engine.complete(msgs, tools=TOOLS, temperature=0, max_tokens=16, on_event=pieces.append)
    out.extend([r1, r2, pieces])


def test_turns_on_a_256k_threading_thread(keel_mod, model):
    keel = keel_mod
    out, errors = [], []
    with keel.Engine(model, chat_template="qwen3", n_ctx=4096, n_threads=2) as engine:
        def body():
            try:
                two_turns(keel, engine, out)
            except BaseException as e:  # reported on the main thread
                errors.append(e)

        old = threading.stack_size(SMALL)
        try:
            th = threading.Thread(target=body)
            th.start()
        finally:
            threading.stack_size(old)
        th.join(120)
        assert not th.is_alive()
    assert not errors, errors
    r1, r2, pieces = out
    assert r1.tool_calls and r1.finish_reason == "tool_calls"
    assert r2.usage.cached_tokens > 0 and r2.usage.completion_tokens > 0
    assert sum(isinstance(p, keel.ToolCallEvent) for p in pieces) == len(r1.tool_calls)


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    for name in ("pthread_create", "pthread_join", "pthread_attr_init", "pthread_attr_setstack",
                 "pthread_attr_destroy", "mprotect"):
        if not hasattr(libc, name):
            pytest.skip(f"libc has no {name}")
    return libc


def test_stack_touched_by_a_turn(keel_mod, model):
    """Runs two turns on a pthread with a painted 256 KiB stack; the bytes
    touched (glibc's thread descriptor and TLS at its top included) must
    leave room."""
    keel = keel_mod
    libc = _libc()
    page = mmap.PAGESIZE
    mem = mmap.mmap(-1, SMALL + page, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    anchor = ctypes.c_char.from_buffer(mem)
    base = ctypes.addressof(anchor)
    assert libc.mprotect(ctypes.c_void_p(base), ctypes.c_size_t(page), 0) == 0  # the guard page: PROT_NONE
    stack = base + page
    ctypes.memset(stack, 0xA5, SMALL)
    attr = ctypes.create_string_buffer(256)  # pthread_attr_t: 56 bytes on x86_64/arm64 glibc
    assert libc.pthread_attr_init(attr) == 0
    assert libc.pthread_attr_setstack(attr, ctypes.c_void_p(stack), ctypes.c_size_t(SMALL)) == 0

    out, errors = [], []
    engine = keel.Engine(model, chat_template="qwen3", n_ctx=4096, n_threads=2)

    def body(_arg):
        try:
            two_turns(keel, engine, out)
        except BaseException as e:
            errors.append(e)
        return None

    fn = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(body)
    tid = ctypes.c_ulong()
    try:
        assert libc.pthread_create(ctypes.byref(tid), attr, fn, None) == 0
        assert libc.pthread_join(tid, None) == 0
    finally:
        libc.pthread_attr_destroy(attr)
        engine.close()
    assert not errors, errors
    painted = ctypes.string_at(stack, SMALL)
    untouched = len(painted) - len(painted.lstrip(b"\xa5"))
    used = SMALL - untouched
    del painted, anchor
    libc.mprotect(ctypes.c_void_p(base), ctypes.c_size_t(page), 3)
    mem.close()
    print(f"256 KiB stack: two turns with callbacks touched {used // 1024} KiB")
    assert out[0].tool_calls and out[1].usage.completion_tokens > 0
    limit = SMALL if os.environ.get("KEEL_ASAN") else SMALL * 3 // 4
    assert used < limit, f"a turn touched {used} bytes of a {SMALL}-byte stack"
