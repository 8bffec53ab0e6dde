#!/bin/sh
# Installs the Debian packages keel needs to build and test, only those
# that are missing. Uses sudo when not root. If it cannot install, it prints
# the exact apt-get line to run and fails.
set -u

PKGS="build-essential cmake pkg-config clang llvm libclang-rt-14-dev
libopenblas-dev libcmocka-dev libpcre2-dev libutf8proc-dev libxxhash-dev
libzstd-dev libjansson-dev libmicrohttpd-dev nodejs npm
python3-jsonschema python3-rfc3987 python3-idna libedit-dev tmux
python3-pytest python3-venv python3-setuptools
chromium fonts-dejavu-core
libhiredis-dev redis-server redis-tools haproxy"

missing=""
for p in $PKGS; do
    # node and npm from elsewhere (e.g. a newer nodejs that bundles npm) will do
    if [ "$p" = nodejs ] && command -v node >/dev/null 2>&1; then continue; fi
    if [ "$p" = npm ] && command -v npm >/dev/null 2>&1; then continue; fi
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $p"
    fi
done

[ -z "$missing" ] && exit 0

line="apt-get install -y --no-install-recommends$missing"
echo "install-deps: missing:$missing"

if [ "$(id -u)" -eq 0 ]; then
    SUDO=""
elif command -v sudo >/dev/null 2>&1; then
    SUDO="sudo"
else
    echo "install-deps: not root and no sudo; run as root:" >&2
    echo "  apt-get update && $line" >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive
if ! $SUDO apt-get update -qq || ! $SUDO $line; then
    echo "install-deps: could not install; run as root:" >&2
    echo "  apt-get update && $line" >&2
    exit 1
fi
