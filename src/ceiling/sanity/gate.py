"""The sanity gate that ``doctor`` and every ``sweep`` trial run first (:func:`doctor_gate`): a
server whose output is broken is reported as broken (:class:`SanityBroken`), never benchmarked.
It asks a server that is already up; launching one is the flows' job (``ceiling sanity
--variant``: :mod:`ceiling.flows.sanity`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ceiling.errors import CeilingError, ExitStatus
from ceiling.sanity.checks import SanityReport, check_server
from ceiling.server.sync import served_models


class SanityBroken(CeilingError):
    """The server's output is broken: nothing measured on it would mean anything."""

    def __init__(self, report: SanityReport) -> None:
        super().__init__(
            f"{report.model} at {report.url} gives broken output (sanity): {report.headline}",
            fix="fix the deployment before measuring it: compare its config, weights and "
            "tokenizer with the checkpoint's (see the sanity checks' evidence)",
            exit_code=ExitStatus.FAILED,
        )
        self.report = report


def variant_dtype(variant: Any) -> str | None:
    """The ``--dtype`` a variant serves with, when it says."""
    for arg in getattr(variant, "args", []) or []:
        if arg.flag.lstrip("-").replace("_", "-") == "dtype" and arg.values:
            return str(arg.values[0])
    return None


def doctor_gate(
    url: str,
    model: str | None,
    engine: str | None,
    model_path: str | None,
    variant: Any,
    dtype: str | None = None,
) -> SanityReport:
    """The gate as ``doctor``'s and ``sweep``'s first stage (the verdict is the caller's to act
    on): the model directory from ``--model`` (a directory, or a config.json in one) or the
    variant's model; the dtype from the variant's flags, else ``dtype`` (the engine log's)."""
    model_dir = None
    for cand in (model_path, getattr(variant, "model", None)):
        if cand and Path(cand).is_dir():
            model_dir = str(cand)
            break
        if cand and Path(cand).name == "config.json" and Path(cand).is_file():
            model_dir = str(Path(cand).parent)
            break
    models = served_models(url, timeout_s=60.0) if (model is None or model_dir is None) else []
    model = model or (models[0].id if models else "")
    if model_dir is None and models:
        root = models[0].root
        model_dir = root if root and Path(root).is_dir() else None
    return check_server(url, model, engine, model_dir, variant_dtype(variant) or dtype)
