#!/bin/sh
# The chat page test (ctest server_page): keel serve on a generated model
# with an API key and --metrics, page.mjs drives it in headless Chromium;
# screenshots land in $KEEL_BUILD/page-test/. Exit 77 (skipped) when node,
# npm or chromium is missing, or npm cannot reach the registry.
set -u
here=$(cd "$(dirname "$0")" && pwd)
: "${KEEL_BIN:?}" "${KEEL_BUILD:?}"
chromium=${KEEL_CHROMIUM:-/usr/bin/chromium}
[ -x "$chromium" ] || { echo "server_page: SKIPPED: $chromium is missing (scripts/install-deps.sh installs chromium)"; exit 77; }
sh "$here/install.sh" || exit $?
. "$here/lib.sh"
dir="$KEEL_BUILD/server-clients"
cp "$here/page.mjs" "$dir/" || exit 1
shots="$KEEL_BUILD/page-test"
mkdir -p "$shots" || exit 1
tmp=$(mktemp -d /tmp/keel_page_XXXXXX) || exit 1
pid=""
cleanup() {
    [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
"$KEEL_BIN" gen-model --arch qwen2 --embd 64 --seed 7 --out "$tmp/model.gguf" >/dev/null || exit 1
serve_start page "$tmp/model.gguf" -np 1 -c 4096 -t 1 --api-key sk-page --metrics || exit 1
(cd "$dir" && timeout 300 node page.mjs "$port" sk-page "$shots")
rc=$?
serve_stop page "$pid" || rc=1
pid=""
[ $rc -eq 0 ] && ls "$shots"
exit $rc
