#!/bin/sh
# The SDK client test (ctest server_clients): the pinned npm packages
# (install.sh, a no-op once installed), writes keel's canned
# tool-call streams (test_server_api --write-sse), starts keel serve on a
# free loopback port with a generated model, runs clients.mjs against it,
# and a second one with the built-in qwen3 template for the constrained-
# output checks, and stops both with SIGTERM (each must exit 0).
# Exit 77 (ctest: skipped) only when node/npm are missing or npm cannot
# reach the registry.
set -u
here=$(cd "$(dirname "$0")" && pwd)
: "${KEEL_BIN:?}" "${KEEL_BUILD:?}"
sh "$here/install.sh" || exit $?
. "$here/lib.sh"
dir="$KEEL_BUILD/server-clients"
cp "$here/clients.mjs" "$dir/" || exit 1

tmp=$(mktemp -d /tmp/keel_clients_XXXXXX) || exit 1
pid=""
pid2=""
cleanup() {
    [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null
    [ -n "$pid2" ] && kill -9 "$pid2" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
"$KEEL_BUILD/test_server_api" --write-sse "$tmp" || exit 1
"$KEEL_BIN" gen-model --arch qwen2 --embd 64 --seed 7 --out "$tmp/model.gguf" >/dev/null || exit 1

# the constrained-output checks need a template with a tool-call format:
# a second server with the built-in qwen3 template (hermes tool calls)
serve_start constrained "$tmp/model.gguf" -np 1 -c 4096 -t 1 --api-key sk-test --chat-template qwen3 || exit 1
port2=$port
pid2=$pid
pid=""
serve_start clients "$tmp/model.gguf" -np 2 -c 4096 -t 1 --api-key sk-test || exit 1

(cd "$dir" && node clients.mjs "$port" sk-test "$tmp" "$port2")
rc=$?
serve_stop clients "$pid" || rc=1
pid=""
serve_stop constrained "$pid2" || rc=1
pid2=""
exit $rc
