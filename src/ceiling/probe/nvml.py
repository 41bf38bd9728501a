"""Lazy access to NVML (``nvidia-ml-py``), with the reason when it cannot be used.

NVML is optional: a laptop, a CI runner or a CPU box has no driver. Callers ask :func:`open_nvml`
for a handle module and get ``(None, reason)`` instead of an exception, so that ``probe`` and the
telemetry sampler can say *why* they have nothing instead of failing.
"""

from __future__ import annotations

import threading
from types import ModuleType
from typing import Any

_lock = threading.Lock()
_state: dict[str, Any] = {"module": None, "reason": None, "tried": False}


def open_nvml() -> tuple[ModuleType | None, str | None]:
    """Import and initialise NVML once per process; return (pynvml, None) or (None, reason)."""
    with _lock:
        if _state["tried"]:
            return _state["module"], _state["reason"]
        _state["tried"] = True
        try:
            import pynvml  # from the nvidia-ml-py package
        except ImportError:
            _state["reason"] = (
                "nvidia-ml-py is not installed (pip install 'ceiling[gpu]' or nvidia-ml-py)"
            )
            return None, _state["reason"]
        try:
            pynvml.nvmlInit()
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
            _state["reason"] = f"NVML could not start: {exc} (no NVIDIA driver on this machine?)"
            return None, _state["reason"]
        _state["module"] = pynvml
        return pynvml, None


def reset_for_tests() -> None:
    """Forget the cached result (tests simulate NVML being absent or present)."""
    with _lock:
        _state.update(module=None, reason=None, tried=False)


def call(fn: Any, *args: Any, default: Any = None) -> Any:
    """Call one NVML query; a 'Not Supported' or any NVML error gives ``default``.

    Many queries are unsupported on some GPUs (NVLink on a single PCIe card, power on some
    virtualised GPUs); one missing field must not lose the rest of the description.
    """
    try:
        return fn(*args)
    except Exception:
        return default


def text(value: Any) -> str:
    """NVML returns bytes from old bindings and str from new ones."""
    return value.decode() if isinstance(value, bytes) else str(value)
