#!/bin/sh
# chat_pipe.sh — ctest chat_pipe: `keel chat` driven through a pipe (stdin
# not a terminal), as scripts drive it.
#   chat_pipe.sh KEEL_BIN [MODEL]
# MODEL: the stories260K fixture when given and present, else a generated
# qwen2 model. Checks:
#   1. printf 'hi\nagain\n' | keel chat: exit 0, two turn lines on stderr,
#      the second reusing the first's cache; stdout is the two answers, each
#      followed by a newline: the first is exactly the answer of a chat of
#      "hi" alone (greedy), the second follows it;
#   2. reasoning (a template whose generation prompt opens <think>): every
#      line of the answer starts "thinking: ";
#   3. --tools with --tool-choice required: the call is printed with its
#      arguments ("tool call: get_weather {...}"), the next line is taken as
#      its result (a tool message in /save's conversation), commands work at
#      the result prompt;
#   4. errors lose nothing: an unknown command, /load of a missing file and
#      /compact with a bad policy are reported and the conversation goes on;
#      a --tools file that is not a JSON array is refused at start (exit 1).
set -eu
keel=$1 model=${2:-}
tmp=$(mktemp -d /tmp/keel_chat_pipe_XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() {
    echo "FAIL: $*" >&2
    for f in "$tmp"/*.out "$tmp"/*.err; do [ -f "$f" ] && { echo "---- $f"; cat "$f"; } >&2; done
    exit 1
}
if [ -z "$model" ] || [ ! -f "$model" ]; then
    [ -n "$model" ] && echo "note: $model not found (no fixtures): a generated model"
    model=$tmp/model.gguf
    "$keel" gen-model --arch qwen2 --layers 1 --embd 64 --heads 4 --kv-heads 2 --seed 7 --out "$model" \
        > "$tmp/gen.log" 2>&1 || { cat "$tmp/gen.log"; fail "keel gen-model"; }
fi
flags="-m $model --temp 0 -n 12 --ignore-eos -c 2048 -t 1"

# 1. two messages, two answers
printf 'hi\nagain\n' | "$keel" chat $flags > "$tmp/two.out" 2> "$tmp/two.err" || fail "chat exited non-zero"
printf 'hi\n' | "$keel" chat $flags > "$tmp/one.out" 2> "$tmp/one.err" || fail "chat (one message) exited non-zero"
n=$(grep -c '^\[prompt [0-9]* tokens, [0-9]* cached; 12 generated' "$tmp/two.err" || true)
[ "$n" = 2 ] || fail "expected two turn lines, got $n"
c1=$(sed -n 's/^\[prompt [0-9]* tokens, \([0-9]*\) cached.*/\1/p' "$tmp/two.err" | sed -n 1p)
c2=$(sed -n 's/^\[prompt [0-9]* tokens, \([0-9]*\) cached.*/\1/p' "$tmp/two.err" | sed -n 2p)
[ "$c1" = 0 ] || fail "the first turn claims $c1 cached tokens"
[ "$c2" -gt 0 ] || fail "the second turn reused no cache"
one=$(wc -c < "$tmp/one.out")
[ "$one" -gt 1 ] || fail "the first answer is empty"
head -c "$one" "$tmp/two.out" | cmp -s - "$tmp/one.out" || fail "the first answer differs from a chat of it alone"
two=$(wc -c < "$tmp/two.out")
[ "$two" -gt $((one + 1)) ] || fail "no second answer"
[ "$(tail -c 1 "$tmp/two.out" | od -An -c | tr -d ' ')" = '\n' ] || fail "the second answer does not end with a newline"

# 2. reasoning, prefixed on every line
printf '{%% for m in messages %%}<|{{ m.role }}|>{{ m.content }}\n{%% endfor %%}{%% if add_generation_prompt %%}<|assistant|><think>\n{%% endif %%}' \
    > "$tmp/think.jinja"
printf 'hi\n' | "$keel" chat $flags --chat-template "$tmp/think.jinja" > "$tmp/think.out" 2> "$tmp/think.err" ||
    fail "chat with a thinking template exited non-zero"
[ -s "$tmp/think.out" ] || fail "no reasoning printed"
if grep -v '^thinking: ' "$tmp/think.out" | grep -q .; then fail "a reasoning line without 'thinking: '"; fi

# 3. a forced tool call, its result typed as the next line
cat > "$tmp/tools.json" << 'EOF'
[{"type": "function", "function": {"name": "get_weather", "description": "weather of a city",
  "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                 "required": ["city"], "additionalProperties": false}}}]
EOF
printf 'weather in Paris?\n/kv\nsunny, 21 C\n/save %s\n' "$tmp/tc" |
    "$keel" chat -m "$model" --temp 0 -n 200 -c 2048 -t 1 --chat-template qwen3 --tools "$tmp/tools.json" \
        --tool-choice required > "$tmp/tool.out" 2> "$tmp/tool.err" || fail "chat with tools exited non-zero"
grep -q '^tool call: get_weather {' "$tmp/tool.out" || fail "no tool call printed"
grep -q '^kv: ' "$tmp/tool.err" || fail "/kv at the tool result prompt was not run"
python3 - "$tmp/tc.json" << 'EOF' || fail "the saved conversation has no tool result after the call"
import json, sys
m = json.load(open(sys.argv[1]))["messages"]
assert [x["role"] for x in m[:3]] == ["user", "assistant", "tool"], [x["role"] for x in m]
assert m[1]["tool_calls"][0]["function"]["name"] == "get_weather"
assert m[2]["content"] == "sunny, 21 C" and m[2]["tool_call_id"] == m[1]["tool_calls"][0]["id"]
EOF

# 4. errors that lose nothing
printf 'hi\n/nope\n/load %s\n/compact sideways\n/compact keydiff 10 20\n/compact window 32 16\nagain\n/kv\n/clear\nhello again, tell me a longer story please\n/kv\n' "$tmp/missing" |
    "$keel" chat $flags > "$tmp/err.out" 2> "$tmp/err.err" || fail "chat exited non-zero after user errors"
grep -q 'unknown command /nope' "$tmp/err.err" || fail "no message for an unknown command"
grep -q "/load $tmp/missing.json: No such file" "$tmp/err.err" || fail "no message for a missing /load file"
grep -q '/compact: give P' "$tmp/err.err" || fail "no message for a bad /compact policy"
grep -q 'trigger 10 must be greater than target 20 (compaction unchanged)' "$tmp/err.err" ||
    fail "no message for a bad /compact trigger"
grep -q 'compaction: window from the next turn (trigger 32 cells, target 16)' "$tmp/err.err" ||
    fail "/compact window 32 16 was not taken"
kv=$(grep '^conversation: ' "$tmp/err.err" | sed -n 1p) || fail "no /kv output"
held=$(echo "$kv" | sed -n 's/^conversation: \([0-9]*\) tokens cached in \([0-9]*\) cells, \([0-9]*\) compactions.*/\1 \2 \3/p')
set -- $held
[ $# = 3 ] && [ "$3" -gt 0 ] && [ "$2" -le 32 ] && [ "$1" -gt 32 ] ||
    fail "/compact window 32 16 did not compact the next turn: $kv"
# /clear empties the cache and keeps the /compact setting
grep -q 'the conversation and the cache are cleared' "$tmp/err.err" || fail "/clear said nothing"
c3=$(sed -n 's/^\[prompt [0-9]* tokens, \([0-9]*\) cached.*/\1/p' "$tmp/err.err" | sed -n 3p)
[ "$c3" = 0 ] || fail "the turn after /clear reused $c3 cached tokens"
kv=$(grep '^conversation: ' "$tmp/err.err" | sed -n 2p)
held=$(echo "$kv" | sed -n 's/^conversation: \([0-9]*\) tokens cached in \([0-9]*\) cells, .*(compaction: window)$/\1 \2/p')
set -- $held
[ $# = 2 ] && [ "$2" -le 32 ] && [ "$1" -gt 32 ] || fail "/clear lost the compaction setting: $kv"
n=$(grep -c '^\[prompt' "$tmp/err.err" || true)
[ "$n" = 3 ] || fail "expected three turns around the errors, got $n"
c2=$(sed -n 's/^\[prompt [0-9]* tokens, \([0-9]*\) cached.*/\1/p' "$tmp/err.err" | sed -n 2p)
[ "$c2" -gt 0 ] || fail "the turn after the errors reused no cache"
echo '{"not": "an array"}' > "$tmp/bad.json"
if printf 'hi\n' | "$keel" chat $flags --tools "$tmp/bad.json" > "$tmp/bad.out" 2> "$tmp/bad.err"; then
    fail "a --tools file that is not an array was accepted"
fi
grep -q 'not a JSON array' "$tmp/bad.err" || fail "no message for a bad --tools file"
echo "ok: two answers (second cached $c2), reasoning, a tool call and its result, errors"
