#!/bin/sh
# python_chat_test.sh — ctest python_chat / python_chat_stories: runs
# examples/python/chat.py (a user of the keel package, python/: ctypes over
# libkeel.so, from the source tree: not installed) and checks its output with
# check_chat.py. Exit 77 (skipped) without python3, or without MODEL when one
# is named.
#   python_chat_test.sh SRC_DIR KEEL_BIN LIBKEEL_SO [MODEL]
# Without MODEL: a generated qwen2 model; two runs: (1) the qwen3 built-in
# template (tools rendered): turn 2 reuses turn 1's cache; (2) keydiff
# compaction in turn 1, switched off for turn 2.
# With MODEL (stories260K fixture): one conversation, 512 cells (its
# training context is 128, shorter than the prompt).
# KEEL_PRELOAD (ASan builds): the sanitizer runtimes python3 must preload.
set -eu
src=$1 keel=$2 lib=$3 model=${4:-}
python=${PYTHON:-python3}
if ! command -v "$python" > /dev/null 2>&1; then
    echo "SKIP: $python not found (examples/python/chat.py needs python3)"
    exit 77
fi
if [ -n "$model" ] && [ ! -f "$model" ]; then
    echo "SKIP: $model not found (no fixtures)"
    exit 77
fi
tmp=$(mktemp -d /tmp/keel_python_XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() {
    echo "FAIL: $*" >&2
    exit 1
}
# the repository's build/libkeel.so is chat.py's default: exercise the lookup
unset KEEL_LIBRARY
export PYTHONDONTWRITEBYTECODE=1 # no __pycache__ in the source tree
libarg="--lib $lib"
[ "$lib" = "$src/build/libkeel.so" ] && libarg=""

chat() { # output-name, chat.py arguments...
    name=$1
    shift
    echo "+ chat.py $*"
    # shellcheck disable=SC2086
    if [ -n "${KEEL_PRELOAD:-}" ]; then
        # the interpreter itself is not leak-free: leaks are checked by the C tests
        env LD_PRELOAD="$KEEL_PRELOAD" ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0" \
            "$python" "$src/examples/python/chat.py" $libarg "$@" > "$tmp/$name.out" 2> "$tmp/$name.err" || rc=$?
    else
        "$python" "$src/examples/python/chat.py" $libarg "$@" > "$tmp/$name.out" 2> "$tmp/$name.err" || rc=$?
    fi
    cat "$tmp/$name.out" "$tmp/$name.err"
    [ "${rc:-0}" -eq 0 ] || fail "chat.py exited ${rc:-0}"
}

if [ -n "$model" ]; then
    chat stories -m "$model" --ctx 512 --max-tokens 24 --temperature 0 --threads 2
    "$python" "$src/tests/pkg/check_chat.py" "$tmp/stories.out" --max-tokens 24 || fail "check_chat.py"
    echo PASS
    exit 0
fi

"$keel" gen-model --arch qwen2 --layers 2 --embd 64 --heads 4 --kv-heads 2 --seed 7 --out "$tmp/model.gguf" \
    > "$tmp/gen.log" 2>&1 || { cat "$tmp/gen.log"; fail "keel gen-model"; }
chat reuse -m "$tmp/model.gguf" --chat-template qwen3 --max-tokens 24 --temperature 0 --threads 2
"$python" "$src/tests/pkg/check_chat.py" "$tmp/reuse.out" --max-tokens 24 || fail "check_chat.py (reuse)"
grep -q "made no tool call; turn 2 answers a scripted" "$tmp/reuse.err" || grep -q "tool call 0" "$tmp/reuse.out" \
    || fail "turn 2 has no tool result"
chat compact -m "$tmp/model.gguf" --chat-template qwen3 --ctx 2048 --max-tokens 40 --temperature 0 --threads 2 \
    --kv-compact keydiff --kv-trigger 128 --kv-target 64 --turn2-compact none
"$python" "$src/tests/pkg/check_chat.py" "$tmp/compact.out" --max-tokens 40 --compact-switch \
    || fail "check_chat.py (compaction switched off for turn 2)"
echo PASS
