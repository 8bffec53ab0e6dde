#!/usr/bin/env python3
"""Speculative decoding on an agent replay: plays a coding agent's turns
against two `keel serve` processes started here, one with drafts and one
without, and prints the acceptance and the decode speed of each turn.

    scripts/spec-replay.py KEEL MODEL [--spec ngram] [--turns 12] [--max-tokens 96]

Each turn's prompt grows with what an agent's context holds: a file it
read (a tool result), the previous answers, and the user's next request
(quote and extend the file). Greedy decoding, one slot, --deterministic, so
both servers answer with the same text; the script checks that too.
Only the Python standard library is used.
"""
import argparse
import http.client
import json
import os
import re
import subprocess
import sys
import time

FILE = """static int32_t ring_next(const ring *r, int32_t i)
{
    return i + 1 == r->cap ? 0 : i + 1;
}

static keel_status ring_push(ring *r, const int32_t *x, int32_t n)
{
    if (r->len + n > r->cap) return KEEL_EFULL;
    for (int32_t i = 0; i < n; i++) {
        r->data[r->tail] = x[i];
        r->tail = ring_next(r, r->tail);
    }
    r->len += n;
    return KEEL_OK;
}
"""


def start(keel, model, extra):
    args = [keel, "serve", "-m", model, "--port", "0", "-c", "4096", "-t", "2", "--deterministic",
            "--log-disable"] + extra
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    port = None
    for line in p.stdout:
        m = re.search(r"listening on .*:(\d+)", line)
        if m:
            port = int(m.group(1))
            break
    if port is None:
        p.kill()
        sys.exit("keel serve did not start")
    for _ in range(100):
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return p, port
        except OSError:
            time.sleep(0.1)
    p.kill()
    sys.exit("keel serve is not healthy")


def chat(port, messages, max_tokens):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = json.dumps({"messages": messages, "max_tokens": max_tokens, "temperature": 0})
    c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    d = json.loads(r.read())
    if r.status != 200:
        sys.exit("request failed: %s" % d)
    return d


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("keel")
    ap.add_argument("model")
    ap.add_argument("--spec", default="ngram")
    ap.add_argument("--turns", type=int, default=12)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    servers = [start(a.keel, a.model, []), start(a.keel, a.model, ["--spec", a.spec])]
    rows = []
    try:
        msgs = [{"role": "system", "content": "You are a coding agent. Quote code exactly."},
                {"role": "user", "content": "Read ring.c and add a ring_pop function."},
                {"role": "assistant", "content": "Reading the file."},
                {"role": "user", "content": "Tool result (ring.c):\n" + FILE}]
        for turn in range(a.turns):
            out = []
            for _, port in servers:
                t0 = time.time()
                d = chat(port, msgs, a.max_tokens)
                out.append((d, time.time() - t0))
            (d0, _), (d1, _) = out
            text0 = d0["choices"][0]["message"]["content"]
            text1 = d1["choices"][0]["message"]["content"]
            t0 = d0.get("timings", {}).get("predicted_per_second", 0.0)
            t1 = d1.get("timings", {}).get("predicted_per_second", 0.0)
            det = d1["usage"].get("completion_tokens_details", {})
            acc = det.get("accepted_prediction_tokens", 0)
            rej = det.get("rejected_prediction_tokens", 0)
            rows.append({"turn": turn + 1, "prompt_tokens": d1["usage"]["prompt_tokens"],
                         "completion_tokens": d1["usage"]["completion_tokens"], "drafted": acc + rej,
                         "accepted": acc, "plain_tok_s": t0, "spec_tok_s": t1, "same_text": text0 == text1})
            msgs.append({"role": "assistant", "content": text1})
            msgs.append({"role": "user", "content": "Tool result (ring.c, unchanged):\n" + FILE +
                         "\nQuote the function you changed, then continue."})
    finally:
        for p, _ in servers:
            p.terminate()
            p.wait()
    if a.json:
        print(json.dumps({"model": os.path.basename(a.model), "spec": a.spec, "turns": rows}))
        return
    print("%-5s %7s %6s %8s %9s %10s %10s %8s %5s" % ("turn", "prompt", "gen", "drafted", "accepted",
                                                        "plain t/s", "spec t/s", "speedup", "same"))
    ta = td = 0
    for r in rows:
        ta += r["accepted"]
        td += r["drafted"]
        sp = r["spec_tok_s"] / r["plain_tok_s"] if r["plain_tok_s"] else 0.0
        print("%-5d %7d %6d %8d %9d %10.1f %10.1f %7.2fx %5s" % (r["turn"], r["prompt_tokens"],
              r["completion_tokens"], r["drafted"], r["accepted"], r["plain_tok_s"], r["spec_tok_s"], sp,
              "yes" if r["same_text"] else "NO"))
    print("acceptance over the replay: %d of %d drafted tokens (%.1f%%)" % (ta, td, 100.0 * ta / td if td else 0.0))


if __name__ == "__main__":
    main()
