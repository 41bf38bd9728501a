"""``ceiling sanity`` end to end: find (or launch) the server, ask, judge, say it.

The same gate runs as the first stage of ``doctor`` and of every ``sweep`` trial
(:func:`gate_server`): a server whose output is broken is reported as broken, never benchmarked.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from rich.markup import escape

from ceiling.bench.client import base_url
from ceiling.console import console
from ceiling.engines.variant import load_variant
from ceiling.errors import CeilingError, ExitStatus
from ceiling.inputs import check_server_url
from ceiling.run.launcher import launch
from ceiling.sanity.checks import SanityReport, _Server, check_server

#: A week: longer timeouts are typos (and a socket timeout of 1e308 s overflows time_t).
MAX_SECONDS = 7 * 86400.0


class SanityConfig(BaseModel):
    url: str | None = None
    variant: str | None = None
    model: str | None = None
    model_path: str | None = None
    engine: str | None = None
    dtype: str | None = None
    reference: bool = True
    timeout_s: float = 60.0
    launch_timeout_s: float = 1800.0
    progress: bool = True


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
    on): the model directory from ``--model-path`` (a directory, or a config.json in one) or the
    variant's model; the dtype from the variant's flags, else ``dtype`` (the engine log's)."""
    model_dir = None
    for cand in (model_path, getattr(variant, "model", None)):
        if cand and Path(cand).is_dir():
            model_dir = str(cand)
            break
        if cand and Path(cand).name == "config.json" and Path(cand).is_file():
            model_dir = str(Path(cand).parent)
            break
    srv = _Server(url, model or "", 60.0)
    models = srv.models() if (model is None or model_dir is None) else []
    model = model or (models[0].id if models else "")
    if model_dir is None and models:
        root = models[0].root
        model_dir = root if root and Path(root).is_dir() else None
    return check_server(url, model, engine, model_dir, variant_dtype(variant) or dtype)


def run_sanity(cfg: SanityConfig) -> SanityReport:
    """``ceiling sanity``: a running server (``url``) or a variant to launch, asked and judged."""
    if not cfg.url and not cfg.variant:
        raise CeilingError(
            "sanity needs a server to ask",
            fix="pass --url http://HOST:PORT (running) or --variant FILE (launch)",
        )
    # every input before a launch or a request (a bad one costs a second, not a model load)
    if cfg.url:
        cfg = cfg.model_copy(update={"url": base_url(str(cfg.url))})
        check_server_url(str(cfg.url))
    if cfg.model_path and not Path(cfg.model_path).exists():
        raise CeilingError(
            f"--model-path {cfg.model_path} not found", fix="pass the model's local directory"
        )
    if not 0 < cfg.timeout_s <= MAX_SECONDS:  # socket timeouts overflow past time_t
        raise CeilingError(
            f"--timeout {cfg.timeout_s:g} is not a positive time", fix="--timeout 60"
        )
    with contextlib.ExitStack() as stack:
        engine, model_dir, dtype, model = cfg.engine, cfg.model_path, cfg.dtype, cfg.model
        if cfg.variant:
            variant = load_variant(cfg.variant)
            server = stack.enter_context(
                launch(variant, timeout_s=cfg.launch_timeout_s, progress=cfg.progress)
            )
            url = server.url
            engine = engine or variant.engine
            model = model or server.model
            model_dir = model_dir or (variant.model if Path(variant.model).is_dir() else None)
            dtype = dtype or variant_dtype(variant)
        else:
            url = str(cfg.url)
        srv = _Server(url, model or "", cfg.timeout_s)
        models = srv.models()
        if model is None:
            if not models:
                raise CeilingError(f"{url} serves no model", fix="check the server's /v1/models")
            model = models[0].id
        entry = next((m for m in models if m.id == model), models[0] if models else None)
        engine = engine or (entry.owned_by if entry else None)
        root = entry.root if entry else None
        if model_dir is None and root and Path(root).is_dir():
            model_dir = root
        if cfg.progress:
            console().print(
                f"[bold]sanity[/bold]: asking {escape(str(model))} at {escape(url)} ..."
            )
        return check_server(
            url, model, engine, model_dir, dtype, reference=cfg.reference, timeout_s=cfg.timeout_s
        )
