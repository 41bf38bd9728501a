"""The reference forward pass: the model's own weights, computed on this machine's CPU.

Fed the token ids the server used, it gives log p(token_i | tokens before it) to set against
the server's prompt log-probabilities: a server that loads the right weights but computes
something else (a shard in the wrong order, a wrong kernel, a misread config) disagrees by
whole nats, while the same computation in another precision disagrees by hundredths.

Hand-written on purpose (a dense decoder of the Llama family in ~80 lines of numpy) instead of
loading ``transformers`` or torch: ceiling's environment has neither as a dependency (torch is an
optional extra; importing it takes 2-7 s on a busy 2-core box, against a gate that must take
seconds), numpy is already there, and the math is fixed by the architecture. What it covers:
LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM (q/k/v biases), Qwen3ForCausalLM (q/k
RMSNorm per head); SiLU-gated MLP, RMSNorm, rotary embeddings of the default type (rotate-half,
``rope_theta``), grouped-query attention; unquantized safetensors (F32/F16/BF16), computed in
float32. Anything else is declined with the reason, never guessed. Checked against
``transformers`` (identical log-probabilities on the tiny model) and against vLLM in
tests/engine/test_sanity_vllm.py.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from ceiling.errors import CeilingError
from ceiling.inputs import read_bytes, read_json

ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
)
_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}


class Reference(BaseModel):
    """log p of each token given the ones before it (position 0: None) and the argmax there."""

    logprobs: list[float | None]
    top1_ids: list[int | None]
    weight_bytes: int
    seconds: float


def why_not(model_dir: str | None, max_weight_bytes: int) -> str | None:
    """None when a reference pass can run for ``model_dir``, else the reason it cannot."""
    if not model_dir or not Path(model_dir).is_dir():
        return "no local model directory (pass --model DIR)"
    try:
        cfg = _config(Path(model_dir))
    except CeilingError as err:
        return err.message
    arch = (cfg.get("architectures") or ["?"])[0]
    if arch not in ARCHITECTURES:
        return (
            f"architecture {arch} is not one the reference implements ({', '.join(ARCHITECTURES)})"
        )
    if cfg.get("quantization_config"):
        return "a quantized checkpoint: its weights are not what the reference multiplies"
    if cfg.get("hidden_act", "silu") != "silu":
        return f"hidden_act {cfg.get('hidden_act')} (the reference implements silu)"
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    kind = rope.get("rope_type") or rope.get("type") or "default"
    if kind != "default":
        return f"rope type {kind} (the reference implements the default rotary embedding)"
    files = _weight_files(Path(model_dir))
    if not files:
        return f"no *.safetensors in {model_dir}"
    odd = next((f for f in files if not f.is_file()), None)
    if odd is not None:  # a FIFO or a device would block or never end when read
        return f"{odd} is not a regular file"
    size = sum(f.stat().st_size for f in files)
    if size > max_weight_bytes:
        return f"weights {size / 2**30:.3g} GiB > {max_weight_bytes / 2**30:.3g} GiB (too large to run here)"
    return None


def _weight_files(model_dir: Path) -> list[Path]:
    return sorted(model_dir.glob("*.safetensors"))


def _config(model_dir: Path) -> dict[str, Any]:
    """The model's config.json (read through ``ceiling.inputs``: a regular UTF-8 file)."""
    path = model_dir / "config.json"
    cfg = read_json(path, "config.json", fix="pass --model a model directory")
    if not isinstance(cfg, dict):
        raise CeilingError(f"{path} is not a JSON object", fix="pass a model's config.json")
    return cfg


def _read_safetensors(path: Path, limit: int) -> dict[str, Any]:
    """name -> float32 array. The format is an 8-byte header length, a JSON header and the raw
    little-endian data (read directly: the ``safetensors`` package is not a dependency).
    ``limit``: the most bytes read (the spec's ``max_weight_bytes``)."""
    import numpy as np

    data = read_bytes(path, "weights file", fix="pass --model a model directory", limit=limit)
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    base = 8 + n
    out: dict[str, Any] = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        if meta["dtype"] not in _DTYPES:
            raise CeilingError(
                f"{path.name}: tensor {name} has dtype {meta['dtype']}",
                fix="the reference reads F32/F16/BF16 checkpoints only",
            )
        start, end = meta["data_offsets"]
        raw = data[base + start : base + end]
        if meta["dtype"] == "BF16":  # the top 16 bits of a float32
            arr = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            arr = np.frombuffer(raw, dtype="<f4" if meta["dtype"] == "F32" else "<f2")
        out[name] = arr.astype(np.float32).reshape(meta["shape"])
    return out


