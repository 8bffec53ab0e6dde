#!/usr/bin/env python3
"""chat.py: keel's embedding API from Python, through ctypes only.

A binding of keel_engine_open, keel_complete, keel_engine_response,
keel_engine_cancel, keel_engine_reset, keel_engine_stats, keel_engine_close
and keel_strerror (include/keel.h, section "Engine"), and a two-turn
conversation with tools. It runs on a threading.Thread with a 256 KiB
stack (the stack keel's library code is written to fit) and streams the
text deltas to stdout as they come:

    python3 examples/python/chat.py -m MODEL.gguf [--lib build/libkeel.so]

Turn 1 asks a question and offers a tool (an OpenAI tools array). Turn 2
adds the assistant's message and a tool result: the result of the model's
own call, or, if the model made none (small test models never do), of a
scripted call, so that the tool-result path still runs. After each turn it
prints the response JSON on one line starting "response: ". At the end it
prints the engine's stats ("stats: "), resets the engine and prints them
again ("stats after reset: "). Ctrl-C cancels the running turn
(keel_engine_cancel, called from the main thread; it is thread-safe).

Compaction is a per-turn option: --kv-compact POLICY turns it on from turn 1,
--turn2-compact none (or a policy) switches it for turn 2, at run time.

Needs only Debian's python3 (ctypes, json, threading); no pip packages.
"""

import argparse
import codecs
import ctypes
import json
import os
import sys
import threading
from ctypes import (CFUNCTYPE, POINTER, Structure, byref, c_bool, c_char, c_char_p, c_float, c_int, c_int32,
                    c_size_t, c_uint64, c_void_p)

# ---- the binding ------------------------------------------------------------------

# keel_status codes this program tells apart (keel.h, KEEL_STATUS_TABLE)
KEEL_OK = 0
KEEL_ERANGE = 4
KEEL_ENOENT = 8
KEEL_ECANCELED = 12

# keel_event_kind
EVENT_CONTENT = 0     # text delta of the answer
EVENT_REASONING = 1   # text delta of the reasoning (<think> ...)
EVENT_TOOL_BEGIN = 2  # a tool call starts: index, id, name
EVENT_TOOL_ARGS = 3   # text delta of tool call `index`'s JSON arguments
EVENT_TOOL_END = 4    # tool call `index` is complete
EVENT_DONE = 5        # the request ended: response holds the response JSON
EVENT_PROMPT = 6      # the request took a slot: n_prompt_tokens, n_cached_tokens
EVENT_LOGPROB = 7     # "logprobs" requests: one token's entry (JSON in text), before its text


class KeelEvent(Structure):
    """struct keel_event, field for field (C enums are int on every ABI keel targets).

    Pointers are valid only during the callback: copy what you keep."""
    _fields_ = [
        ("kind", c_int),         # keel_event_kind
        ("request", c_uint64),   # the request's id
        ("index", c_int32),      # tool call index for TOOL_*, else -1
        ("text", c_void_p),      # const char *: `len` bytes, NOT NUL-terminated (so not c_char_p)
        ("len", c_size_t),
        ("id", c_char_p),        # TOOL_BEGIN: the call id (NUL-terminated)
        ("name", c_char_p),      # TOOL_BEGIN: the function name
        ("response", c_char_p),  # DONE: the response JSON
        ("status", c_int),       # DONE: keel_status
        ("error", c_char_p),     # TOOL_END: NULL or why the call is malformed
        ("n_prompt_tokens", c_int32),  # PROMPT: tokens of the prompt
        ("n_cached_tokens", c_int32),  # PROMPT: of those, reused from the cache
        ("token", c_int32),      # LOGPROB: the token id
        ("logprob", c_float),    # LOGPROB: its log-probability
    ]

    def data(self):
        """The delta bytes (CONTENT, REASONING, TOOL_ARGS)."""
        return ctypes.string_at(self.text, self.len) if self.len else b""


# typedef bool (*keel_event_fn)(void *user, const keel_event *ev);
EVENT_FN = CFUNCTYPE(c_bool, c_void_p, POINTER(KeelEvent))


class KeelError(RuntimeError):
    """A call returned a status other than KEEL_OK."""

    def __init__(self, keel, func, status, detail, response=None):
        self.status = status
        self.response = response  # the response dict when the turn produced one
        name = keel.lib.keel_status_name(status).decode()
        text = keel.strerror(status)
        super().__init__(f"{func}: {name} ({text}){': ' + detail if detail else ''}")


