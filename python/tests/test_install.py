"""`pip install` of the package, offline (no index, no build isolation: the
interpreter's own setuptools), into a temporary venv with the system's site
packages; the installed copy (not the source tree) then finds libkeel.so
next to itself, and through KEEL_LIBRARY."""
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(args, **kw):
    r = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)
    assert r.returncode == 0, f"{' '.join(map(str, args))} exited {r.returncode}:\n{r.stdout[-4000:]}"
    return r.stdout


def _clean_env():
    env = dict(os.environ)
    for k in ("PYTHONPATH", "KEEL_LIBRARY", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL"):
        env.pop(k, None)
    env["PIP_NO_INDEX"] = "1"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def test_pip_install_offline(lib_path, model, tmp_path):
    for mod in ("setuptools", "venv", "ensurepip"):  # the venv gets its pip from ensurepip
        r = subprocess.run([sys.executable, "-c", f"import {mod}"], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
        if r.returncode != 0:
            pytest.skip(f"{sys.executable} has no {mod} (Debian: python3-setuptools, python3-venv)")
    # a copy: pip builds in the source directory (build/, *.egg-info)
    src = tmp_path / "src"
    shutil.copytree(PKG, src, ignore=shutil.ignore_patterns("tests", "__pycache__", "*.egg-info", "build"))
    env = _clean_env()
    venv = tmp_path / "venv"
    # the system's pip (Debian python3-pip), seen through the system site packages, installs into
    # the venv; without one the venv gets its own from ensurepip (slower)
    has_pip = subprocess.run([sys.executable, "-c", "import pip"], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL).returncode == 0
    r = subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", *(["--without-pip"] if has_pip else []),
                        str(venv)],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if r.returncode != 0:
        pytest.skip(f"python3 -m venv failed (Debian: python3-venv): {r.stdout[-500:]}")
    py = str(venv / "bin" / "python")
    _run([py, "-m", "pip", "install", "--no-index", "--no-build-isolation", "--no-deps", str(src)], env=env,
         cwd=tmp_path)
    out = _run([py, "-m", "pip", "show", "-f", "keel"], env=env, cwd=tmp_path)
    assert "Name: keel" in out and "keel/__init__.py" in out

    check = textwrap.dedent("""
        import os, sys, keel
        want_dir, model = sys.argv[1], sys.argv[2]
        assert os.path.dirname(keel.__file__).startswith(want_dir), keel.__file__
        with keel.Engine(model, n_threads=1) as e:
            r = e.complete("Hi", max_tokens=3, temperature=0)
        print("lib", keel.library_path())
        print("tokens", r.usage.completion_tokens)
    """)
    site = _run([py, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], env=env).strip()
    # KEEL_LIBRARY names the library
    env_lib = dict(env, KEEL_LIBRARY=lib_path)
    out = _run([py, "-c", check, site, model], env=env_lib, cwd=tmp_path)
    assert f"lib {lib_path}" in out and "tokens 3" in out
    # without KEEL_LIBRARY: the copy next to the package is found first
    shutil.copy(lib_path, os.path.join(site, "keel", "libkeel.so"))
    out = _run([py, "-c", check, site, model], env=env, cwd=tmp_path)
    assert f"lib {os.path.join(site, 'keel', 'libkeel.so')}" in out and "tokens 3" in out
    # a KEEL_LIBRARY that does not load is an error naming it, not a fallback
    bad = subprocess.run([py, "-c", "import keel; keel.Engine('x')"], env=dict(env, KEEL_LIBRARY="/nonexistent.so"),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    assert bad.returncode != 0 and "KeelLibraryError" in bad.stdout and "/nonexistent.so" in bad.stdout
    _run([py, "-m", "pip", "uninstall", "-y", "keel"], env=env, cwd=tmp_path)