def forward(model_dir: str, token_ids: list[int], max_weight_bytes: int = 1 << 30) -> Reference:
    """Run the model over ``token_ids`` once (float32, CPU, no cache)."""
    import time

    import numpy as np

    t0 = time.monotonic()
    root = Path(model_dir)
    cfg = _config(root)
    w: dict[str, Any] = {}
    files = _weight_files(root)
    for f in files:
        w.update(_read_safetensors(f, max_weight_bytes))
    hidden = cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or hidden // heads
    eps = np.float32(cfg.get("rms_norm_eps", 1e-6))
    rope = cfg.get("rope_parameters") or {}
    theta = float(rope.get("rope_theta") or cfg.get("rope_theta") or 10000.0)

    def norm(x: Any, weight: Any) -> Any:
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * weight

    def lin(x: Any, name: str) -> Any:
        y = x @ w[name + ".weight"].T
        bias = w.get(name + ".bias")
        return y + bias if bias is not None else y

    n = len(token_ids)
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    angles = np.outer(np.arange(n, dtype=np.float64), inv_freq)
    emb = np.concatenate([angles, angles], axis=-1)
    cos, sin = np.cos(emb).astype(np.float32), np.sin(emb).astype(np.float32)

    def rotate(x: Any) -> Any:  # (heads, n, head_dim), rotate-half convention
        x1, x2 = x[..., : head_dim // 2], x[..., head_dim // 2 :]
        return x * cos + np.concatenate([-x2, x1], axis=-1) * sin

    def split(x: Any, k: int) -> Any:
        return x.reshape(n, k, head_dim).transpose(1, 0, 2)

    causal = np.triu(np.full((n, n), -np.inf, dtype=np.float32), k=1)
    h = w["model.embed_tokens.weight"][np.asarray(token_ids)]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = norm(h, w[p + "input_layernorm.weight"])
        q = split(lin(x, p + "self_attn.q_proj"), heads)
        k = split(lin(x, p + "self_attn.k_proj"), kv_heads)
        v = split(lin(x, p + "self_attn.v_proj"), kv_heads)
        if p + "self_attn.q_norm.weight" in w:  # Qwen3: RMSNorm over each head first
            q = norm(q, w[p + "self_attn.q_norm.weight"])
            k = norm(k, w[p + "self_attn.k_norm.weight"])
        q, k = rotate(q), rotate(k)
        if kv_heads != heads:
            k = np.repeat(k, heads // kv_heads, axis=0)
            v = np.repeat(v, heads // kv_heads, axis=0)
        scores = q @ k.transpose(0, 2, 1) / np.float32(math.sqrt(head_dim)) + causal
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        a = (scores / scores.sum(-1, keepdims=True)) @ v
        h = h + lin(a.transpose(1, 0, 2).reshape(n, heads * head_dim), p + "self_attn.o_proj")
        x = norm(h, w[p + "post_attention_layernorm.weight"])
        g = lin(x, p + "mlp.gate_proj")
        h = h + lin(g / (1 + np.exp(-g)) * lin(x, p + "mlp.up_proj"), p + "mlp.down_proj")
    head = w.get("lm_head.weight")
    if head is None or cfg.get("tie_word_embeddings"):
        head = w["model.embed_tokens.weight"]
    logits = norm(h, w["model.norm.weight"]) @ head.T
    m = logits.max(-1, keepdims=True)
    logp = logits - m - np.log(np.exp(logits - m).sum(-1, keepdims=True))
    ids = np.asarray(token_ids)
    own = logp[np.arange(n - 1), ids[1:]].astype(float).tolist()
    top = logp[:-1].argmax(-1).tolist()
    return Reference(
        logprobs=[None, *own],
        top1_ids=[None, *top],
        weight_bytes=sum(f.stat().st_size for f in files),
        seconds=round(time.monotonic() - t0, 3),
    )
