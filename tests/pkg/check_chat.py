#!/usr/bin/env python3
"""check_chat.py: checks the stdout of examples/python/chat.py (tests/pkg/python_chat_test.sh).

    check_chat.py OUT --max-tokens N [--compact-switch]

Exactly two `response: ` lines of valid JSON, each turn's usage within
--max-tokens; the streamed text of each turn equals its response content (as
chat.py displays it); turn 1 cached nothing; turn 2 reused turn 1's cache
(usage.cached_tokens > 0), or with --compact-switch: turn 1 compacted and
turn 2 did not. The stats line shows the cache, the line after the reset an
empty one. Exit 1 with every failed check on stderr.
"""
import argparse
import json
import sys

CONTROL = {c: f"\\x{c:02x}" for c in list(range(0x20)) + [0x7f] if c not in (0x09, 0x0a)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--max-tokens", type=int, required=True)
    ap.add_argument("--compact-switch", action="store_true")
    a = ap.parse_args()
    with open(a.out, encoding="utf-8") as f:
        text = f.read()
    lines = text.split("\n")
    errors = []

    def check(cond, what):
        if not cond:
            errors.append(what)
        return cond

    resp, streamed, stats = [], [], {}
    cur = None
    for line in lines:
        if line.startswith("--- turn "):
            cur = []
        elif line.startswith("response: "):
            try:
                resp.append(json.loads(line[len("response: "):]))
            except ValueError as e:
                errors.append(f"response {len(resp) + 1} is not JSON: {e}")
                resp.append({})
            streamed.append("\n".join(cur) if cur is not None else None)
            cur = None
        elif line.startswith("stats: ") or line.startswith("stats after reset: "):
            k, _, v = line.partition(": ")
            stats[k] = json.loads(v)
        elif cur is not None:
            cur.append(line)
    if not check(len(resp) == 2, f"{len(resp)} response lines, want 2") or errors:
        return report(errors)
    for t, (r, s) in enumerate(zip(resp, streamed), 1):
        u = r.get("usage", {})
        check(r.get("finish_reason") in ("stop", "length", "tool_calls"),
              f"turn {t}: finish_reason {r.get('finish_reason')!r}")
        check(0 < u.get("completion_tokens", -1) <= a.max_tokens,
              f"turn {t}: completion_tokens {u.get('completion_tokens')} not in (0, {a.max_tokens}]")
        check(u.get("prompt_tokens", 0) > 0, f"turn {t}: prompt_tokens {u.get('prompt_tokens')}")
        if not r.get("tool_calls") and not r.get("reasoning_content"):
            want = (r.get("content") or "").translate(CONTROL)
            check(s is not None and s.rstrip("\n") == want.rstrip("\n"),
                  f"turn {t}: streamed {s!r} differs from the content {want!r}")
    u1, u2 = resp[0]["usage"], resp[1]["usage"]
    m1, m2 = resp[0].get("memory", {}), resp[1].get("memory", {})
    check(u1.get("cached_tokens") == 0, f"turn 1: cached_tokens {u1.get('cached_tokens')}, want 0")
    if a.compact_switch:
        check(m1.get("compactions", 0) > 0, f"turn 1: compactions {m1.get('compactions')}, want > 0")
        check(m2.get("compactions") == 0, f"turn 2: compactions {m2.get('compactions')}, want 0")
        check(m2.get("cells", 0) >= u2.get("prompt_tokens", 0),
              f"turn 2: {m2.get('cells')} cells hold fewer than its {u2.get('prompt_tokens')} prompt tokens")
    else:
        check(u2.get("cached_tokens", 0) > 0, f"turn 2: cached_tokens {u2.get('cached_tokens')}, want > 0")
        check(m2.get("cache") == "reused", f"turn 2: cache {m2.get('cache')!r}")
    before, after = stats.get("stats"), stats.get("stats after reset")
    if check(before is not None and after is not None, "stats lines missing"):
        check(before.get("requests") == 2, f"stats: requests {before.get('requests')}, want 2")
        check(before["slots"][0]["cached_tokens"] > 0, "stats: slot 0 holds no tokens")
        check(after["slots"][0]["cached_tokens"] == 0 and after["slots"][0]["cells"] == 0,
              f"stats after reset: slot 0 {after['slots'][0]}")
    if not errors:
        print(f"ok: turn 1 {u1}, turn 2 {u2}, cache {m2.get('cache')!r}")
    return report(errors)


def report(errors):
    for e in errors:
        print("check_chat.py: " + e, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
