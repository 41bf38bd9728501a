"""config.json -> ModelSpec: one module per model family, plugged into one builder.

A family (``Family`` in base.py) names its architectures and says what differs about its
layers: which attention block each layer uses and how its expert modules are named. The builder
here reads what every family shares (``ArchConfig``), walks the layers (norms, the attention
block of the layer's kind, a dense MLP or the MoE block), adds the embedding, the final norm
and lm_head, and assigns every module its storage format from the quantization config.

A new family is a new module with a ``Family`` subclass (and its attention block, if new),
listed in ``FAMILIES`` (and its block in ``ATTENTION``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ceiling.errors import CeilingError
from ceiling.spec.checks import check_config_values
from ceiling.spec.families.base import (
    ArchConfig,
    Builder,
    Family,
    dense_mlp,
    get,
    gqa_attention,
    moe_mlp,
)
from ceiling.spec.families.deepseek import MlaMoeFamily, mla_attention, read_mla
from ceiling.spec.families.llama import DenseFamily
from ceiling.spec.families.moe import GqaMoeFamily
from ceiling.spec.families.qwen_next import HybridMoeFamily, linear_attention
from ceiling.spec.modelspec import ModelSpec, assign_formats
from ceiling.spec.quant import parse_quant

FAMILIES: tuple[Family, ...] = (DenseFamily(), MlaMoeFamily(), GqaMoeFamily(), HybridMoeFamily())
#: multimodal wrappers: the language model is the config's ``text_config`` (its own family)
WRAPPERS = ("KimiK25ForConditionalGeneration",)
#: attention block per layer kind
ATTENTION: dict[str, Callable[[Builder, ArchConfig, int, str], None]] = {
    "full": gqa_attention,
    "sliding": gqa_attention,
    "mla": mla_attention,
    "linear": linear_attention,
}

_BY_ARCH = {arch: fam for fam in FAMILIES for arch in fam.architectures}
#: architecture -> family label (``wrapper`` for WRAPPERS): every architecture we can read
KNOWN_ARCHITECTURES = {
    **{arch: fam.name for arch, fam in _BY_ARCH.items()},
    **dict.fromkeys(WRAPPERS, "wrapper"),
}


def _unknown(arch: str, field: str) -> CeilingError:
    return CeilingError(
        f"unknown architecture '{arch}' (field {field})",
        fix="supported: " + ", ".join(sorted(KNOWN_ARCHITECTURES)),
    )


def _family(raw: dict[str, Any], arch: str) -> tuple[Family, dict[str, Any], list[str]]:
    """The family, the language model's config and the notes about reading it."""
    if arch not in KNOWN_ARCHITECTURES:
        raise _unknown(arch, "architectures")
    text = raw.get("text_config")
    if not isinstance(text, dict):
        if arch in WRAPPERS:
            raise CeilingError(f"{arch} config has no text_config", fix="pass the full config.json")
        return _BY_ARCH[arch], raw, []
    notes = ["language model read from text_config; vision tower not counted"]
    if arch not in WRAPPERS:
        return _BY_ARCH[arch], text, notes
    inner = (text.get("architectures") or [arch])[0]
    if inner not in KNOWN_ARCHITECTURES:
        raise _unknown(inner, "text_config.architectures")
    if inner in WRAPPERS:
        raise CeilingError(f"{arch} config has no text_config", fix="pass the full config.json")
    return _BY_ARCH[inner], text, notes


def build_model(
    raw: dict[str, Any],
    name: str = "model",
    source: str = "",
    hf_quant: dict[str, Any] | None = None,
) -> ModelSpec:
    """Parse a config dict into a ModelSpec (nested ``text_config`` included)."""
    archs = raw.get("architectures") or []
    if not archs:
        raise CeilingError(
            "config has no 'architectures' field", fix="pass a Hugging Face config.json"
        )
    arch = archs[0]
    family, cfg, notes = _family(raw, arch)
    qc = cfg.get("quantization_config") or raw.get("quantization_config")
    dtype = str(
        get(cfg, "torch_dtype", "dtype", default=None)
        or get(raw, "torch_dtype", "dtype", default="bfloat16")
    )
    quant = parse_quant(qc, dtype, hf_quant)
    if isinstance(raw.get("_ceiling_note"), str):
        notes.append(raw["_ceiling_note"])
    where = f"{name}: {arch}"
    check_config_values(cfg, where)
    c = ArchConfig.read(arch, cfg, where)
    c.mla = read_mla(cfg, where)
    names = family.names_for(arch)

    b = Builder()
    for i in range(c.n_layers):
        pre = f"model.layers.{i}"
        b.add(f"{pre}.input_layernorm", "norm", c.hidden, 1, i, "replicate", linear=False)
        b.add(f"{pre}.post_attention_layernorm", "norm", c.hidden, 1, i, "replicate", linear=False)
        kind = family.attention_kind(c, i)
        ATTENTION[kind](b, c, i, kind)
        if c.is_moe(i):
            moe_mlp(b, c, i, names)
        else:
            dense_mlp(b, c, i)
    b.add("model.embed_tokens", "embed", c.vocab, c.hidden, None, "tp", linear=False)
    b.add("model.norm", "norm", c.hidden, 1, None, "replicate", linear=False)
    # A tied lm_head shares the embedding's memory but is still read in full every step.
    # lm_head stays in the model dtype: engines load it as an unquantized ParallelLMHead.
    b.add("lm_head", "lm_head", c.vocab, c.hidden, None, "tp", linear=False)
    tied = bool(get(cfg, "tie_word_embeddings", default=raw.get("tie_word_embeddings", False)))
    if tied:
        notes.append("tie_word_embeddings: lm_head shares memory with the embedding")
    assign_formats(b.modules, quant)
    if tied:
        for mod in b.modules:
            if mod.kind == "embed":
                mod.nbytes = 0
    kinds = {layer.attention for layer in b.layers}
    attention = "mla" if c.mla else ("hybrid" if "linear" in kinds else "gqa")
    return ModelSpec(
        name=name,
        source=source,
        architecture=arch,
        family=family.name,
        hidden=c.hidden,
        num_layers=c.n_layers,
        vocab=c.vocab,
        heads=c.heads,
        kv_heads=c.kv_heads,
        head_dim=c.head_dim,
        attention=attention,
        dtype=dtype,
        quant=quant,
        modules=b.modules,
        layers=b.layers,
        n_experts=c.n_experts,
        top_k=c.top_k,
        n_shared=c.n_shared,
        moe_intermediate=c.moe_inter,
        mla=c.mla,
        notes=notes,
        tied_embeddings=tied,
    )
