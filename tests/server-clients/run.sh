#!/bin/sh
# The SDK client test (ctest server_clients): installs the pinned npm
# packages with `npm ci` into $KEEL_BUILD/server-clients (kept between runs:
# reinstalled only when package-lock.json changes), writes keel's canned
# tool-call streams (test_server_api --write-sse), starts keel serve on a
# free loopback port with a generated model, runs clients.mjs against it,
# and stops the server with SIGTERM (it must exit 0).
# Exit 77 (ctest: skipped) only when node/npm are missing or npm cannot
# reach the registry.
set -u
here=$(cd "$(dirname "$0")" && pwd)
: "${KEEL_BIN:?}" "${KEEL_BUILD:?}"
skip() { echo "server-clients: SKIPPED: $*"; exit 77; }
command -v node >/dev/null 2>&1 || skip "node is not installed (scripts/install-deps.sh installs nodejs npm)"
command -v npm >/dev/null 2>&1 || skip "npm is not installed (scripts/install-deps.sh installs nodejs npm)"

dir="$KEEL_BUILD/server-clients"
mkdir -p "$dir" || exit 1
stamp="$dir/.lock-installed"
if ! [ -d "$dir/node_modules" ] || ! cmp -s "$here/package-lock.json" "$stamp"; then
    cp "$here/package.json" "$here/package-lock.json" "$dir/" || exit 1
    if ! (cd "$dir" && timeout 600 npm ci --no-audit --no-fund --loglevel=error >npm.log 2>&1); then
        if grep -Eqi 'ENOTFOUND|ECONNREFUSED|ETIMEDOUT|EAI_AGAIN|network|getaddrinfo|ECONNRESET' "$dir/npm.log"; then
            cat "$dir/npm.log"
            skip "npm cannot reach the registry"
        fi
        cat "$dir/npm.log"
        echo "server-clients: npm ci failed"
        exit 1
    fi
    cp "$here/package-lock.json" "$stamp"
fi
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

"$KEEL_BIN" serve -m "$tmp/model.gguf" --host 127.0.0.1 --port 0 -np 2 -c 4096 -t 1 --api-key sk-test \
    --log-disable >"$tmp/out" 2>"$tmp/err" &
pid=$!
port=""
i=0
while [ $i -lt 600 ]; do
    port=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$tmp/out")
    [ -n "$port" ] && grep -q "keel serve: ready" "$tmp/out" && break
    kill -0 "$pid" 2>/dev/null || { cat "$tmp/out" "$tmp/err"; echo "server-clients: keel serve exited"; exit 1; }
    sleep 0.1
    i=$((i + 1))
done
[ -n "$port" ] || { cat "$tmp/out" "$tmp/err"; echo "server-clients: keel serve did not start"; exit 1; }

(cd "$dir" && node clients.mjs "$port" sk-test "$tmp")
rc=$?
kill -TERM "$pid"
wait "$pid"
src=$?
pid=""
cat "$tmp/err"
if [ $src -ne 0 ]; then
    echo "server-clients: keel serve exited $src after SIGTERM"
    exit 1
fi
exit $rc
