"""``ceiling sanity`` end to end: check the inputs, find (or launch) the server, ask, judge.

The asking and judging are the sanity library's (:func:`ceiling.sanity.checks.check_server`);
this flow adds what only a flow may do: launch a ``--variant`` (and stop it afterwards) and
read what the server serves (``/v1/models``) to fill in the model, the engine and the model
directory the user left out.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from pydantic import BaseModel
from rich.markup import escape

from ceiling.bench.config import MAX_SECONDS
from ceiling.console import console
from ceiling.engines.variant import load_variant
from ceiling.errors import CeilingError
from ceiling.flows.target import engine_of
from ceiling.inputs import base_url, check_server_url
from ceiling.redact import use_api_key
from ceiling.run.launcher import launch
from ceiling.sanity.checks import SanityReport, check_server
from ceiling.sanity.gate import variant_dtype
from ceiling.server.sync import served_models

#: sanity has no option for how long a launch may take (its --request-timeout is per request):
#: a model that loads longer is launched on its own and asked by URL
LAUNCH_WAIT_HINT = (
    "the wait (launch it with `ceiling launch VARIANT --ready-timeout 3600`, then "
    "`ceiling sanity --url URL`)"
)


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


def check_inputs(cfg: SanityConfig) -> SanityConfig:
    """Every input before a launch or a request (a bad one costs a second, not a model load);
    the config with its URL normalised to the server root."""
    if not cfg.url and not cfg.variant:
        raise CeilingError(
            "sanity needs a server to ask",
            fix="pass --url http://HOST:PORT (running) or --variant FILE (launch)",
        )
    if cfg.url:
        cfg = cfg.model_copy(update={"url": base_url(str(cfg.url))})
        check_server_url(str(cfg.url))
    if cfg.model_path and not Path(cfg.model_path).exists():
        raise CeilingError(
            f"--model {cfg.model_path} not found", fix="pass the model's local directory"
        )
    if not 0 < cfg.timeout_s <= MAX_SECONDS:  # socket timeouts overflow past time_t
        raise CeilingError(
            f"--request-timeout {cfg.timeout_s:g} is not a positive time",
            fix="--request-timeout 60",
        )
    return cfg


def run(cfg: SanityConfig) -> SanityReport:
    """``ceiling sanity``: a running server (``url``) or a variant to launch, asked and judged."""
    cfg = check_inputs(cfg)
    with contextlib.ExitStack() as stack:
        engine, model_dir, dtype, model = cfg.engine, cfg.model_path, cfg.dtype, cfg.model
        if cfg.variant:
            variant = load_variant(cfg.variant)
            server = stack.enter_context(
                launch(
                    variant,
                    timeout_s=cfg.launch_timeout_s,
                    progress=cfg.progress,
                    timeout_option=LAUNCH_WAIT_HINT,
                )
            )
            # the requests carry the key the launched server wants (a variant's --api-key)
            stack.enter_context(use_api_key(server.api_key))
            url = server.url
            engine = engine or variant.engine
            model = model or server.model
            model_dir = model_dir or (variant.model if Path(variant.model).is_dir() else None)
            dtype = dtype or variant_dtype(variant)
        else:
            url = str(cfg.url)
        models = served_models(url, timeout_s=cfg.timeout_s, command="ceiling")
        if model is None:
            if not models:
                raise CeilingError(f"{url} serves no model", fix="check the server's /v1/models")
            model = models[0].id
        entry = next((m for m in models if m.id == model), models[0] if models else None)
        engine = engine or (engine_of(entry) if entry else None)
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
