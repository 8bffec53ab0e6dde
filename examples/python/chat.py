#!/usr/bin/env python3
"""chat.py: a two-turn conversation with tools through the keel Python package
(python/: ctypes over libkeel.so). It runs on a threading.Thread with a
256 KiB stack (the stack keel's library code is written to fit) and streams
the text deltas to stdout as they come:

    python3 examples/python/chat.py -m MODEL.gguf [--lib build/libkeel.so]

The package is used installed (pip install ./python) or, if it is not, from
this repository's python/ directory; libkeel.so is --lib, else KEEL_LIBRARY,
else this repository's build/libkeel.so when it exists, else the package's
own lookup (next to the package, then the system's library paths).

Turn 1 asks a question and offers a tool (an OpenAI tools array). Turn 2
adds the assistant's message and a tool result: the result of the model's
own call, or, if the model made none (small test models never do), of a
scripted call, so that the tool-result path still runs. After each turn it
prints the response JSON on one line starting "response: ". At the end it
prints the engine's stats ("stats: "), resets the engine and prints them
again ("stats after reset: "). Ctrl-C cancels the running turn
(Engine.cancel, called from the main thread; it is thread-safe).

Compaction is a per-turn option: --kv-compact POLICY turns it on from turn 1,
--turn2-compact none (or a policy) switches it for turn 2, at run time.

Needs only python3 and the keel package; no pip packages.
"""

import argparse
import json
import os
import sys
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

try:
    import keel
except ImportError:  # not installed: the package in this repository
    sys.path.insert(0, os.path.join(REPO, "python"))
    import keel

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
    """The tool message answering one call (a keel.ToolCall)."""
    try:
        args = call.args()
        if call.name != "get_weather":
            result = {"error": f"unknown tool {call.name!r}"}
        else:
            result = get_weather(**{k: v for k, v in args.items() if k in ("city", "unit")})
    except (ValueError, TypeError, AttributeError) as e:
        result = {"error": f"bad arguments: {e}"}
    return keel.tool_message(call, result)


_CONTROL = {c: f"\\x{c:02x}" for c in list(range(0x20)) + [0x7f] if c not in (0x09, 0x0a)}


class Printer:
    """Streams a turn's events to stdout (control characters shown escaped:
    a random test model writes anything)."""

    def __init__(self, out):
        self.out = out
        self.at_line_start = True
        self.reasoning = False

    def write(self, s):
        if s:
            self.out.write(s)
            self.out.flush()
            self.at_line_start = s.endswith("\n")

    def __call__(self, ev):
        if isinstance(ev, (keel.TextDelta, keel.ReasoningDelta)):
            reasoning = isinstance(ev, keel.ReasoningDelta)
            if reasoning != self.reasoning:
                self.write("[reasoning] " if reasoning else "\n")
                self.reasoning = reasoning
            self.write(ev.text.translate(_CONTROL))
        elif isinstance(ev, keel.ToolCallStart):
            self.line()
            self.write(f"[tool call {ev.index}: {ev.name} id {ev.id}] ")
        elif isinstance(ev, keel.ToolCallDelta):
            self.write(ev.arguments.translate(_CONTROL))
        elif isinstance(ev, keel.ToolCallEvent):
            self.write("\n")
        return True

    def line(self):
        if not self.at_line_start:
            self.write("\n")


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
        result = engine.complete(messages, TOOLS, on_event=lambda ev: p(ev) and not stop.is_set(), **turn_opts)
        p.line()
        out.write("response: " + json.dumps(result.raw, ensure_ascii=False, separators=(",", ":")) + "\n")
        out.flush()
        if result.cancelled:
            print("chat.py: cancelled", file=sys.stderr)
            return 130
        if t == 1:
            calls = list(result.tool_calls)
            message = result.message()
            if not calls:
                print("chat.py: the model made no tool call; turn 2 answers a scripted "
                      "get_weather(city='Paris') call", file=sys.stderr)
                calls = [keel.ToolCall(id="call_scripted_0", name="get_weather",
                                       arguments=json.dumps({"city": "Paris"}))]
                message["tool_calls"] = [c.to_dict() for c in calls]
            messages = messages + [message] + [run_tool(c) for c in calls]
    out.write("stats: " + json.dumps(engine.stats(), separators=(",", ":")) + "\n")
    engine.reset()  # a new conversation would start from an empty cache
    out.write("stats after reset: " + json.dumps(engine.stats(), separators=(",", ":")) + "\n")
    out.flush()
    return 0


def main():
    ap = argparse.ArgumentParser(description="Two chat turns with tools through the keel package (libkeel.so).")
    ap.add_argument("-m", "--model", required=True, help="GGUF model (or llama2.c .bin with --tokenizer)")
    ap.add_argument("--lib", help="libkeel.so (default: KEEL_LIBRARY, else build/libkeel.so of this repo when it "
                                  "exists, else the package's lookup)")
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
    ap.add_argument("--stack-kib", type=int, default=256, help="the conversation thread's stack")
    args = ap.parse_args()
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(encoding="utf-8", errors="replace")
    repo_lib = os.path.join(REPO, "build", "libkeel.so")
    if args.lib:
        if not os.path.exists(args.lib):
            print(f"chat.py: {args.lib} not found: build it (make build) or pass --lib PATH", file=sys.stderr)
            return 1
        os.environ["KEEL_LIBRARY"] = args.lib
    elif not os.environ.get("KEEL_LIBRARY") and os.path.exists(repo_lib):
        os.environ["KEEL_LIBRARY"] = repo_lib
    options = {"n_threads": args.threads, "n_ctx": args.ctx or None, "tokenizer": args.tokenizer,
               "chat_template": args.chat_template}
    try:
        engine = keel.Engine(args.model, **options)
    except keel.KeelError as e:
        print(f"chat.py: {e}", file=sys.stderr)
        return 1
    print(f"keel {keel.version()} ({keel.library_path()}), model {args.model}", file=sys.stderr)
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
