"""What the doctor can see of the setup it examines, gathered for
:func:`ceiling.diagnose.setup.resolve`: the served models and their shapes (``/v1/models``, the
start-up log, llama-server's ``/props``, the GGUF, the variant), the TP and device the log or the
variant states, the GPUs of this box when the server runs on it. I/O (HTTP, NVML, file headers):
the flow layer's; each read is fast (no model load, no measurement) so that a contradiction is
refused before any slow work.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ceiling.diagnose.expect import arg_value, serves_gguf
from ceiling.diagnose.facts import EngineFacts
from ceiling.diagnose.schema import DoctorConfig
from ceiling.diagnose.setup import ModelShape, Seen, SeenModel, Stated
from ceiling.errors import CeilingError
from ceiling.flows.target import server_props
from ceiling.predict.core import load_spec
from ceiling.predict.gguf import is_gguf, read_gguf
from ceiling.probe.topology import probe
from ceiling.server.schema import ServedModel
from ceiling.spec.hardware import load_gpu
from ceiling.spec.model import list_models

_LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")


def is_local(url: str | None) -> bool:
    """Whether a URL's server runs on this box (a loopback address). A tunnel to another
    machine looks local too: name that machine's address to examine it as remote."""
    host = (urlsplit(url).hostname or "") if url else ""
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def catalog_name_of(hf_id: str) -> str | None:
    """The catalog entry a Hugging Face id comes from (case-insensitive), None if none."""
    return next((r["name"] for r in list_models() if r["hf_model"].lower() == hf_id.lower()), None)


def shape_of(name: str | None) -> ModelShape | None:
    """The shape of a model named by a GGUF file, a catalog name, a config or a directory
    here, or the Hugging Face id a catalog entry comes from (None: not readable here)."""
    if not name:
        return None
    try:
        if is_gguf(name):
            g = read_gguf(name)
            return ModelShape(
                name=name,
                layers=g.int_key("block_count"),
                hidden=g.int_key("embedding_length"),
                experts=g.int_key("expert_count"),
            )
        known = catalog_name_of(name)
        if known is None and "/" in name and not Path(name).expanduser().exists():
            return None  # an HF id the catalog does not hold: no config here to read
        spec = load_spec(known or name)
    except (CeilingError, OSError):
        return None
    weights = spec.quant.summary
    if weights in ("unquantized bf16", "unquantized fp16"):  # the same bytes: the same prediction
        weights = "unquantized 16-bit"
    return ModelShape(
        name=name,
        layers=spec.num_layers,
        hidden=spec.hidden,
        experts=spec.n_experts,
        weights=weights,
    )


def stated_setup(cfg: DoctorConfig) -> Stated:
    """What the user said (``--gpu`` as its catalog name: an alias names the same GPU)."""
    gpu = None
    if cfg.gpu:
        gpu = cfg.gpu if cfg.gpu.endswith((".yaml", ".yml")) else load_gpu(cfg.gpu).name
    return Stated(
        model=cfg.model_path,
        shape=shape_of(cfg.model_path),
        gpu=gpu,
        tp=cfg.tp,
        served_model=cfg.served_model,
    )


def _box(seen: Seen) -> Seen:
    topo = probe()
    seen.box_gpus = [g.name for g in topo.gpus]
    seen.box_catalog = [g.catalog_name for g in topo.gpus if g.catalog_name]
    seen.box_reason = topo.reason
    return seen


def seen_before_launch(variant: Any) -> Seen:
    """A variant about to be launched: its model and TP, and this box (where it will run)."""
    path = str(variant.model_path()) if variant.model_path() is not None else None
    models = (
        [SeenModel(name=path, where="the variant's model", shape=shape_of(path))] if path else []
    )
    tp = arg_value(variant, "tensor-parallel-size", "tp")
    return _box(
        Seen(
            local=True,
            models=models,
            tp=int(tp) if tp else None,
            tp_where=f"the variant {variant.name}",
        )
    )


def seen_of_server(
    url: str,
    models: list[ServedModel],
    served: str | None,
    engine: str | None,
    facts: EngineFacts | None,
) -> Seen:
    """A running server: what ``/v1/models`` (the served entry), the start-up log and, for a
    llama.cpp server, ``/props`` show of its model, TP and device; this box when it is local."""
    entry = next((m for m in models if m.id == served), models[0] if models else None)
    seen_models: list[SeenModel] = []
    names = [
        (entry.root, "its /v1/models root") if entry else (None, ""),
        (facts.model if facts else None, "its start-up log"),
    ]
    if serves_gguf(engine, facts):
        props = server_props(url)
        names.append((props.model_path if props else None, "its /props"))
    for name, where in names:
        if name and all(m.name != name for m in seen_models):
            seen_models.append(SeenModel(name=name, where=where, shape=shape_of(name)))
    if not seen_models and entry is not None and entry.id:
        seen_models.append(SeenModel(name=entry.id, where="its /v1/models id"))
    tp = facts.tensor_parallel_size if facts else None
    seen = Seen(
        url=url,
        local=is_local(url),
        served_ids=[m.id for m in models],
        models=seen_models,
        tp=tp,
        tp_where="the start-up log" if tp else "",
        device=facts.device if facts else None,
    )
    return _box(seen) if seen.local else seen
