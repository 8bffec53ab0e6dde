#!/bin/sh
# The SDK client test (ctest server_clients): the pinned npm packages
# (install.sh, a no-op once installed), writes keel's canned
# tool-call streams (test_server_api --write-sse), starts keel serve on a
# free loopback port with a generated model, runs clients.mjs against it,
# and stops the server with SIGTERM (it must exit 0).
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
cleanup() {
    [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
"$KEEL_BUILD/test_server_api" --write-sse "$tmp" || exit 1
"$KEEL_BIN" gen-model --arch qwen2 --embd 64 --seed 7 --out "$tmp/model.gguf" >/dev/null || exit 1

serve_start clients "$tmp/model.gguf" -np 2 -c 4096 -t 1 --api-key sk-test || exit 1

(cd "$dir" && node clients.mjs "$port" sk-test "$tmp")
rc=$?
serve_stop clients "$pid" || rc=1
pid=""
exit $rc
