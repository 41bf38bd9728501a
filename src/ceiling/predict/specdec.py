"""Speculative decoding (MTP, EAGLE/EAGLE-3, n-gram): the step is drafts + one verify.

One engine step with k drafted tokens runs, per sequence:

- **k draft passes** at the batch's B tokens each: the checkpoint's MTP layer(s) (``mtp``: one
  decoder layer of the target's own kind, MoE included, reused for every drafted token, plus
  its ``eh_proj`` fusion GEMM, 2h -> h, replicated), or an EAGLE draft (one Llama-style layer at
  the target's width plus its ``fc`` over 2 or 3 hidden states, replicated, and a draft
  vocabulary), or nothing on the GPU (``ngram``: prompt lookup on the CPU). Each pass is the
  same per-op model as the target's step (its GEMMs, attention, allreduces, lm_head), built on a
  draft ``ModelSpec`` made from the target's config; the engine's host time is paid once per
  step, not per pass (the drafter runs inside the engine's step);
- **one verify pass**: the target at B x (k+1) tokens — its GEMMs and MoE at that many rows,
  its allreduces of that many hidden vectors — while each sequence's KV cache is read once
  (decode attention reads the cache once for all k+1 queries: modelled as B x (k+1) tokens at
  context / (k+1), the same KV bytes).

Tokens per step = the acceptance length tau (accepted drafts + the bonus token): the user's
(``spec_acceptance_length``, or a rate r as 1 + k r), else the method's published or estimated
default (``data/predict/spec_decode.yaml``). ms per token = (k x draft + verify) / tau, so a
draft that costs more than its accepted tokens save (slow allreduces over PCIe, a large lm_head)
makes speculative decoding slower, as measured on such boxes. The bound takes every draft
accepted (tau = k + 1) with the draft and verify passes at their physical floors.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Literal

from pydantic import Field, JsonValue

from ceiling.errors import CeilingError
from ceiling.inputs import read_json
from ceiling.predict.evidence import Evidence
from ceiling.predict.opspec import OpRow
from ceiling.predict.resolved import Setup
from ceiling.predict.schema import PredictRequest, Speculative
from ceiling.predict.specpath import EnginePath, extra_costs
from ceiling.predict.step import Step, decode_step
from ceiling.spec._data import DataModel, load_yaml
from ceiling.spec.families import build_model
from ceiling.spec.model import ModelSpec
from ceiling.spec.quant import named_format

METHODS = ("mtp", "eagle", "eagle3", "ngram")


class Method(DataModel):
    """One method of ``data/predict/spec_decode.yaml``."""

    draft: Literal["mtp_layers", "eagle_layer", "none"]
    alpha: float = Field(gt=0, lt=1)
    source: str
    fc_inputs: int = 0
    vocab: int | Literal["target"] = "target"
    host_ms_per_seq: float = 0.0


class SpecData(DataModel):
    default_tokens: int = Field(ge=1)
    methods: dict[str, Method]
    engine_paths: dict[str, EnginePath] = Field(default_factory=dict)


def spec_data() -> SpecData:
    return load_yaml("predict/spec_decode.yaml", schema=SpecData)


def mtp_layers(spec: ModelSpec) -> int:
    """MTP layers the checkpoint ships (0: none)."""
    cfg = _text_config(_raw(spec))
    for key in ("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_modules"):
        if n := _int(cfg, key):
            return n
    return 0


def _int(cfg: dict[str, JsonValue], key: str, default: int = 0) -> int:
    """A config count (``default`` when absent, null or 0); an array or mapping there is not
    a count (the default too: the config is checked for shape where it is loaded)."""
    value = cfg.get(key)
    return int(value) if isinstance(value, (int, float, str)) and value else default


def _raw(spec: ModelSpec) -> dict[str, JsonValue]:
    fix = "pass --model as a catalog name, a config.json or a model directory"
    raw = read_json(spec.source, "the model's config.json (speculative decoding reads it)", fix)
    if not isinstance(raw, dict):
        raise CeilingError(f"{spec.source} is not a JSON object of model settings", fix=fix)
    return raw


def _text_config(raw: dict[str, JsonValue]) -> dict[str, JsonValue]:
    tc = raw.get("text_config")
    return tc if isinstance(tc, dict) else raw


def _hf_quant(spec: ModelSpec) -> dict[str, JsonValue] | None:
    hq = Path(spec.source).parent / "hf_quant_config.json"
    if not hq.is_file():
        return None
    out = read_json(hq, "hf_quant_config.json", "pass a model directory whose files are intact")
    return out if isinstance(out, dict) else None


def acceptance(method: str, k: int, rate: float | None, length: float | None) -> tuple[float, str]:
    """(tokens per verify step, where the figure comes from)."""
    if length is not None:
        if not 1.0 <= length <= k + 1:
            raise CeilingError(
                f"--spec-acceptance-length {length:g} is outside 1-{k + 1} for {k} drafted tokens",
                fix="the acceptance length counts the bonus token: between 1 and k + 1",
            )
        return length, "given (--spec-acceptance-length)"
    if rate is not None:
        return 1.0 + k * rate, f"given rate {rate:g} (accepted / drafted): 1 + k x rate"
    m = spec_data().methods[method]
    a = m.alpha
    tau = (1 - a ** (k + 1)) / (1 - a)
    return tau, f"default alpha {a} per drafted token (geometric): {m.source.strip()}"


def _draft_spec(s: Setup, method: str, draft_layers: int | None) -> ModelSpec | None:
    """The draft model as a ModelSpec, from the target's config (None: no GPU draft)."""
    m = spec_data().methods[method]
    kind = m.draft
    if kind == "none":
        return None
    target = s.spec
    raw = copy.deepcopy(_raw(target))
    cfg = _text_config(raw)
    if kind == "mtp_layers":
        n = mtp_layers(target)
        if n == 0:
            raise CeilingError(
                f"--spec mtp: {target.name} ships no MTP layers (its config has no "
                "num_nextn_predict_layers / mtp_num_hidden_layers)",
                fix="use --spec eagle3 (a separate draft model) or --spec ngram",
            )
        n = 1  # the engines run one MTP layer per drafted token (reused past the first)
        cfg.update(num_hidden_layers=n, first_k_dense_replace=0, mlp_only_layers=[])
        if "layer_types" in cfg or "full_attention_interval" in cfg:
            full: list[JsonValue] = ["full_attention"] * n  # MTP layers use full attention
            cfg["layer_types"] = full
        hq = _hf_quant(target)
        mtp = build_model(raw, name=f"{target.name}.mtp", source=target.source, hf_quant=hq)
        layers = _int(_text_config(_raw(target)), "num_hidden_layers")
        if _mtp_left_unquantized(_raw(target), hq, mtp_index=layers):
            # the checkpoint keeps its MTP layer out of quantization (as stored)
            mtp = mtp.with_weight_format(named_format("bf16"))
        return mtp
    heads = _int(cfg, "num_attention_heads", target.heads)
    draft = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": target.hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": _int(cfg, "num_key_value_heads", min(heads, 8)),
        "head_dim": _int(cfg, "head_dim", target.hidden // heads),
        "intermediate_size": _int(cfg, "intermediate_size", 4 * target.hidden),
        "num_hidden_layers": draft_layers or 1,
        "vocab_size": _int(cfg, "vocab_size") if m.vocab == "target" else int(m.vocab),
        "max_position_embeddings": _int(cfg, "max_position_embeddings", 131072),
        "rms_norm_eps": 1e-5,
        "torch_dtype": "bfloat16",
    }
    return build_model(draft, name=f"{target.name}.{method}-draft", source="draft")


