#!/usr/bin/env python3
"""Time to first token of a resumed conversation on another server: from the
shared cache tier (Redis) against recomputation (docs/cache-tier.md).

Server A reads a long conversation (--tokens, 16384 by default) and files
its state in Redis. The next turn then goes to server B, which shares A's
Redis, and to server C, which has no Redis. The same run measures:
- B's time to first token (the state read from Redis, then the new turn);
- C's time to first token (the whole prompt prefilled);
- the bytes moved per resumed token.

usage: cache-tier-bench.py [--keel build/keel] [-m MODEL] [--tokens N] [-t THREADS] [--json]
Without -m, a generated ~124M llama (12 layers, 768 wide, q8_0) is written
to a temporary file. Needs redis-server on PATH.
"""
import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_ready(port, proc, timeout=600):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            sys.exit(f"cache-tier-bench: a process exited ({proc.returncode})")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                if json.load(r).get("status") == "ok":
                    return
        except OSError:
            pass
        time.sleep(0.1)
    sys.exit("cache-tier-bench: not ready")


def post(port, body, stream=False):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.time()
    with urllib.request.urlopen(req, timeout=3600) as r:
        if not stream:
            return json.load(r), time.time() - t0
        ttft = None
        usage = None
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: {"):
                continue
            j = json.loads(line[6:])
            d = j.get("choices") and j["choices"][0].get("delta") or {}
            if ttft is None and d.get("content"):
                ttft = time.time() - t0
            if j.get("usage"):
                usage = j["usage"]
        return usage, ttft if ttft is not None else time.time() - t0


def metrics(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as r:
        out = {}
        for line in r.read().decode().splitlines():
            if line.startswith("keel_remote_cache_"):
                k, v = line.rsplit(" ", 1)
                out[k[len("keel_remote_cache_"):]] = float(v)
        return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--keel", default="build/keel")
    ap.add_argument("-m", "--model")
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if not shutil.which("redis-server"):
        sys.exit("cache-tier-bench: redis-server is missing (scripts/install-deps.sh installs it)")
    tmp = tempfile.mkdtemp(prefix="keel_tierbench_")
    procs = []
    try:
        model = a.model
        if not model:
            model = os.path.join(tmp, "m124_q8_0.gguf")
            subprocess.run([a.keel, "gen-model", "--arch", "llama", "--layers", "12", "--embd", "768", "--heads", "12",
                            "--kv-heads", "4", "--ff", "2048", "--vocab", "32000", "--dtype", "q8_0", "--out", model],
                           check=True, stdout=subprocess.DEVNULL)
        rport = free_port()
        procs.append(subprocess.Popen(["redis-server", "--port", str(rport), "--bind", "127.0.0.1", "--save", "",
                                       "--appendonly", "no", "--dir", tmp], stdout=subprocess.DEVNULL))
        ports = []
        for use_redis in (True, True, False):
            p = free_port()
            args = [a.keel, "serve", "-m", model, "--host", "127.0.0.1", "--port", str(p), "-np", "1",
                    "-c", str(a.tokens + 1024), "-t", str(a.threads), "--ctk", "q8_0", "--ctv", "q8_0", "--metrics",
                    "--log-disable", "--cache-ram", "0"]
            if use_redis:
                args += ["--cache-redis", f"redis://127.0.0.1:{rport}", "--cache-redis-max-mib", "4096",
                         "--cache-redis-timeout", "30000"]
            procs.append(subprocess.Popen(args, stdout=subprocess.DEVNULL))
            ports.append(p)
        for p, proc in zip(ports, procs[1:]):
            wait_ready(p, proc)
        A, B, C = ports
        # a conversation of about --tokens tokens: count with /tokenize
        para = ("The function reads the configuration file, checks every key against the schema, "
                "and returns the parsed settings or an error naming the first bad key. ")
        with urllib.request.urlopen(urllib.request.Request(
                f"http://127.0.0.1:{A}/tokenize", data=json.dumps({"content": para}).encode())) as r:
            per = len(json.load(r)["tokens"])
        text = para * max(1, (a.tokens - 64) // per)
        msgs = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": text}]
        w0 = metrics(A).get("writes_total", 0)
        r1, t_first = post(A, {"messages": msgs, "max_tokens": 8, "temperature": 0})
        n1 = r1["usage"]["prompt_tokens"]
        t0 = time.time()
        while metrics(A).get("writes_total", 0) <= w0 and time.time() - t0 < 600:
            time.sleep(0.05)
        t_write = time.time() - t0
        msgs2 = msgs + [{"role": "assistant", "content": r1["choices"][0]["message"]["content"]},
                        {"role": "user", "content": "Now list the keys it checks."}]
        body = {"messages": msgs2, "max_tokens": 8, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}}
        ub, ttft_redis = post(B, body, stream=True)
        uc, ttft_recompute = post(C, body, stream=True)
        mb = metrics(B)
        res = {
            "model": os.path.basename(model), "threads": a.threads, "prompt_tokens": ub["prompt_tokens"],
            "first_turn_prompt_tokens": n1, "first_turn_s": round(t_first, 3), "write_wait_s": round(t_write, 3),
            "ttft_from_redis_s": round(ttft_redis, 3), "cached_tokens_redis": ub["prompt_tokens_details"]["cached_tokens"],
            "ttft_recompute_s": round(ttft_recompute, 3),
            "cached_tokens_recompute": uc["prompt_tokens_details"]["cached_tokens"],
            "speedup": round(ttft_recompute / ttft_redis, 2),
            "bytes_in": int(mb.get("bytes_in_total", 0)),
            "bytes_per_token": round(mb.get("bytes_in_total", 0) / max(1, mb.get("hit_tokens_total", 1)), 1),
        }
        if a.json:
            print(json.dumps(res))
        else:
            print(f"| resumed turn on another server | TTFT | cached tokens |")
            print(f"|---|---:|---:|")
            print(f"| from Redis | {res['ttft_from_redis_s']:.3f} s | {res['cached_tokens_redis']} of {res['prompt_tokens']} |")
            print(f"| recomputed | {res['ttft_recompute_s']:.3f} s | {res['cached_tokens_recompute']} |")
            print(f"speed-up {res['speedup']}x; {res['bytes_in']} bytes read from Redis, "
                  f"{res['bytes_per_token']} bytes per resumed token; first turn {res['first_turn_s']} s "
                  f"({n1} tokens), its state written {res['write_wait_s']} s after the answer")
        return 0
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
