#!/usr/bin/env python3
"""Several greedy streams at once through `keel serve`: the decode speed of
the slots together, as an agent server runs them.

    scripts/slots-bench.py KEEL MODEL [--streams 2] [--slots N] [--tokens 300]
        [--context FILE] [--long K] [--idle 0] [--spec none|ngram] [-t 2] [-c 32768] [--rounds 1]

Starts `KEEL serve` on a free port with --slots slots (default: the streams
plus the idle ones), then per round sends --streams concurrent greedy
/v1/completions of --tokens tokens each (ignore_eos) and prints the wall
time, the tokens per second of all streams together, each stream's own
decode speed (the server's timings) and the drafts.

With --context FILE each stream's prompt is the file's text (the first one
as it is, the others its words in other orders, so no two share a prefix),
sent once with max_tokens 1 before the rounds so that the streams decode
after a cached context of that length (--long K: only the first K streams,
the others a few words); --idle K more prompts are sent the same way and
left cached in slots that stay idle. Without it the prompts
are a few words each. Only the Python standard library is used.
"""
import argparse
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request

SHORT = ["Once upon a time", "The little dog", "One day, a girl", "Tom and Sue", "The sun was hot",
         "A big red ball", "In the park", "Lily had a cat"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=1800) as r:
        return json.loads(r.read())


def prompts(args):
    n = args.streams + args.idle
    if not args.context:
        return [SHORT[i % len(SHORT)] + ("" if i < len(SHORT) else f" ({i})") for i in range(n)]
    words = open(args.context, encoding="utf-8").read().split()
    out = []
    for i in range(n):
        if args.long is not None and args.long <= i < args.streams:
            out.append(SHORT[i % len(SHORT)])
            continue
        if i == 0:
            w = words
        elif i == 1:
            w = list(reversed(words))
        else:  # every i-th word first, then the rest
            w = words[i - 1::i] + [x for j, x in enumerate(words) if j % i != i - 1]
        out.append(" ".join(w))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("keel")
    ap.add_argument("model")
    ap.add_argument("--streams", type=int, default=2)
    ap.add_argument("--slots", type=int, default=0)
    ap.add_argument("--tokens", type=int, default=300)
    ap.add_argument("--context")
    ap.add_argument("--long", type=int)
    ap.add_argument("--idle", type=int, default=0)
    ap.add_argument("--spec", default="none")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-c", "--ctx", type=int, default=32768)
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    slots = args.slots or args.streams + args.idle
    port = free_port()
    srv = subprocess.Popen([args.keel, "serve", "-m", args.model, "-c", str(args.ctx), "-np", str(slots), "--spec",
                            args.spec, "-t", str(args.threads), "--port", str(port)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if b"ok" in r.read():
                        break
            except OSError:
                time.sleep(0.2)
        else:
            sys.exit("keel serve did not answer /health")
        ps = prompts(args)
        n_ctx = []
        if args.context:
            for p in ps:
                n_ctx.append(post(port, {"prompt": p, "max_tokens": 1, "temperature": 0})["usage"]["prompt_tokens"])
        for rnd in range(args.rounds):
            res = [None] * args.streams

            def run(i):
                res[i] = post(port, {"prompt": ps[i], "max_tokens": args.tokens, "temperature": 0,
                                     "ignore_eos": True})

            t0 = time.time()
            th = [threading.Thread(target=run, args=(i,)) for i in range(args.streams)]
            for x in th:
                x.start()
            for x in th:
                x.join()
            wall = time.time() - t0
            tm = [r.get("timings", {}) for r in res]
            got = sum(r["usage"]["completion_tokens"] for r in res)
            each = " / ".join(f"{t.get('predicted_per_second', 0):.1f}" for t in tm)
            drafted = sum(t.get("draft_n", 0) or 0 for t in tm)
            accepted = sum(t.get("draft_n_accepted", 0) or 0 for t in tm)
            ctx = f" after {min(n_ctx)}-{max(n_ctx)} cached tokens" if n_ctx else ""
            print(f"round {rnd + 1}: {args.streams} streams of {args.tokens}{ctx} ({args.idle} idle slots cached): "
                  f"{wall:.2f} s, {got / wall:.1f} tok/s together; each {each} tok/s; "
                  f"drafted {drafted}, accepted {accepted}", flush=True)
    finally:
        srv.terminate()
        srv.wait()


if __name__ == "__main__":
    main()
