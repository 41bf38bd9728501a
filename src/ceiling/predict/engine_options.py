"""TensorRT-LLM's own settings, as a TensorRT-LLM user writes them, onto predict's knobs.

A TensorRT-LLM deployment is described by its LLM-API options (the YAML given to
``trtllm-serve --extra_llm_api_options``): ``cuda_graph_config``, ``disable_overlap_scheduler``,
``allreduce_strategy``, ``enable_attention_dp``, ``kv_cache_config.dtype``. Each that changes a
decode step maps onto a knob the step model already has (CUDA graphs, the host loop, the
allreduce implementation, attention data parallel + EP, the KV dtype); the mapping, with the
TensorRT-LLM source it was read in, is data (``data/predict/trtllm_options.yaml``). A value
predict cannot express (``allreduce_strategy: MNNVL``) is refused with the reason, never
silently predicted as another setup. Other engines are untouched: the options are refused
for them.
"""

from __future__ import annotations

from typing import Any, Literal

import yaml
from pydantic import Field, JsonValue

from ceiling.errors import CeilingError
from ceiling.inputs import read_text
from ceiling.predict.schema import PredictRequest
from ceiling.spec._data import DataModel, load_yaml

Knob = Literal["cuda_graphs", "async_scheduling", "allreduce", "attention_dp", "kv_dtype"]


class TrtllmOption(DataModel):
    """One TensorRT-LLM option: the predict knob it sets, value -> knob value."""

    knob: Knob
    values: dict[str, JsonValue]
    unmodelled: dict[str, str] = Field(default_factory=dict)
    why: str


class TrtllmOptions(DataModel):
    """``data/predict/trtllm_options.yaml``."""

    source: str
    options: dict[str, TrtllmOption]


def trtllm_options() -> TrtllmOptions:
    return load_yaml("predict/trtllm_options.yaml", schema=TrtllmOptions)


def parse_options(items: list[str]) -> dict[str, JsonValue]:
    """``KEY=VALUE`` strings (the CLI's repeated ``--trtllm-option``) -> {key: YAML value}."""
    out: dict[str, JsonValue] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise CeilingError(
                f"--trtllm-option {item!r} is not KEY=VALUE",
                fix="e.g. --trtllm-option allreduce_strategy=NCCL --trtllm-option "
                "cuda_graph_config=null",
            )
        out[key.strip()] = yaml.safe_load(value) if value.strip() else None
    return out


def _flatten(data: dict[str, JsonValue], known: set[str], prefix: str = "") -> dict[str, JsonValue]:
    """A config file's nested mapping -> {dotted key: value}; a key predict maps is kept whole
    (``cuda_graph_config: {...}`` is one value), others are walked (``kv_cache_config.dtype``)."""
    out: dict[str, JsonValue] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if name not in known and isinstance(value, dict):
            out.update(_flatten(value, known, name + "."))
        else:
            out[name] = value
    return out


def read_config(path: str) -> dict[str, JsonValue]:
    """The options a TensorRT-LLM config file (``--extra_llm_api_options``) sets, flattened."""
    fix = "pass the YAML file given to trtllm-serve --extra_llm_api_options"
    text = read_text(path, "--trtllm-config", fix=fix)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CeilingError(
            f"--trtllm-config {path}: not valid YAML ({type(exc).__name__})", fix=fix
        ) from None
    if not isinstance(data, dict):
        raise CeilingError(
            f"--trtllm-config {path}: not a YAML mapping of LLM-API options",
            fix="e.g. a file with 'enable_attention_dp: true' and 'cuda_graph_config: {}'",
        )
    return _flatten(data, set(trtllm_options().options))


def _value_key(value: JsonValue) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "mapping"
    return str(value)


def apply_trtllm_options(req: PredictRequest) -> tuple[PredictRequest, list[str]]:
    """(the request with the TensorRT-LLM options applied to its knobs, one assumption line per
    option). A request without options comes back unchanged; options on another engine, an
    unknown key (from ``--trtllm-option``), a value TensorRT-LLM does not have or one predict
    does not model is a ``CeilingError``. Keys of a config file that do not change the decode
    step (``max_batch_size`` ...) are named in one line, not refused."""
    given = dict(req.trtllm_options or {})
    from_file: dict[str, JsonValue] = read_config(req.trtllm_config) if req.trtllm_config else {}
    if not given and not from_file:
        return req, []
    if req.engine != "trtllm":
        raise CeilingError(
            f"TensorRT-LLM options with --engine {req.engine}",
            fix="add --engine trtllm, or drop --trtllm-option / --trtllm-config",
        )
    data = trtllm_options()
    unknown = sorted(k for k in from_file if k not in data.options)
    for key in given:
        if key not in data.options:
            raise CeilingError(
                f"--trtllm-option {key}: not a TensorRT-LLM option predict maps",
                fix="one of: " + ", ".join(data.options),
            )
    options = {**{k: v for k, v in from_file.items() if k in data.options}, **given}
    update: dict[str, Any] = {}
    notes: list[str] = []
    for key, value in options.items():
        rule = data.options[key]
        vk = _value_key(value)
        if vk in rule.unmodelled:
            raise CeilingError(
                f"TensorRT-LLM {key}: {value}: not modelled ({rule.unmodelled[vk]})",
                fix=f"predict models {key} " + " | ".join(rule.values),
            )
        if vk not in rule.values:
            raise CeilingError(
                f"TensorRT-LLM {key}: {value!r} is not one of its values",
                fix=f"use {key} " + " | ".join([*rule.values, *rule.unmodelled]),
            )
        update[rule.knob] = rule.values[vk]
        notes.append(f"TensorRT-LLM {key}: {vk} -> {rule.knob} {rule.values[vk]} ({data.source})")
    if unknown:
        notes.append("TensorRT-LLM options not read (no decode-step knob): " + ", ".join(unknown))
    if update.pop("attention_dp", False):
        update.update(_attention_dp(req))
    update["trtllm_options"] = None
    update["trtllm_config"] = None
    return req.model_copy(update=update), notes


def _attention_dp(req: PredictRequest) -> dict[str, Any]:
    """enable_attention_dp over TP x DP ranks -> ``--tp 1 --dp N --ep N`` (MoE, EP given)."""
    from ceiling.predict.core import load_spec

    world = req.tp * (req.dp or 1)
    if world < 2:
        raise CeilingError(
            "TensorRT-LLM enable_attention_dp on one GPU: nothing to run data-parallel",
            fix="set tensor_parallel_size (--tp) to the GPUs attention DP spans",
        )
    if req.pp > 1:
        raise CeilingError(
            "TensorRT-LLM enable_attention_dp with pipeline parallel is not modelled",
            fix="drop --pp, or enable_attention_dp",
        )
    if not load_spec(req.model, req.weight_format).is_moe:
        raise CeilingError(
            "TensorRT-LLM enable_attention_dp on a dense model is not modelled (its MLP stays "
            "tensor-parallel across the DP ranks)",
            fix="drop enable_attention_dp",
        )
    if req.ep <= 1:
        raise CeilingError(
            "TensorRT-LLM enable_attention_dp with TP-sharded experts is not modelled",
            fix=f"give the MoE layout: --ep {world} (moe_expert_parallel_size)",
        )
    return {"tp": 1, "dp": world, "ep": req.ep, "gpus": world}
