#!/bin/sh
# Installs the pinned npm packages (package-lock.json) with `npm ci` into
# $KEEL_BUILD/server-clients, kept between runs: reinstalled only when
# package-lock.json changes. The ctest fixture of the SDK tests (run.sh,
# agent.sh), so that they never install at once into one folder.
# Exit 77 (ctest: skipped) only when node/npm are missing or npm cannot
# reach the registry.
set -u
here=$(cd "$(dirname "$0")" && pwd)
: "${KEEL_BUILD:?}"
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
echo "server-clients: packages installed in $dir"
