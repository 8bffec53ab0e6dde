"""Fixtures of the keel package's tests (python/tests/run.sh, ctest python_pkg).

They run from the source tree without installing: PYTHONPATH=python,
KEEL_LIBRARY=build/libkeel.so, KEEL_BIN=build/keel (the generated models
come from `keel gen-model`). Without KEEL_LIBRARY or KEEL_BIN they look in
../build of the repository; a missing library or binary skips with a message.
"""
import os
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# get_weather: every value bounded, so that a random model's forced call ends
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["c", "f"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER]


def _path(env, default):
    p = os.environ.get(env) or default
    return p if os.path.exists(p) else None


@pytest.fixture(scope="session")
def lib_path():
    p = _path("KEEL_LIBRARY", os.path.join(ROOT, "build", "libkeel.so"))
    if not p:
        pytest.skip("no libkeel.so: set KEEL_LIBRARY (or make build)")
    os.environ["KEEL_LIBRARY"] = os.path.abspath(p)
    return os.environ["KEEL_LIBRARY"]


@pytest.fixture(scope="session")
def keel_bin():
    p = _path("KEEL_BIN", os.path.join(ROOT, "build", "keel"))
    if not p:
        pytest.skip("no keel binary (to generate test models): set KEEL_BIN (or make build)")
    return p


def gen_model(keel_bin, out, *extra):
    args = [keel_bin, "gen-model", "--arch", "qwen2", "--layers", "2", "--embd", "64", "--heads", "4",
            "--kv-heads", "2", "--seed", "7", "--out", str(out), *extra]
    r = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert r.returncode == 0, f"keel gen-model failed: {r.stdout}"
    return str(out)


@pytest.fixture(scope="session")
def model(tmp_path_factory, keel_bin, lib_path):
    """A generated qwen2 model (random weights, byte-level vocabulary)."""
    return gen_model(keel_bin, tmp_path_factory.mktemp("model") / "qwen2.gguf")


@pytest.fixture(scope="session")
def keel_mod(lib_path):
    import keel
    return keel


@pytest.fixture
def engine(keel_mod, model):
    with keel_mod.Engine(model, chat_template="qwen3", n_ctx=4096, n_threads=2) as e:
        yield e
