"""What-if: the same model and box with one knob changed at a time, ranked by expected tok/s.

Each variant is a full prediction of its own (same ops, same evidence), so the deltas add up
honestly: a change that moves a component the step does not wait on shows ~0 %. The ranking
uses ``expected`` (what the engine would deliver); each row also carries the variant's bound.
"""

from __future__ import annotations

import json
from functools import cache
from math import gcd

from pydantic import BaseModel, ConfigDict

from ceiling.choices import Allreduce, PredictEngine
from ceiling.predict.core import load_spec, variant
from ceiling.predict.schema import Prediction, PredictRequest, WhatIf
from ceiling.predict.specdec import mtp_layers, spec_data
from ceiling.predict.validate import max_dcp
from ceiling.spec.deployment import engines_table
from ceiling.spec.hardware import list_links, load_gpu, load_link
from ceiling.spec.model import catalog
from ceiling.spec.quant import NAMED_FORMATS, parse_quant


class Patch(BaseModel):
    """The request fields one what-if changes; the fields it leaves unset stay the request's
    (``gpus=None`` is set: the GPU count follows the new TP). The patched request is validated
    as any request is (``PredictRequest``'s own checks: the spec methods, DCP dividing TP)."""

    model_config = ConfigDict(extra="forbid")

    allreduce: Allreduce | None = None
    link: str | None = None
    cuda_graphs: bool | None = None
    tp: int | None = None
    gpus: int | None = None
    ep: int | None = None
    dcp: int | None = None
    weight_format: str | None = None
    kv_dtype: str | None = None
    spec: str | None = None
    engine: PredictEngine | None = None

    def apply(self, req: PredictRequest) -> PredictRequest:
        data = {**req.model_dump(), **self.model_dump(exclude_unset=True), "what_if": False}
        return PredictRequest.model_validate(data)


class Knob(BaseModel):
    """One what-if: what changes (the row's label), the patch that makes it, a note."""

    change: str
    patch: Patch
    note: str = ""


def _p2p_twin(link_name: str) -> str | None:
    """The same link with P2P toggled, if the catalog has it."""
    names = {lk.name for lk in list_links()}
    if link_name.endswith("-nop2p"):
        base = link_name[: -len("-nop2p")]
        return base if base in names else None
    twin = f"{link_name}-nop2p"
    if twin in names:
        return twin
    gen = link_name[:5]
    alt = f"{gen}-nop2p"
    return alt if alt in names else None


def _format_bytes(req: PredictRequest, fmt: str) -> float:
    return float(load_spec(req.model, fmt).weight_bytes())


# What each format's row says (issue 39): "fp8" alone is four formats with different scale
# layouts and kernels (kernels.yaml keys them apart), so a row names the one it priced.
# WeightFormat.name -> words; a shipped format without words here shows its bare name.
FORMAT_WORDS = {
    "fp8-block128x128": "FP8 block-128 (a scale per 128x128 block, DeepSeek-style checkpoints)",
    "fp8-tensor": "FP8 per-tensor (ModelOpt FP8; also vLLM --quantization fp8 on the fly)",
    "fp8-channel": "FP8 per-channel (compressed-tensors FP8-dynamic: activations on the fly)",
    "nvfp4": "NVFP4 (e2m1, an fp8 scale per 16)",
    "mxfp4": "MXFP4 (e2m1, an e8m0 scale per 32)",
    "int4-g32": "INT4 group-32 (W4A16, bf16 scales)",
    "int4-g128": "INT4 group-128 (W4A16, bf16 scales)",
}


@cache
def shipped_formats() -> tuple[str, ...]:
    """The --weight-format names of every quantized format the catalog's checkpoints ship
    (parse_quant over data/models, hf_quant_config.json included): each gets a what-if row."""
    by_name = {make().name: key for key, make in NAMED_FORMATS.items()}
    found: dict[str, None] = {}
    for path in catalog().values():
        raw = json.loads(path.read_text(encoding="utf-8"))
        text = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else raw
        hf = path.parent / "hf_quant_config.json" if path.name == "config.json" else None
        hf_quant = json.loads(hf.read_text(encoding="utf-8")) if hf and hf.is_file() else None
        qc = text.get("quantization_config") or raw.get("quantization_config")
        for _, fmt in parse_quant(qc, "bfloat16", hf_quant).rules:
            found[by_name.get(fmt.name, fmt.name)] = None
    return tuple(found)