class Keel:
    """libkeel.so, loaded with ctypes.CDLL (which releases the GIL during each call, so
    another Python thread can run, e.g. to call keel_engine_cancel)."""

    _PROTOTYPES = [
        ("keel_version", c_char_p, []),
        ("keel_strerror", c_char_p, [c_int]),
        ("keel_status_name", c_char_p, [c_int]),
        ("keel_engine_open", c_int, [c_char_p, POINTER(c_void_p), POINTER(c_char)]),
        ("keel_engine_close", None, [c_void_p]),
        ("keel_engine_last_error", c_char_p, [c_void_p]),
        ("keel_complete", c_int,
         [c_void_p, c_char_p, c_char_p, c_char_p, EVENT_FN, c_void_p, POINTER(c_char), c_size_t]),
        ("keel_engine_response", c_int, [c_void_p, POINTER(c_char), c_size_t, POINTER(c_size_t)]),
        ("keel_engine_cancel", None, [c_void_p]),
        ("keel_engine_reset", c_int, [c_void_p]),
        ("keel_engine_stats", c_int, [c_void_p, POINTER(c_char), c_size_t, POINTER(c_size_t)]),
    ]

    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        for name, restype, argtypes in self._PROTOTYPES:
            f = getattr(self.lib, name)
            f.restype = restype
            f.argtypes = argtypes

    def version(self):
        return self.lib.keel_version().decode()

    def strerror(self, status):
        return self.lib.keel_strerror(status).decode()


class Engine:
    """A keel_engine: a model, its cache and its chat template. Not for concurrent
    complete() calls; cancel() and stats() may be called from any thread."""

    def __init__(self, keel, options):
        self.keel = keel
        self.handle = c_void_p()
        err = ctypes.create_string_buffer(256)
        st = keel.lib.keel_engine_open(json.dumps(options).encode(), byref(self.handle), err)
        if st != KEEL_OK:
            self.handle = c_void_p()
            raise KeelError(keel, "keel_engine_open", st, err.value.decode(errors="replace"))

    def close(self):
        if self.handle:
            self.keel.lib.keel_engine_close(self.handle)
            self.handle = c_void_p()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def last_error(self):
        return self.keel.lib.keel_engine_last_error(self.handle).decode(errors="replace")

    def complete(self, messages, options=None, tools=None, on_event=None, response_cap=65536):
        """One chat turn (keel_complete) on the calling thread.

        on_event(ev: KeelEvent) receives every event while the turn runs (on this
        thread); returning False stops the turn. Returns (status, response dict):
        status is KEEL_OK or KEEL_ECANCELED (cancel() or on_event returned False);
        other statuses raise KeelError."""
        lib = self.keel.lib
        raised = []
        done = []

        def trampoline(_user, ev_p):
            ev = ev_p.contents
            try:
                if ev.kind == EVENT_DONE:
                    done.append((ev.response or b"").decode())
                return bool(on_event(ev)) if on_event else True
            except BaseException as e:  # nothing may unwind through C: stop the turn, raise after
                raised.append(e)
                return False

        cb = EVENT_FN(trampoline)  # must stay referenced until keel_complete returns
        buf = ctypes.create_string_buffer(response_cap)
        st = lib.keel_complete(self.handle, json.dumps(messages).encode(),
                               json.dumps(options).encode() if options else None,
                               json.dumps(tools).encode() if tools else None,
                               cb, None, buf, len(buf))
        if raised:
            raise raised[0]
        if st == KEEL_ERANGE:  # the turn happened; its response did not fit
            text = self.response()
        else:
            text = buf.value.decode()
        response = json.loads(text) if text else None
        if st not in (KEEL_OK, KEEL_ERANGE, KEEL_ECANCELED):
            raise KeelError(self.keel, "keel_complete", st, self.last_error(), response)
        # the DONE event carried the same response: the mirrored struct is right
        if done != [text]:
            raise RuntimeError("DONE event response differs from keel_complete's "
                               "(does KeelEvent match keel_event in keel.h?)")
        return (KEEL_ECANCELED if st == KEEL_ECANCELED else KEEL_OK), response

    def _sized(self, func, name):
        # func(handle, buf, cap, &n): KEEL_ERANGE with n = the size needed
        n = c_size_t(0)
        buf = ctypes.create_string_buffer(4096)
        st = func(self.handle, buf, len(buf), byref(n))
        if st == KEEL_ERANGE:
            buf = ctypes.create_string_buffer(n.value)
            st = func(self.handle, buf, len(buf), byref(n))
        if st != KEEL_OK:
            raise KeelError(self.keel, name, st, self.last_error())
        return buf.value.decode()

    def response(self):
        """The last turn's response JSON text (keel_engine_response)."""
        return self._sized(self.keel.lib.keel_engine_response, "keel_engine_response")

    def stats(self):
        """Slots, tokens and the memory plan (keel_engine_stats), as a dict."""
        return json.loads(self._sized(self.keel.lib.keel_engine_stats, "keel_engine_stats"))

    def cancel(self):
        """Cancels the running turn; thread-safe (keel_engine_cancel)."""
        self.keel.lib.keel_engine_cancel(self.handle)

    def reset(self):
        """Forgets the cached conversation (keel_engine_reset)."""
        st = self.keel.lib.keel_engine_reset(self.handle)
        if st != KEEL_OK:
            raise KeelError(self.keel, "keel_engine_reset", st, self.last_error())


