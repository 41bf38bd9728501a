"""What engines would refuse, refused here first: malformed config values, impossible layouts.

A config.json with ``"hidden_size": -4096`` or ``"num_attention_heads": "big"`` must be an error
that names the field, not a negative millisecond figure or a ``ValueError`` traceback; a tensor-
parallel size the model's heads do not divide must be refused as the engines refuse it, not
predicted. The rules are vLLM's (``ModelConfig.verify_with_parallel_config`` and
``QKVParallelLinear``, 0.32; SGLang applies the same): the attention heads must divide by TP,
and the KV heads must divide by TP or TP by the KV heads (then each is replicated).
"""

from __future__ import annotations

from typing import Any

from ceiling.errors import CeilingError
from ceiling.spec._data import DataModel, load_yaml


class Rule(DataModel):
    """A physical range with the reason for it."""

    min: float | None = None
    max: float
    why: str


class Stack(DataModel):
    library: str
    custom_allreduce: str


class Validity(DataModel):
    """``data/predict/validity.yaml``: defined here, below predict, because the config checks
    read its ``model_max`` too (predict.validate applies the rest)."""

    vendors: dict[str, str]
    engine_vendors: dict[str, list[str]]
    words: dict[str, dict[str, str]]
    collectives: dict[str, Stack]
    request: dict[str, Rule]
    gpu: dict[str, Rule]
    model_max: dict[str, int]


#: config.json fields that are counts or sizes (>= 1 when present and not null)
POSITIVE = (
    "hidden_size",
    "num_hidden_layers",
    "vocab_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "moe_intermediate_size",
    "num_experts_per_tok",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "max_position_embeddings",
    "sliding_window",
    "full_attention_interval",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_conv_kernel_dim",
    "moe_layer_freq",
    "decoder_sparse_step",
)
#: fields that may be 0 (no shared experts, no dense layers first, no q compression, ...).
#: ``shared_expert_intermediate_size``: 0 is "no shared expert" in every architecture that
#: has the field (vLLM's Qwen2-MoE/Qwen3-MoE build the shared expert only when it is > 0);
#: Qwen3-Coder-480B's published config says 0
NON_NEGATIVE = (
    "shared_expert_intermediate_size",
    "shared_intermediate_size",
    "n_routed_experts",
    "num_experts",
    "num_local_experts",
    "n_shared_experts",
    "first_k_dense_replace",
    "q_lora_rank",
    "index_n_heads",
    "index_head_dim",
)


def check_config_values(cfg: dict[str, Any], where: str) -> None:
    """Every count/size field present in ``cfg`` is a whole number in range."""
    for names, low in ((POSITIVE, 1), (NON_NEGATIVE, 0)):
        for key in names:
            value = cfg.get(key)
            if value is None:
                continue
            ok = isinstance(value, int) and not isinstance(value, bool)
            if isinstance(value, float) and value.is_integer():
                ok = True
            if not ok or value < low:
                raise CeilingError(
                    f"config field '{key}' is {value!r} ({where}): it must be a whole number "
                    f">= {low}",
                    fix="pass an unmodified Hugging Face config.json",
                )
    # sizes beyond every published model (data/predict/validity.yaml: the largest published
    # value of each field, with headroom): a typo or a hostile file, never a model
    for key, high in load_yaml("predict/validity.yaml", schema=Validity).model_max.items():
        value = cfg.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > high:
            raise CeilingError(
                f"config field '{key}' is {value!r} ({where}): no published model has more "
                f"than {high}",
                fix="pass an unmodified Hugging Face config.json",
            )
    heads, kv = cfg.get("num_attention_heads"), cfg.get("num_key_value_heads")
    if isinstance(heads, int) and isinstance(kv, int) and kv > heads:
        raise CeilingError(
            f"config has {kv} KV heads but {heads} attention heads ({where}): every KV head "
            "serves one or more attention heads, so there are never more KV heads",
            fix="num_key_value_heads must be <= num_attention_heads (equal for MHA)",
        )
    if isinstance(heads, int) and isinstance(kv, int) and kv and heads % kv:
        # grouped-query attention: each KV head serves heads / kv query heads, a whole number
        # (transformers and the engines reshape by it and fail on the rest)
        raise CeilingError(
            f"config has {heads} attention heads and {kv} KV heads ({where}): {heads} does "
            f"not divide by {kv}, so the query heads cannot be grouped over the KV heads",
            fix="num_attention_heads must be a multiple of num_key_value_heads (e.g. "
            f"{heads} heads with {_kv_divisors(heads, kv)} KV heads)",
        )


def _kv_divisors(heads: int, near: int) -> str:
    """The KV head counts next to ``near`` that divide ``heads`` ("4 or 8")."""
    divisors = [d for d in range(1, heads + 1) if heads % d == 0]
    below = max((d for d in divisors if d < near), default=1)
    above = min((d for d in divisors if d > near), default=heads)
    return f"{below} or {above}"


def parallel_refusal(spec: Any, tp: int, pp: int = 1) -> str | None:
    """Why an engine refuses ``tp`` x ``pp`` for ``spec`` (None: it accepts them)."""
    heads, kv = spec.heads, spec.kv_heads
    if heads % tp:
        return (
            f"{spec.name} has {heads} attention heads: they do not divide by --tp {tp} "
            "(engines refuse it: heads must be divisible by the tensor-parallel size)"
        )
    if spec.attention != "mla" and kv and kv % tp and tp % kv:
        return (
            f"{spec.name} has {kv} KV heads: --tp {tp} neither divides them nor is a multiple "
            "of them (engines refuse it)"
        )
    if pp > spec.num_layers:
        return f"{spec.name} has {spec.num_layers} layers: fewer than --pp {pp} stages"
    return None


def check_parallel(spec: Any, tp: int, pp: int = 1) -> None:
    """CeilingError naming the TP sizes that work when ``tp`` x ``pp`` does not."""
    why = parallel_refusal(spec, tp, pp)
    if why is None:
        return
    if parallel_refusal(spec, tp, 1) is None:
        raise CeilingError(why, fix=f"use --pp {spec.num_layers} or fewer")
    ok = [t for t in (1, 2, 4, 8, 16, 32, 64) if parallel_refusal(spec, t, 1) is None]
    raise CeilingError(why, fix=f"use --tp {' / '.join(map(str, ok))}")