def _mtp_left_unquantized(
    raw: dict[str, JsonValue], hq: dict[str, JsonValue] | None, mtp_index: int
) -> bool:
    """Whether the checkpoint's quantization leaves the MTP layer out (nvidia's NVFP4 exports:
    Qwen3.5 ignores ``mtp.layers.0*``, DeepSeek excludes ``model.layers.61*``, the layer after
    the last decoder layer; TensorRT-LLM's DeepSeek-R1 recipe keeps MTP in bf16)."""
    lists: list[JsonValue] = []
    for qc in (raw.get("quantization_config"), _text_config(raw).get("quantization_config")):
        if isinstance(qc, dict):
            lists += [qc.get("ignore"), qc.get("modules_to_not_convert"), qc.get("exclude_modules")]
    quant = hq.get("quantization") if hq else None
    if isinstance(quant, dict):
        lists.append(quant.get("exclude_modules"))
    names = [str(x) for lst in lists if isinstance(lst, list) for x in lst]
    return any(
        "mtp" in n or f"layers.{mtp_index}." in n or n.endswith(f"layers.{mtp_index}*")
        for n in names
    )


def _fusion_gemm_ms(s: Setup, inputs: int, batch: int) -> tuple[float, float]:
    """(expected, bound) ms of the draft's fusion GEMM (inputs x h -> h, bf16, replicated):
    bytes at the achieved / bound bandwidth plus one GEMM's fixed cost (hand-off floor in the
    bound)."""
    h = s.spec.hidden
    nbytes = inputs * h * h * 2 + batch * (inputs + 1) * h * 2
    bound_bw = Evidence(s).bound_bw()
    exp = s.gemm_kernel_us / 1e3 + nbytes / (s.bw_GBps * 1e6)
    bnd = s.consts.bound_op_us / 1e3 + nbytes / (bound_bw * 1e6)
    return exp, bnd