# ---- the conversation ---------------------------------------------------------------

TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}]


def get_weather(city, unit="celsius"):
    """A stand-in for a real weather service."""
    t = 18 if unit == "celsius" else 64
    return {"city": city, "temperature": t, "unit": unit, "sky": "light rain"}


def run_tool(call):
    """The tool message answering one OpenAI tool call."""
    fn = call.get("function", {})
    name = fn.get("name", "")
    try:
        args = fn.get("arguments", "{}")
        args = json.loads(args) if isinstance(args, str) else args
        if name != "get_weather":
            result = {"error": f"unknown tool {name!r}"}
        else:
            result = get_weather(**{k: v for k, v in args.items() if k in ("city", "unit")})
    except (ValueError, TypeError, AttributeError) as e:
        result = {"error": f"bad arguments: {e}"}
    return {"role": "tool", "tool_call_id": call.get("id", ""), "name": name,
            "content": json.dumps(result)}


_CONTROL = {c: f"\\x{c:02x}" for c in list(range(0x20)) + [0x7f] if c not in (0x09, 0x0a)}


class Printer:
    """Streams event deltas to stdout (UTF-8 decoded incrementally; control characters
    shown escaped: a random test model writes anything)."""

    def __init__(self, out):
        self.out = out
        self.dec = {}
        self.at_line_start = True
        self.mode = EVENT_CONTENT

    def write(self, s):
        if s:
            self.out.write(s)
            self.out.flush()
            self.at_line_start = s.endswith("\n")

    def text(self, kind, data):
        d = self.dec.setdefault(kind, codecs.getincrementaldecoder("utf-8")(errors="replace"))
        self.write(d.decode(data).translate(_CONTROL))

    def __call__(self, ev):
        if ev.kind in (EVENT_CONTENT, EVENT_REASONING):
            if ev.kind != self.mode:
                self.write("[reasoning] " if ev.kind == EVENT_REASONING else "\n")
                self.mode = ev.kind
            self.text(ev.kind, ev.data())
        elif ev.kind == EVENT_TOOL_BEGIN:
            self.line()
            self.write(f"[tool call {ev.index}: {ev.name.decode(errors='replace')} "
                       f"id {ev.id.decode(errors='replace')}] ")
        elif ev.kind == EVENT_TOOL_ARGS:
            self.text(EVENT_TOOL_ARGS, ev.data())
        elif ev.kind == EVENT_TOOL_END:
            self.write("\n")
        return True

    def line(self):
        if not self.at_line_start:
            self.write("\n")

    def finish(self):
        # bytes of an incomplete UTF-8 sequence at the end (a model may stop mid-character)
        for d in self.dec.values():
            self.write(d.decode(b"", final=True))
        self.line()


def compact_option(policy, args):
    if policy == "none":
        return "none"
    spec = {"policy": policy}
    if args.kv_trigger:
        spec["trigger"] = args.kv_trigger
    if args.kv_target:
        spec["target"] = args.kv_target
    return spec