def _format_variants(req: PredictRequest, pred: Prediction) -> list[Knob]:
    """One row per shipped format, named exactly: those no larger than today's weights (a
    format of the same width with another scale layout is worth a row: its kernel differs)."""
    out: list[Knob] = []
    words = {make().name: key for key, make in NAMED_FORMATS.items()}
    current = req.weight_format or "native"
    for key in shipped_formats():
        if key == current or key not in NAMED_FORMATS:
            continue  # a format no --weight-format names cannot be patched in
        if _format_bytes(req, key) > 1.01 * pred.model.weight_bytes:
            continue  # bigger weights: never a what-if worth showing
        name = next(n for n, k in words.items() if k == key)
        if name in load_spec(req.model, req.weight_format).formats():
            continue  # the checkpoint already stores its linears so
        label = FORMAT_WORDS.get(name, name)
        out.append(
            _knob(f"all linear weights {label}", f"--weight-format {key}", weight_format=key)
        )
    return out


def _knob(change: str, note: str = "", **patch: object) -> Knob:
    return Knob(change=change, patch=Patch.model_validate(patch), note=note)


def _spec_variants(req: PredictRequest) -> list[Knob]:
    """Speculative decoding on (MTP where the checkpoint ships MTP layers, else EAGLE-3 with a
    draft model), or off when the request has it; at the method's default acceptance."""
    if req.spec != "none":
        return [_knob("speculative decoding off", spec="none")]
    k = spec_data().default_tokens
    if mtp_layers(load_spec(req.model, req.weight_format)) > 0:
        return [
            _knob(
                f"MTP speculative decoding ({k} tokens)",
                "the checkpoint's MTP layer; default acceptance (spec_decode.yaml)",
                spec="mtp",
            )
        ]
    return [
        _knob(
            f"EAGLE-3 speculative decoding ({k} tokens)",
            "needs an EAGLE-3 draft for this model; default acceptance (spec_decode.yaml)",
            spec="eagle3",
        )
    ]


def _dcp_variants(req: PredictRequest, pred: Prediction) -> list[Knob]:
    """DCP off when the request has it; the largest DCP the layout allows where the engine has
    it and the KV cache is replicated over TP ranks (MLA's latent cache on every rank; GQA
    with TP above the KV heads), at long context (engines.yaml ``what_if_min_context``)."""
    if req.dcp > 1:
        return [_knob("DCP off (KV replicated over the TP ranks again)", dcp=1)]
    rule = engines_table()[req.engine].decode_context_parallel if req.tp > 1 else None
    if rule is None or req.context < rule.what_if_min_context:
        return []
    n = max_dcp(req.engine, req.tp, load_spec(req.model, req.weight_format))
    if n <= 1:
        return []
    return [
        _knob(
            f"DCP={n} (decode context parallel: KV sharded over {n} TP ranks)",
            f"3 NCCL collectives more per attention layer; KV capacity x {n}",
            dcp=n,
        )
    ]


