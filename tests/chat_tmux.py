#!/usr/bin/env python3
"""chat_tmux.py: ctest chat_tmux: `keel chat` on a terminal, driven through tmux.

    chat_tmux.py KEEL_BIN [MODEL]

Starts `keel chat` in a detached tmux session (a real pseudo-terminal, so
libedit, the SIGINT path and the terminal output are the ones a person
gets), types with send-keys and reads the screen with capture-pane:
  1. a long answer (-n 16000 --ignore-eos) is stopped with Ctrl-C: "[stopped]",
     its turn line, and the prompt comes back;
  2. the conversation continues: a message continued with a trailing
     backslash is one message, and its turn reuses the cache (cached > 0);
  3. two lines sent together (a paste) are one message;
  4. /save F, then Ctrl-C at the prompt (a hint), Ctrl-C again leaves (exit 0);
     F.json holds the three user messages as typed;
  5. a NEW process: /load F, a message: its turn line shows cached tokens > 0
     and /kv the conversation's cells; Ctrl-D leaves (exit 0).
MODEL: the stories260K fixture when given and present, else a generated
qwen2 model. Exit 77 (skipped) without tmux.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time


def fail(msg, screen=None):
    print("FAIL: " + msg, file=sys.stderr)
    if screen is not None:
        print("---- screen ----\n" + screen + "\n----------------", file=sys.stderr)
    sys.exit(1)


class Pane:
    def __init__(self, sock, name, cmd):
        self.sock, self.name = sock, name
        self.tmux("new-session", "-d", "-s", name, "-x", "160", "-y", "50", cmd)

    def tmux(self, *args):
        return subprocess.run(["tmux", "-S", self.sock] + list(args), check=True, capture_output=True,
                              text=True).stdout

    def keys(self, *keys, literal=False):
        self.tmux("send-keys", "-t", self.name, *(["-l"] if literal else []), *keys)

    def screen(self):
        # the whole history, wrapped lines joined
        return self.tmux("capture-pane", "-t", self.name, "-p", "-J", "-S", "-10000")

    def wait(self, pred, what, timeout=120):
        end = time.time() + timeout
        while time.time() < end:
            s = self.screen()
            if pred(s):
                return s
            time.sleep(0.1)
        fail("timed out waiting for " + what, self.screen())


TURN = re.compile(r"\[prompt (\d+) tokens, (\d+) cached; (\d+) generated, [0-9.]+ tok/s; (\w+)\]")


def turns(s):
    return [(int(a), int(b), int(c), d) for a, b, c, d in TURN.findall(s)]


def at_prompt(s):
    lines = [l for l in s.rstrip("\n").split("\n")]
    while lines and lines[-1].strip() == "":
        lines.pop()
    return bool(lines) and lines[-1].rstrip() == ">"


def main():
    if len(sys.argv) < 2:
        fail("usage: chat_tmux.py KEEL_BIN [MODEL]")
    keel = os.path.abspath(sys.argv[1])
    model = sys.argv[2] if len(sys.argv) > 2 else ""
    if not shutil.which("tmux"):
        print("SKIP: tmux not found (Debian package tmux; scripts/install-deps.sh installs it)")
        return 77
    tmp = tempfile.mkdtemp(prefix="keel_chat_tmux_")
    sock = os.path.join(tmp, "tmux.sock")
    try:
        if not model or not os.path.isfile(model):
            if model:
                print("note: %s not found (no fixtures): a generated model" % model)
            model = os.path.join(tmp, "model.gguf")
            subprocess.run([keel, "gen-model", "--arch", "qwen2", "--layers", "1", "--embd", "64", "--heads", "4",
                            "--kv-heads", "2", "--seed", "7", "--out", model], check=True, capture_output=True)
        save = os.path.join(tmp, "conv")
        flags = "-m '%s' --temp 0 -c 20000 -t 1" % model
        env = "TERM=xterm-256color "
        # 1..4: long answers, stopped with Ctrl-C
        a = Pane(sock, "a", env + "'%s' chat %s -n 16000 --ignore-eos; echo EXIT=$?; sleep 600" % (keel, flags))
        a.wait(lambda s: "/help for commands" in s and at_prompt(s), "the banner and the prompt")

        def stopped_turn(n_before, typed, marker):
            typed()
            # the answer is under way (text after the message), then Ctrl-C
            def answering(s):
                i = s.rfind(marker)
                return i >= 0 and s[i + len(marker):].strip() != "" and len(turns(s)) == n_before
            a.wait(answering, "an answer to stop", 60)
            time.sleep(0.3)
            a.keys("C-c")
            s = a.wait(lambda s: len(turns(s)) > n_before and at_prompt(s), "the turn line and the prompt")
            return s

        s = stopped_turn(0, lambda: a.keys("Once upon a time", "Enter"), "> Once upon a time")
        t = turns(s)
        if t[0][3] != "stopped" or "[stopped]" not in s:
            fail("the first answer was not stopped", s)
        if t[0][2] < 1:
            fail("nothing was generated before the stop", s)
        # 2: a message continued with a backslash; the cache is reused
        def continued():
            a.keys("line one\\", literal=True)
            a.keys("Enter")
            a.wait(lambda s: s.rstrip().endswith("..."), "the continuation prompt", 30)
            a.keys("line two", "Enter")
        s = stopped_turn(1, continued, "... line two")
        t = turns(s)
        if len(t) != 2:
            fail("a continued message made %d turns" % (len(t) - 1), s)
        if t[1][1] <= 0:
            fail("the second turn reused no cache: %s" % (t[1],), s)
        # 3: two lines at once (a paste) are one message
        s = stopped_turn(2, lambda: a.keys("pasted a", "Enter", "pasted b", "Enter"), "... pasted b")
        if len(turns(s)) != 3:
            fail("a paste of two lines made %d turns" % (len(turns(s)) - 2), s)
        # 4: /save, Ctrl-C twice at the prompt leaves
        a.keys("/save " + save, "Enter")
        a.wait(lambda s: "saved 6 messages" in s and at_prompt(s), "/save")
        a.keys("C-c")
        a.wait(lambda s: "Ctrl-C again" in s, "the hint after one Ctrl-C at the prompt")
        a.keys("C-c")
        s = a.wait(lambda s: "EXIT=" in s, "the chat to leave after a second Ctrl-C")
        if "EXIT=0" not in s:
            fail("keel chat exited with an error", s)
        with open(save + ".json") as f:
            conv = json.load(f)
        users = [m["content"] for m in conv["messages"] if m["role"] == "user"]
        if users != ["Once upon a time", "line one\nline two", "pasted a\npasted b"]:
            fail("the saved conversation's user messages: %r" % (users,))
        if any(m["role"] == "assistant" and not m.get("content") for m in conv["messages"]):
            fail("a stopped answer was not kept: %r" % (conv["messages"],))

        # 5: a new process continues from the saved session, the cache reused
        b = Pane(sock, "b", env + "'%s' chat %s -n 8 --ignore-eos; echo EXIT=$?; sleep 600" % (keel, flags))
        b.wait(lambda s: "/help for commands" in s and at_prompt(s), "the second process's prompt")
        b.keys("/load " + save, "Enter")
        s = b.wait(lambda s: "loaded 6 messages" in s and at_prompt(s), "/load")
        m = re.search(r"loaded 6 messages from \S+, (\d+) cached tokens", s)
        if not m or int(m.group(1)) <= 0:
            fail("/load restored no cached tokens", s)
        restored = int(m.group(1))
        b.keys("and then?", "Enter")
        s = b.wait(lambda s: len(turns(s)) == 1 and at_prompt(s), "the turn after /load")
        t = turns(s)[0]
        if t[1] <= 0 or t[1] > restored:
            fail("the turn after /load reused %d cached tokens (restored %d)" % (t[1], restored), s)
        if t[2] != 8 or t[3] != "length":
            fail("the turn after /load: %r" % (t,), s)
        b.keys("/kv", "Enter")
        s = b.wait(lambda s: "last turn:" in s and at_prompt(s), "/kv")
        m = re.search(r"conversation: (\d+) tokens cached in (\d+) cells", s)
        if not m or int(m.group(1)) < t[0] or int(m.group(2)) <= 0:
            fail("/kv does not show the conversation's cache", s)
        if "last turn: prompt %d tokens, %d cached" % (t[0], t[1]) not in s:
            fail("/kv does not show the last turn", s)
        b.keys("C-d")
        s = b.wait(lambda s: "EXIT=" in s, "Ctrl-D to leave")
        if "EXIT=0" not in s:
            fail("keel chat exited with an error after Ctrl-D", s)
        print("ok: stop, continue (cached %d), paste, save, load (restored %d, reused %d)" % (turns(a.screen())[1][1],
                                                                                         restored, t[1]))
        return 0
    finally:
        subprocess.run(["tmux", "-S", sock, "kill-server"], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
