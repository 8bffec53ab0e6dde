#!/usr/bin/env python3
"""Several servers, one cache (ctest cachetier_scale; docs/cache-tier.md).

A real redis-server, two `keel serve` processes sharing it (--cache-redis)
and haproxy round-robin in front of them, on loopback ports chosen here.
A 20-turn agent conversation (a long system prompt, a growing tool
history) goes through the proxy, so that each turn lands on the other
server than the last: from the second turn on every turn must reuse at
least 90% of its prompt (usage.prompt_tokens_details.cached_tokens), and
with --deterministic every greedy answer must equal a single server's
(no Redis) given the same messages. Runs: a dense model, a sliding-window
model and a hybrid recurrent one, all with q8_0 K/V. On the dense run,
faults mid-conversation: Redis killed (requests go on, reuse falls back to
the local cache, errors counted), restarted (reuse resumes), FLUSHALL,
values overwritten with garbage and a value written by a server with other
K/V types (refused and counted, never loaded).

usage: scale_test.py KEEL_BIN [WORKDIR]; exit 77 when redis-server or
haproxy is missing.
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

KEEL = sys.argv[1]
SKIP = 77


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_port(port, proc, what, timeout=30.0):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise SystemExit(f"scale_test: {what} exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"scale_test: {what} did not listen on {port}")


def http(port, path, body=None, timeout=120):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        raw = r.read()
        return r.status, (json.loads(raw) if path != "/metrics" else raw.decode())


def metrics(port):
    _, text = http(port, "/metrics")
    out = {}
    for line in text.splitlines():
        if line.startswith("keel_remote_cache_"):
            k, v = line.rsplit(" ", 1)
            out[k[len("keel_remote_cache_"):]] = float(v)
    return out


class Redis:
    def __init__(self, tmp):
        self.port = free_port()
        self.tmp = tmp
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--maxmemory", "256mb", "--maxmemory-policy", "allkeys-lru",
                                      "--dir", self.tmp], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(self.port, self.proc, "redis-server")

    def kill(self):
        self.proc.kill()
        self.proc.wait()

    def cli(self, *args):
        return subprocess.run(["redis-cli", "-p", str(self.port), *args], capture_output=True, check=True).stdout


def serve(model, redis_port, extra=(), log=None):
    port = free_port()
    args = [KEEL, "serve", "-m", model, "--host", "127.0.0.1", "--port", str(port), "-np", "1", "-c", "8192", "-t", "1",
            "--ctk", "q8_0", "--ctv", "q8_0", "--deterministic", "--metrics", "--log-disable", *extra]
    if redis_port:
        args += ["--cache-redis", f"redis://127.0.0.1:{redis_port}/0"]
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log or subprocess.DEVNULL)
    wait_port(port, p, "keel serve")
    t0 = time.time()
    while time.time() - t0 < 60:
        try:
            if http(port, "/health")[1].get("status") == "ok":
                return p, port
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.05)
    raise SystemExit("scale_test: keel serve not ready")


def haproxy(tmp, ports):
    port = free_port()
    cfg = os.path.join(tmp, "haproxy.cfg")
    with open(cfg, "w") as f:
        f.write("global\n  maxconn 64\n"
                "defaults\n  mode http\n  timeout connect 5s\n  timeout client 300s\n  timeout server 300s\n"
                f"frontend fe\n  bind 127.0.0.1:{port}\n  default_backend keel\n"
                "backend keel\n  balance roundrobin\n"
                + "".join(f"  server s{i} 127.0.0.1:{p}\n" for i, p in enumerate(ports)))
    p = subprocess.Popen(["haproxy", "-f", cfg, "-db"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(port, p, "haproxy")
    return p, port


SYSTEM = ("You are a coding agent working in a repository. You may call tools: read_file(path) returns a file, "
          "grep(pattern) lists matching lines, run(cmd) runs a shell command. Keep answers short. ") * 20


def turn_messages(n_turns, answers):
    """The conversation after n_turns answers: a system prompt, then per turn a
    user request and (after the first) the previous answer and a tool result."""
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Find where the cache is freed."}]
    for i in range(n_turns):
        msgs.append({"role": "assistant", "content": answers[i]})
        msgs.append({"role": "user", "content": f"Tool result {i}: src/engine/eng_slots.c:{200 + i}: "
                                                 f"base_free(x->blob, x->blob_len); continue."})
    return msgs


def ask(port, msgs):
    st, r = http(port, "/v1/chat/completions", {"messages": msgs, "max_tokens": 10, "temperature": 0})
    assert st == 200, r
    u = r["usage"]
    return r["choices"][0]["message"]["content"] or "", u["prompt_tokens"], u["prompt_tokens_details"]["cached_tokens"]


def total(ports, key):
    return sum(metrics(p).get(key, 0.0) for p in ports)


def wait_writes(ports, n, timeout=20.0):
    """Every state the servers were handed has been written or dropped: n
    in all. A server hands its state to the writer after its answer went
    out, and a writer that found Redis down waits out its retry delay, so
    the count of attempts, not the first new write, says that the last
    turn's state is in Redis (or never will be)."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        if total(ports, "writes_total") + total(ports, "dropped_total") >= n:
            return True
        time.sleep(0.02)
    return False


