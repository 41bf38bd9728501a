"""Run INSIDE the Python environment being checked (an engine's venv): report what is installed.

    PY probe_env.py inventory        -> one JSON object: distributions, markers, torch's version file
    PY probe_env.py load MOD::PATH.. -> JSON lines: ``import torch`` once, then load each binary

It must not import anything from ceiling (it runs outside ceiling's environment) nor anything
that is not in the standard library (the checked environment may lack ``packaging``).
``inventory`` does not import torch (reading ``torch/version.py`` as text is enough for the
version and the CUDA runtime it was built for), so it stays well under a second.
``load`` prints one line per binary as soon as it is done, so that a binary that crashes the
interpreter is still identified by the caller (the last path without a line).
"""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.metadata as md
import importlib.util
import json
import os
import platform
import re
import sys

_EXT_SUFFIXES = tuple(importlib.machinery.EXTENSION_SUFFIXES)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*")


def _markers() -> dict[str, str]:
    """PEP 508 marker values of this interpreter (what packaging's default_environment gives)."""
    impl = sys.implementation
    iv = impl.version
    impl_version = f"{iv.major}.{iv.minor}.{iv.micro}"
    if iv.releaselevel != "final":
        impl_version += iv.releaselevel[0] + str(iv.serial)
    return {
        "implementation_name": impl.name,
        "implementation_version": impl_version,
        "os_name": os.name,
        "platform_machine": platform.machine(),
        "platform_release": platform.release(),
        "platform_system": platform.system(),
        "platform_version": platform.version(),
        "python_full_version": platform.python_version(),
        "platform_python_implementation": platform.python_implementation(),
        "python_version": ".".join(platform.python_version_tuple()[:2]),
        "sys_platform": sys.platform,
    }


def _requires_torch(requires: list[str]) -> bool:
    """Whether a requirement (not one of an extra) names torch."""
    for req in requires:
        head, _, marker = req.partition(";")
        m = _NAME.match(head.strip())
        if m and m.group(0).lower() == "torch" and "extra" not in marker:
            return True
    return False


def _binaries(dist: md.Distribution) -> list[str]:
    """The dist's shared objects (extension modules and libraries), relative to its location."""
    out = []
    for f in dist.files or []:
        s = str(f)
        is_so = s.endswith(".so") or ".so." in s.rsplit("/", 1)[-1]
        if is_so and ".libs/" not in s and not s.startswith(".."):
            out.append(s)
    return sorted(out)


def _torch_version_file(dists: list[dict]) -> dict | None:
    for d in dists:
        if d["name"].lower() != "torch":
            continue
        path = os.path.join(d["location"], "torch", "version.py")
        try:
            with open(path, encoding="utf-8") as fh:
                tree = ast.parse(fh.read())
        except (OSError, SyntaxError):
            return None
        values: dict[str, object] = {}
        for node in tree.body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    if isinstance(t, ast.Name) and isinstance(node.value, ast.Constant):
                        values[t.id] = node.value.value
        return {
            "path": path,
            "version": values.get("__version__"),
            "cuda": values.get("cuda"),
            "hip": values.get("hip"),
            "git_version": values.get("git_version"),
        }
    return None


def inventory() -> dict:
    dists = []
    for dist in md.distributions():
        name = dist.metadata["Name"]
        if not name:
            continue
        location = str(dist.locate_file(""))
        requires = list(dist.requires or [])
        item = {
            "name": name,
            "version": dist.version,
            "requires": requires,
            "location": location,
            "binaries": [],
        }
        if _requires_torch(requires) or name.lower() in ("torch", "flash-attn", "flash_attn"):
            item["binaries"] = _binaries(dist)
        dists.append(item)
    return {
        "python": sys.executable,
        "prefix": sys.prefix,
        "version": platform.python_version(),
        "markers": _markers(),
        "dists": dists,
        "torch": _torch_version_file(dists),
        "ext_suffixes": list(_EXT_SUFFIXES),
    }


def _mapped(fragment: str) -> list[str]:
    """Paths of mapped files whose name contains ``fragment`` (what this process really loaded)."""
    found: list[str] = []
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                parts = line.split(None, 5)
                if len(parts) == 6 and fragment in parts[5].rsplit("/", 1)[-1]:
                    p = parts[5].strip()
                    if p not in found:
                        found.append(p)
    except OSError:
        pass
    return found


def _emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def load(items: list[str]) -> None:
    """``items``: ``MODULE::PATH`` pairs (the module name the file's ``PyInit_`` answers to; empty
    for a plain library). Imports torch first (extensions need its libraries)."""
    torch_info: dict[str, object] = {"imported": False}
    try:
        import torch

        torch_info = {"imported": True, "version": torch.__version__, "cuda": torch.version.cuda}
        c = getattr(torch, "_C", None)
        if c is not None and hasattr(c, "_cuda_getArchFlags"):
            flags = c._cuda_getArchFlags()
            torch_info["arch_flags"] = flags.split() if flags else []
        if torch.version.cuda:
            try:
                v = torch.cuda.nccl.version()
                torch_info["nccl_version"] = ".".join(str(x) for x in v) if v else None
            except Exception as exc:
                torch_info["nccl_error"] = f"{type(exc).__name__}: {exc}"
        torch_info["nccl_loaded"] = _mapped("libnccl")
        torch_info["cudart_loaded"] = _mapped("libcudart")
    except Exception as exc:
        torch_info["error"] = f"{type(exc).__name__}: {exc}"
    _emit({"torch": torch_info})
    for item in items:
        name, _, path = item.partition("::")
        try:
            if name:
                loader = importlib.machinery.ExtensionFileLoader(name, path)
                spec = importlib.util.spec_from_file_location(name, path, loader=loader)
                if spec is None:
                    raise ImportError(f"no module spec for {path}")
                module = importlib.util.module_from_spec(spec)  # runs PyInit_*
                sys.modules.setdefault(name, module)
            else:
                import ctypes

                ctypes.CDLL(path, mode=os.RTLD_NOW)
            _emit({"path": path, "ok": True})
        except BaseException as exc:  # ImportError, OSError, SystemError from an init function
            _emit({"path": path, "ok": False, "error": f"{type(exc).__name__}: {exc}"})


def main() -> int:
    if len(sys.argv) < 2:
        print("usage: probe_env.py inventory | load MODULE::PATH...", file=sys.stderr)
        return 2
    if sys.argv[1] == "inventory":
        print(json.dumps(inventory()))
        return 0
    load(sys.argv[2:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
