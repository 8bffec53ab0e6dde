#!/bin/sh
# run.sh — ctest python_pkg: the keel package's pytest suite (python/tests)
# from the source tree, without installing it (PYTHONPATH=python,
# KEEL_LIBRARY, KEEL_BIN); test_install.py also pip-installs it, offline,
# into a temporary venv.
#   run.sh SRC_DIR KEEL_BIN LIBKEEL_SO [pytest arguments...]
# Exit 77 (skipped) without a python3 that has pytest (Debian
# python3-pytest): $PYTHON, then python3 on PATH, then /usr/bin/python3.
# KEEL_PRELOAD (ASan builds): the sanitizer runtimes python3 must preload.
set -eu
src=$1 keel=$2 lib=$3
shift 3
py=""
for p in ${PYTHON:-} python3 /usr/bin/python3; do
    if command -v "$p" > /dev/null 2>&1 && "$p" -c "import pytest" > /dev/null 2>&1; then
        py=$p
        break
    fi
done
if [ -z "$py" ]; then
    echo "SKIP: no python3 with pytest (Debian: apt-get install python3-pytest)"
    exit 77
fi
abs() { case $1 in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
src=$(abs "$src") keel=$(abs "$keel") lib=$(abs "$lib")
for f in "$keel" "$lib"; do
    [ -f "$f" ] || { echo "FAIL: $f not found (make build)" >&2; exit 1; }
done
echo "+ $py -m pytest ($("$py" -c 'import sys, pytest; print(sys.version.split()[0], "pytest", pytest.__version__)'))"
export PYTHONPATH="$src/python" KEEL_LIBRARY="$lib" KEEL_BIN="$keel" PYTHONDONTWRITEBYTECODE=1
cd "$src/python"
if [ -n "${KEEL_PRELOAD:-}" ]; then
    # the interpreter itself is not leak-free: leaks are checked by the C tests
    exec env LD_PRELOAD="$KEEL_PRELOAD" ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0" KEEL_ASAN=1 \
        "$py" -m pytest -p no:cacheprovider -ra "$@" tests
fi
exec "$py" -m pytest -p no:cacheprovider -ra "$@" tests