def _scaled(rows: list[OpRow], factor: float, prefix: str = "") -> list[OpRow]:
    out = []
    for r in rows:
        d = dict(r.__dict__)
        d["name"] = prefix + r.name
        for key in ("count", "expected_ms", "bound_ms", "hidden_ms"):
            if key in d and isinstance(d[key], (int, float)):
                d[key] = d[key] * factor
        out.append(OpRow(**d))
    return out


def spec_step(s: Setup, req: PredictRequest) -> Step:
    """The decode step per token under speculative decoding (``req``: PredictRequest with
    ``spec`` set): components, ops and details are per generated token."""
    method = req.spec
    k = int(req.spec_tokens or spec_data().default_tokens)
    B, ctx = req.batch, req.context
    tau, tau_src = acceptance(method, k, req.spec_acceptance_rate, req.spec_acceptance_length)
    s = copy.copy(s)
    s.speculative = method  # the engine's scheduler may change with it (choices.host_cost)
    verify = decode_step(s, B * (k + 1), max(1, math.ceil(ctx / (k + 1))))
    draft_spec = _draft_spec(s, method, req.spec_draft_layers)
    path = spec_data().engine_paths.get(s.dep.engine) or EnginePath()
    comps = dict(verify.components)
    bcomps = dict(verify.bound_components)
    ops = list(verify.ops)
    d_ms = d_bound = 0.0
    if draft_spec is not None:
        ds = copy.copy(s)
        ds.spec = draft_spec
        draft = decode_step(ds, B, ctx)
        # the engine's first draft pass runs over the k+1 verified tokens of each sequence
        first = (
            decode_step(ds, B * (k + 1), ctx) if path.first_draft_pass == "all_tokens" else draft
        )
        for key in set(draft.components) | set(first.components):
            if key != "host":  # the drafter runs inside the engine's step: one host cost
                v = first.components.get(key, 0.0) + (k - 1) * draft.components.get(key, 0.0)
                comps[key] = comps.get(key, 0.0) + v
                d_ms += v
        for key in set(draft.bound_components) | set(first.bound_components):
            if key != "host":
                v = first.bound_components.get(key, 0.0)
                v += (k - 1) * draft.bound_components.get(key, 0.0)
                bcomps[key] = bcomps.get(key, 0.0) + v
                d_bound += v
        ops += _scaled([r for r in first.ops if r.kind != "host"], 1, "draft1.")
        if k > 1:
            ops += _scaled([r for r in draft.ops if r.kind != "host"], k - 1, "draft.")
        fc = {"mtp": 2}.get(method) or spec_data().methods[method].fc_inputs
        if fc:
            e, b = _fusion_gemm_ms(s, fc, B)
            comps["launch"] = comps.get("launch", 0.0) + k * (s.gemm_kernel_us / 1e3)
            comps["weights"] = comps.get("weights", 0.0) + k * (e - s.gemm_kernel_us / 1e3)
            bcomps["weights"] = bcomps.get("weights", 0.0) + k * b
            name = "draft.eh_proj" if method == "mtp" else "draft.fc"
            ops.append(
                OpRow(
                    name,
                    "gemm",
                    float(k),
                    k * e,
                    k * b,
                    "prior",
                    0.5,
                    "gemm_bf16",
                    f"{fc}h -> h fusion GEMM, replicated (bytes at the achieved bandwidth)",
                    fc * s.spec.hidden**2 * 2.0,
                    0.0,
                )
            )
            d_ms, d_bound = d_ms + k * e, d_bound + k * b
    else:
        host = spec_data().methods[method].host_ms_per_seq * B
        comps["host"] = comps.get("host", 0.0) + host
        d_ms += host
    extra = extra_costs(s, path, B, ctx, k, draft_spec)
    for r in extra.ops:  # sampling kernels and the verify's unsplit KV read: kernel choices
        comps["launch"] = comps.get("launch", 0.0) + r.expected_ms
        ops.append(r)
    gpu_ms = sum(v for key, v in comps.items() if key != "host")
    if extra.host_issue_ms > gpu_ms:  # piecewise graphs: the host issues slower than the GPU runs
        comps["host"] = comps.get("host", 0.0) + extra.host_issue_ms - gpu_ms
    step_ms = sum(comps.values())
    per_tok = {key: v / tau for key, v in comps.items()}
    bound_tok = {key: v / (k + 1) for key, v in bcomps.items()}
    rows = []
    for r in ops:
        d = dict(r.__dict__)
        d["count"] = r.count / tau
        d["expected_ms"] = r.expected_ms / tau
        d["bound_ms"] = r.bound_ms / (k + 1)
        if "hidden_ms" in d:
            d["hidden_ms"] = d["hidden_ms"] / tau
        rows.append(OpRow(**d))
    details = verify.details.model_copy(
        update={
            "speculative": Speculative(
                method=method,
                draft_tokens=k,
                acceptance_length=round(tau, 3),
                acceptance_source=tau_src,
                verify_ms=round(verify.ms, 4),
                draft_ms=round(d_ms, 4),
                step_ms=round(step_ms, 4),
                bound_acceptance_length=k + 1,
                draft_model=draft_spec.name
                if draft_spec is not None
                else "none (CPU prompt lookup)",
                engine_path=extra.notes,
                host_issue_ms=round(extra.host_issue_ms, 4),
            )
        }
    )
    return Step(per_tok, details, bound_components=bound_tok, ops=rows)


def assumption(step: Step) -> str | None:
    """One line for the assumptions list (None without speculative decoding)."""
    sp = step.details.speculative
    if not sp:
        return None
    return (
        f"speculative decoding {sp.method}: {sp.draft_tokens} drafted tokens per step "
        f"({sp.draft_model}: {sp.draft_ms:.2f} ms) + one verify at "
        f"{sp.draft_tokens + 1} tokens per sequence ({sp.verify_ms:.2f} ms); "
        f"{sp.acceptance_length:.2f} tokens per step ({sp.acceptance_source}); "
        f"the bound takes every draft accepted"
    )