def _variants(req: PredictRequest, pred: Prediction) -> list[Knob]:
    out: list[Knob] = []
    gpu = load_gpu(req.gpu_name())
    link = load_link(pred.hardware.link or "")
    impl = pred.deployment.allreduce_impl
    if req.tp > 1:
        if impl == "nccl" and link.oneshot is not None:
            out.append(_knob("one-shot custom allreduce instead of NCCL", allreduce="oneshot"))
        if impl == "oneshot":
            out.append(_knob("NCCL allreduce instead of one-shot", allreduce="nccl"))
        twin = _p2p_twin(link.name)
        if twin:
            label = "P2P off" if link.p2p else "P2P on"
            out.append(_knob(f"{label} ({twin})", link=twin))
        if link.kind != "nvlink":
            nv = gpu.nvlink or "nvlink4"
            note = "" if gpu.nvlink else f"hypothetical: {gpu.name} has no NVLink"
            out.append(_knob(f"NVLink ({nv}) instead of {link.name}", note, link=nv))
    graphs = "CUDA graphs off" if req.cuda_graphs else "CUDA graphs on"
    out.append(_knob(graphs, cuda_graphs=not req.cuda_graphs))
    is_moe = pred.model.experts > 0
    if is_moe and req.tp > 1 and req.ep == 1:
        out.append(_knob(f"EP={req.tp} for experts (instead of TP-sharded experts)", ep=req.tp))
    if is_moe and req.ep > 1:
        out.append(_knob("TP-sharded experts (EP=1)", ep=1))
    out += _format_variants(req, pred)
    if req.kv_dtype in ("auto", "bf16", "fp16"):
        out.append(_knob("KV cache fp8", kv_dtype="fp8"))
    out += _dcp_variants(req, pred)
    if req.tp >= 2:
        fewer = req.tp // 2
        out.append(
            _knob(
                f"fewer GPUs: TP={fewer}",
                tp=fewer,
                gpus=None,
                ep=min(req.ep, fewer),
                dcp=gcd(req.dcp, fewer),
            )
        )
    if req.tp <= 4 and req.pp == 1:
        more = req.tp * 2
        out.append(_knob(f"more GPUs: TP={more}", tp=more, gpus=None))
    out += _spec_variants(req)
    if req.engine != "generic":
        for eng in ("vllm", "sglang", "trtllm"):
            if eng != req.engine:
                note = "engine rules only (host overhead, allreduce rule)"
                if req.dcp > 1 and engines_table()[eng].decode_context_parallel is None:
                    out.append(
                        _knob(
                            f"engine {eng}",
                            f"{note}; {eng} has no DCP: without it",
                            engine=eng,
                            dcp=1,
                        )
                    )
                else:
                    out.append(_knob(f"engine {eng}", note, engine=eng))
    return out


def _moved(base: dict[str, float], new: dict[str, float]) -> str:
    """'collectives 3.09 -> 1.31 ms': the component this change moves the most."""
    names = set(base) | set(new)
    name = max(names, key=lambda n: abs(new.get(n, 0.0) - base.get(n, 0.0)))
    a, b = base.get(name, 0.0), new.get(name, 0.0)
    return f"{name} {a:.2f} -> {b:.2f} ms" if abs(b - a) >= 0.005 else ""


def what_ifs(req: PredictRequest, pred: Prediction) -> list[WhatIf]:
    """Every one-knob variant, ranked by predicted tok/s (ones that cannot run or fit last)."""
    base = pred.decode_tok_s_per_stream
    rows: list[WhatIf] = []
    for knob in _variants(req, pred):
        change, note = knob.change, knob.note
        p, why = variant(knob.patch.apply(req))
        if p is None:
            note = (note + "; " if note else "") + f"cannot run: {why}"
            rows.append(
                WhatIf(
                    change=change,
                    decode_tok_s_per_stream=0.0,
                    delta_pct=-100.0,
                    decode_ms_per_token=0.0,
                    fits_in_memory=False,
                    note=note,
                )
            )
            continue
        if not p.fits_in_memory:
            note = (note + "; " if note else "") + "KV for this batch x context does not fit"
        iv = p.expected.interval if p.expected is not None else None
        rows.append(
            WhatIf(
                change=change,
                decode_tok_s_per_stream=p.decode_tok_s_per_stream,
                tok_s_low=iv.tok_s_low if iv else None,
                tok_s_high=iv.tok_s_high if iv else None,
                delta_pct=round((p.decode_tok_s_per_stream / base - 1) * 100, 1),
                decode_ms_per_token=p.decode_ms_per_token,
                fits_in_memory=p.fits_in_memory,
                bound_tok_s_per_stream=p.bound.decode_tok_s_per_stream if p.bound else 0.0,
                moved=_moved(pred.components_ms, p.components_ms),
                note=note,
            )
        )
    rows.sort(key=lambda w: (not w.fits_in_memory, -w.decode_tok_s_per_stream))
    return rows
