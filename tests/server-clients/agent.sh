#!/bin/sh
# The agent reuse test (ctest server_agent): agent.mjs's six turns through
# each SDK, and a 12-turn trace, on a generated sliding-window model (gemma2) and a generated
# hybrid one (qwen35, Gated DeltaNet + attention), q8_0 K/V, --cache-ram
# 256, one fresh agent server per model and API beside a reference server
# whose slot is erased before each request. Needs the npm packages
# (install.sh, the ctest fixture).
set -u
here=$(cd "$(dirname "$0")" && pwd)
: "${KEEL_BIN:?}" "${KEEL_BUILD:?}"
sh "$here/install.sh" || exit $?
. "$here/lib.sh"
dir="$KEEL_BUILD/server-clients"
cp "$here/agent.mjs" "$dir/" || exit 1

tmp=$(mktemp -d /tmp/keel_agent_XXXXXX) || exit 1
apid=""
rpid=""
cleanup() {
    [ -n "$apid" ] && kill -9 "$apid" 2>/dev/null
    [ -n "$rpid" ] && kill -9 "$rpid" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
"$KEEL_BIN" gen-model --arch gemma2 --embd 128 --layers 2 --swa 32 --seed 5 --out "$tmp/gemma2.gguf" >/dev/null || exit 1
"$KEEL_BIN" gen-model --arch qwen35 --embd 128 --layers 4 --seed 5 --out "$tmp/qwen35.gguf" >/dev/null || exit 1

common="-np 1 -c 40960 -t 1 -ctk q8_0 -ctv q8_0 --deterministic --chat-template qwen3 --api-key sk-test"
# six turns per SDK; then a 12-turn trace through the OpenAI SDK (an
# ~1.4k-token system prompt and tools, ~200 tokens of file text added per
# turn, the reminder rewritten on turns 4, 8 and 11). The same trace at
# ~30k tokens is the benchmark of docs/server.md (too slow for a test on a
# 2-core machine with a reference server recomputing every turn). Under
# ASan (KEEL_ASAN) the trace is left out: the six turns cover the same code.
trace="--turns 12 --reminders 4,8,11 --sys-repeat 10 --grow 4"
runs="openai anthropic trace"
[ -n "${KEEL_ASAN:-}" ] && runs="openai anthropic"
rc=0
for arch in gemma2 qwen35; do
    for run in $runs; do
        api=$run
        extra=""
        [ "$run" = trace ] && api=openai && extra=$trace
        # shellcheck disable=SC2086
        serve_start agent "$tmp/$arch.gguf" $common --cache-ram 256 || exit 1
        aport=$port
        apid=$pid
        # shellcheck disable=SC2086
        serve_start ref "$tmp/$arch.gguf" $common --cache-ram 0 || exit 1
        rport=$port
        rpid=$pid
        # shellcheck disable=SC2086
        (cd "$dir" && node agent.mjs "$api" "$aport" "$rport" sk-test "$arch" $extra) || rc=1
        serve_stop agent "$apid" || rc=1
        apid=""
        serve_stop ref "$rpid" || rc=1
        rpid=""
        [ $rc -eq 0 ] || exit $rc
    done
done
exit $rc