def conversation(engine, args, out, stop):
    """The two turns; returns the process exit status."""
    opts = {"max_tokens": args.max_tokens, "temperature": args.temperature, "seed": args.seed}
    messages = [
        {"role": "system", "content": "You are a helpful assistant. Use the tools when they help."},
        {"role": "user", "content": "What is the weather like in Paris today? Answer in one sentence."},
    ]
    turns = [dict(opts), dict(opts)]
    if args.kv_compact:
        turns[0]["kv_compact"] = compact_option(args.kv_compact, args)
    if args.turn2_compact:
        turns[1]["kv_compact"] = compact_option(args.turn2_compact, args)
    for t, turn_opts in enumerate(turns, 1):
        if stop.is_set():
            return 130
        p = Printer(out)
        p.write(f"--- turn {t}\n")
        status, resp = engine.complete(messages, turn_opts, TOOLS,
                                       on_event=lambda ev: p(ev) and not stop.is_set(),
                                       response_cap=args.response_cap)
        p.finish()
        out.write("response: " + json.dumps(resp, ensure_ascii=False, separators=(",", ":")) + "\n")
        out.flush()
        if status == KEEL_ECANCELED:
            print("chat.py: cancelled", file=sys.stderr)
            return 130
        if t == 1:
            calls = resp.get("tool_calls") or []
            if not calls:
                print("chat.py: the model made no tool call; turn 2 answers a scripted "
                      "get_weather(city='Paris') call", file=sys.stderr)
                calls = [{"id": "call_scripted_0", "type": "function",
                          "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]
            messages = messages + [{"role": "assistant", "content": resp.get("content") or "",
                                    "tool_calls": calls}]
            messages += [run_tool(c) for c in calls]
    out.write("stats: " + json.dumps(engine.stats(), separators=(",", ":")) + "\n")
    engine.reset()  # a new conversation would start from an empty cache
    out.write("stats after reset: " + json.dumps(engine.stats(), separators=(",", ":")) + "\n")
    out.flush()
    return 0


def default_lib():
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(here, "..", "..", "build", "libkeel.so")


def main():
    ap = argparse.ArgumentParser(description="Two chat turns with tools through libkeel.so (ctypes).")
    ap.add_argument("-m", "--model", required=True, help="GGUF model (or llama2.c .bin with --tokenizer)")
    ap.add_argument("--lib", default=default_lib(), help="libkeel.so (default: build/libkeel.so of this repo)")
    ap.add_argument("--tokenizer", help="llama2.c tokenizer.bin for a .bin checkpoint")
    ap.add_argument("--max-tokens", type=int, default=128, help="tokens per turn (-1: until the end)")
    ap.add_argument("--temperature", type=float, default=0.7, help="0: greedy")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--ctx", type=int, default=0, help="cache cells (0: the engine's default)")
    ap.add_argument("--threads", type=int, default=0, help="0: all CPUs")
    ap.add_argument("--chat-template", help="built-in name (chatml, llama3, gemma, mistral, qwen3), file "
                                            "or source (default: the model's own)")
    ap.add_argument("--kv-compact", metavar="POLICY",
                    help="KV compaction from turn 1: none, window, keydiff, knorm, random")
    ap.add_argument("--kv-trigger", type=int, default=0, help="compact above this many cells")
    ap.add_argument("--kv-target", type=int, default=0, help="cells kept by a compaction")
    ap.add_argument("--turn2-compact", metavar="POLICY", help="switch compaction for turn 2 (e.g. none)")
    ap.add_argument("--response-cap", type=int, default=65536,
                    help="bytes of the response buffer (a smaller response is fetched with "
                         "keel_engine_response)")
    ap.add_argument("--stack-kib", type=int, default=256, help="the conversation thread's stack")
    args = ap.parse_args()
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(encoding="utf-8", errors="replace")
    if not os.path.exists(args.lib):
        print(f"chat.py: {args.lib} not found: build it (make build) or pass --lib PATH", file=sys.stderr)
        return 1
    keel = Keel(args.lib)
    options = {"model": args.model, "n_threads": args.threads}
    for key, val in (("n_ctx", args.ctx), ("tokenizer", args.tokenizer), ("chat_template", args.chat_template)):
        if val:
            options[key] = val
    try:
        engine = Engine(keel, options)
    except KeelError as e:
        print(f"chat.py: {e}", file=sys.stderr)
        return 1
    print(f"keel {keel.version()}, model {args.model}", file=sys.stderr)
    stop = threading.Event()
    result = {}

    def worker():
        try:
            result["rc"] = conversation(engine, args, sys.stdout, stop)
        except Exception as e:  # reported by the main thread
            result["error"] = e

    # the stack size applies to threads started after the call
    threading.stack_size(args.stack_kib * 1024)
    th = threading.Thread(target=worker, name="keel-chat", daemon=True)
    th.start()
    threading.stack_size(0)
    try:
        while th.is_alive():
            th.join(0.1)
    except KeyboardInterrupt:
        stop.set()
        engine.cancel()
        th.join()
    engine.close()
    if "error" in result:
        print(f"chat.py: {result['error']}", file=sys.stderr)
        return 1
    return result.get("rc", 130)


if __name__ == "__main__":
    sys.exit(main())
