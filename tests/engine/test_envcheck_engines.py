"""The environment check against the REAL engines: it reports no error where the engine's own
import of its kernels succeeds (on any CPU), and on vLLM's AVX2 path, forced on a CPU with
AVX-512 by answering vLLM's selection (torch.cpu._is_avx512_supported) with False."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ceiling.engines import all_engines, get_engine
from ceiling.engines.kernels import CpuFeatures
from ceiling.engines.variant import Variant
from ceiling.envcheck import check
from ceiling.errors import CeilingError

ENGINES = [e.name for e in all_engines() if e.kernels_import]
AVX2_ONLY = CpuFeatures(machine="x86_64", flags=frozenset({"sse4_2", "avx", "avx2", "fma"}))


def _own_import(python: Path, code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(python), "-c", code], capture_output=True, text=True, check=False, timeout=300
    )


@pytest.mark.parametrize("name", ENGINES)
def test_preflight_has_no_error_where_the_engine_loads_its_kernels(name, tmp_path, monkeypatch):
    adapter = get_engine(name)
    try:
        install = adapter.locate(Variant(name="env", engine=name, model="-"))
    except CeilingError as exc:
        pytest.skip(f"{name} is not installed: {exc}")
    if install.python is None:
        pytest.skip(f"{name} runs as a command here: no Python environment to check")
    own = _own_import(install.python, adapter.kernels_import)
    if own.returncode != 0:
        pytest.skip(f"{name}'s own import of its kernels fails here: {own.stderr[-400:]}")
    monkeypatch.setenv("CEILING_CACHE_DIR", str(tmp_path))
    check._cached_python.cache_clear()
    _, found = check.check_for_preflight(str(install.python), 1, {})
    assert [p for p in found if p["level"] == "error"] == []


def test_vllm_forced_to_its_avx2_build_loads_and_the_check_agrees(vllm_python, tmp_path):
    forced = "import torch\ntorch.cpu._is_avx512_supported = lambda: False\n"
    forced += get_engine("vllm").kernels_import
    forced += "print(*[ln.split()[-1] for ln in open('/proc/self/maps') if '/vllm/_C' in ln])\n"
    own = _own_import(vllm_python, forced)
    assert own.returncode == 0, own.stderr[-2000:]
    assert "_C_AVX2.abi3.so" in own.stdout  # vLLM itself picked the AVX2 build
    rep = check.check_python(str(vllm_python), use_cache=False, cpu=AVX2_ONLY)
    assert [p.what for p in rep.problems if p.level == "error"] == []
    [note] = [n for n in rep.notes if "_C_AVX2" in n]
    assert "imports vllm._C_AVX2 on this CPU" in note and "loaded _C_AVX2.abi3.so" in note