def run(tmp, name, model, faults):
    print(f"scale_test: {name}", flush=True)
    redis = Redis(tmp)
    redis.start()
    log = open(os.path.join(tmp, f"{name}.log"), "w")
    procs = []
    try:
        a = serve(model, redis.port, log=log)
        b = serve(model, redis.port, log=log)
        ref = serve(model, 0)
        procs += [a[0], b[0], ref[0]]
        hp = haproxy(tmp, [a[1], b[1]])
        procs.append(hp[0])
        ports = [a[1], b[1]]
        answers = []
        low = []
        prompts = []
        other = None
        dropped0 = 0
        for t in range(20):
            msgs = turn_messages(t, answers)
            if faults and t == 6:
                redis.kill()  # mid-conversation: the servers go on from their local caches
            if faults and t == 9:
                redis.start()  # empty: this turn misses, the next ones hit again
            if faults and t == 12:
                redis.cli("FLUSHALL")
            if faults and t == 15:
                for k in redis.cli("--scan", "--pattern", "keel:*:s:*").split():
                    redis.cli("SET", k.decode(), "garbage" * 50)
            if faults and t == 17:
                # a value written by a server with other K/V types, copied over this configuration's keys
                before = set(redis.cli("--scan", "--pattern", "keel:*:s:*").split())
                other = serve(model, redis.port, ["--ctk", "f16", "--ctv", "f16"])
                procs.append(other[0])
                ask(other[1], msgs)
                assert wait_writes([other[1]], 1), "the f16 server's state was not written"
                assert metrics(other[1]).get("writes_total", 0) == 1, "the f16 server's state was not written"
                mine = {k.split(b":")[1] for k in before}
                foreign = [k for k in redis.cli("--scan", "--pattern", "keel:*:s:*").split() if k.split(b":")[1] not in mine]
                assert before and foreign, "two configurations, two key spaces"
                for k in before:
                    redis.cli("COPY", foreign[0].decode(), k.decode(), "REPLACE")
            text, n_prompt, cached = ask(hp[1], msgs)
            share = cached / n_prompt
            ref_text, _, _ = ask(ref[1], msgs)
            assert text == ref_text, f"turn {t + 1}: {text!r} != single server's {ref_text!r}"
            answers.append(text)
            print(f"  turn {t + 1:2d}: prompt {n_prompt} cached {cached} ({100 * share:.0f}%)", flush=True)
            down = faults and (6 <= t <= 10 or t in (12, 13, 15, 16, 17, 18))
            if t >= 1 and share < 0.9:
                low.append(t + 1)
                assert down, f"turn {t + 1} reused {100 * share:.1f}% of its prompt (< 90%)"
            # the other server answered the last turn; this one's slot holds
            # the turn before (its prompt and a 10-token answer): reusing
            # more than that means the last turn's state came through Redis
            if t >= 1 and not down:
                assert cached > prompts[-2] + 16 if t >= 2 else cached > 0, \
                    f"turn {t + 1}: cached {cached}, no more than this server's own cache could give"
            prompts.append(n_prompt)
            assert wait_writes(ports, t + 1), f"turn {t + 1}: its state was neither written nor dropped"
            dropped = total(ports, "dropped_total")
            if not (faults and 6 <= t <= 8):
                assert dropped == dropped0, f"turn {t + 1}: its state was dropped"
            dropped0 = dropped
        m = {k: total(ports, k) for k in ("hits_total", "misses_total", "errors_total", "rejected_total",
                                           "bytes_in_total", "bytes_out_total", "hit_tokens_total")}
        print(f"  counters (both servers): {json.dumps(m)}; turns under 90%: {low}", flush=True)
        assert m["hits_total"] >= (9 if faults else 17), m
        assert m["bytes_in_total"] > 0 and m["bytes_out_total"] > 0
        if faults:
            assert m["errors_total"] >= 1, "Redis down was counted"
            assert m["rejected_total"] >= 2, "garbage and the foreign value were refused and counted"
        for p in ports:
            assert http(p, "/health")[1]["status"] == "ok"
        with open(os.path.join(tmp, f"{name}.log")) as f:
            lines = [ln for ln in f if "remote cache:" in ln]
        if faults:
            assert any("retrying" in ln for ln in lines), "the log says Redis is down"
            assert any("reachable again" in ln for ln in lines), "and that it is back"
            downs = sum("retrying" in ln for ln in lines)
            assert downs <= 4, f"said once per outage and server, not per request ({downs} lines)"
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        log.close()
        if redis.proc and redis.proc.poll() is None:
            redis.kill()


def main():
    for tool in ("redis-server", "redis-cli", "haproxy"):
        if not shutil.which(tool):
            print(f"scale_test: SKIPPED: {tool} is missing (scripts/install-deps.sh installs redis-server, haproxy)")
            return SKIP
    tmp = tempfile.mkdtemp(prefix="keel_scale_")
    try:
        models = {
            "dense": ["--arch", "llama", "--embd", "128", "--heads", "4", "--kv-heads", "2", "--layers", "2"],
            "sliding": ["--arch", "gemma2", "--embd", "128", "--heads", "4", "--kv-heads", "2", "--layers", "4",
                        "--swa", "64"],
            "hybrid": ["--arch", "qwen35", "--embd", "128", "--heads", "4", "--kv-heads", "2", "--layers", "4"],
        }
        for name, args in models.items():
            path = os.path.join(tmp, name + ".gguf")
            subprocess.run([KEEL, "gen-model", *args, "--seed", "5", "--out", path], check=True,
                           stdout=subprocess.DEVNULL)
            run(tmp, name, path, faults=name == "dense")
        print("scale_test: ok")
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
