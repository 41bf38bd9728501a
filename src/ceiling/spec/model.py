"""ModelSpec: what the decode step has to read, built from a Hugging Face ``config.json``.

A model is a list of weight modules (one per kind per layer, experts counted once with a
multiplicity), each with its shape, its storage format (from the quantization config) and how
tensor parallelism shards it, plus the per-token KV-cache geometry of every layer. That is all
``predict`` needs; nothing here knows about hardware.

Accepted inputs: a short catalog name (``kimi-k2.5``), a path to a ``config.json`` file, or a
model directory holding ``config.json`` (and optionally ModelOpt's ``hf_quant_config.json``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from ceiling.errors import CeilingError
from ceiling.spec.checks import check_config_values
from ceiling.spec.quant import QuantScheme, WeightFormat, override_scheme, parse_quant

# Architectures whose layer structure this module knows (field `architectures`).
KNOWN_ARCHITECTURES = {
    "LlamaForCausalLM": "dense",
    "MistralForCausalLM": "dense",
    "Qwen2ForCausalLM": "dense",
    "Qwen3ForCausalLM": "dense",
    "DeepseekV3ForCausalLM": "mla_moe",
    "DeepseekV2ForCausalLM": "mla_moe",
    "GlmMoeDsaForCausalLM": "mla_moe",
    "Qwen3MoeForCausalLM": "gqa_moe",
    "Qwen2MoeForCausalLM": "gqa_moe",
    "Glm4MoeForCausalLM": "gqa_moe",
    "MiniMaxM2ForCausalLM": "gqa_moe",
    "GptOssForCausalLM": "gqa_moe",
    "Qwen3NextForCausalLM": "hybrid_moe",
    "Qwen3_5MoeForCausalLM": "hybrid_moe",
    "Qwen3_5MoeForConditionalGeneration": "hybrid_moe",
    "KimiK25ForConditionalGeneration": "wrapper",
}


@dataclass
class Module:
    """One weight matrix kind in one layer (``count`` identical copies, e.g. routed experts).

    kind: attn | attn_replicated | mlp | expert | shared | router | linear_attn | lm_head | embed | norm
    ``shard``: "tp" (split across tensor-parallel ranks), "replicate" (full copy on every rank),
    "ep" (experts: split across EP ranks, or across TP ranks when EP=1).
    """

    name: str
    kind: str
    rows: int
    cols: int
    count: int
    layer: int | None
    shard: str
    linear: bool
    fmt: WeightFormat = field(default=None)  # type: ignore[assignment]
    nbytes: int = 0  # all copies, scales included

    @property
    def params(self) -> int:
        return self.rows * self.cols * self.count


@dataclass
class LayerSpec:
    """Per-layer facts used for KV cache, kernels and collectives."""

    index: int
    attention: str  # full | sliding | linear | mla
    mlp: str  # dense | moe
    kv_bytes_per_token: int  # at 1 byte/element; multiply by the KV dtype's bytes
    kv_heads: int  # KV heads of this layer (MLA: 1 latent head, replicated under TP)
    window: int | None = None  # sliding window tokens
    state_bytes: int = 0  # recurrent state per sequence (linear attention), bytes


@dataclass
class ModelSpec:
    """The model as ``predict`` sees it."""

    name: str
    source: str
    architecture: str
    family: str
    hidden: int
    num_layers: int
    vocab: int
    heads: int
    kv_heads: int
    head_dim: int
    attention: str  # gqa | mla | hybrid
    dtype: str
    quant: QuantScheme
    modules: list[Module]
    layers: list[LayerSpec]
    n_experts: int = 0
    top_k: int = 0
    n_shared: int = 0
    moe_intermediate: int = 0
    mla: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    # ---------------------------------------------------------------- derived totals
    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    @property
    def moe_layers(self) -> int:
        return sum(1 for layer in self.layers if layer.mlp == "moe")

    def total_params(self) -> int:
        return sum(m.params for m in self.modules)

    def active_params(self) -> int:
        """Parameters touched per token (top-k routed experts, not all of them; no embedding)."""
        cached = self.__dict__.get("_active")
        if cached is None:
            cached = self.__dict__["_active"] = self._active_params()
        return cached

    def _active_params(self) -> int:
        total = 0
        for m in self.modules:
            if m.kind == "embed":
                continue
            if m.kind == "expert":
                total += m.rows * m.cols * self.top_k
            else:
                total += m.params
        return total

    def weight_bytes(self) -> int:
        return sum(m.nbytes for m in self.modules)

    def bytes_by_kind(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for m in self.modules:
            out[m.kind] = out.get(m.kind, 0) + m.nbytes
        return out

    def kv_bytes_per_token(self, kv_elem_bytes: float) -> float:
        """KV bytes one token adds across all layers (full-attention layers; unsharded)."""
        return sum(layer.kv_bytes_per_token for layer in self.layers) * kv_elem_bytes

    def formats(self) -> dict[str, int]:
        """Weight bytes per storage format (for the assumptions list)."""
        out: dict[str, int] = {}
        for m in self.modules:
            out[m.fmt.name] = out.get(m.fmt.name, 0) + m.nbytes
        return out

    def with_weight_format(self, fmt: WeightFormat | None) -> ModelSpec:
        """The same model with every linear layer (except lm_head/routers) stored in ``fmt``."""
        if fmt is None:
            return self
        scheme = override_scheme(fmt, self.dtype)
        modules = [
            Module(m.name, m.kind, m.rows, m.cols, m.count, m.layer, m.shard, m.linear)
            for m in self.modules
        ]
        _assign_formats(modules, scheme)
        import dataclasses

        return dataclasses.replace(self, quant=scheme, modules=modules)


# ----------------------------------------------------------------------------- loading


def _data_dir() -> Path:
    return Path(str(resources.files("ceiling") / "data" / "models"))


@cache
def catalog() -> dict[str, Path]:
    """Short name -> config path of the reference models shipped with the package."""
    out: dict[str, Path] = {}
    for p in sorted(_data_dir().iterdir()):
        if p.suffix == ".json":
            out[p.stem] = p
        elif p.is_dir() and (p / "config.json").is_file():
            out[p.name] = p / "config.json"
    return out


def list_models() -> list[dict[str, str]]:
    """Catalog entries with the Hugging Face id they come from."""
    rows = []
    for name, path in catalog().items():
        raw = json.loads(path.read_text())
        prov = raw.get("_provenance")
        hf = raw.get("_hf_model") or (prov.get("hf_model", "") if isinstance(prov, dict) else "")
        rows.append(
            {"name": name, "hf_model": hf, "architecture": (raw.get("architectures") or ["?"])[0]}
        )
    return rows


_FULL_CONFIG = "pass the model's complete Hugging Face config.json"


def _read_json(p: Path) -> dict[str, Any]:
    from ceiling.inputs import read_json

    data = read_json(p, "model config", fix="pass a Hugging Face config.json")
    if not isinstance(data, dict):
        raise CeilingError(
            f"model config {p} holds a JSON {type(data).__name__}, not an object",
            fix="pass a Hugging Face config.json",
        )
    return data


def load_model(name_or_path: str, weight_format: WeightFormat | None = None) -> ModelSpec:
    """ModelSpec from a catalog name, a ``config.json`` path, or a model directory."""
    cat = catalog()
    hf_quant = None
    if name_or_path in cat:
        cfg_path = cat[name_or_path]
        name = name_or_path
    else:
        p = Path(name_or_path).expanduser()
        if p.is_dir():
            cfg_path = p / "config.json"
            if not cfg_path.is_file():
                raise CeilingError(
                    f"no config.json in directory {p}", fix="point --model at a HF model directory"
                )
        elif p.is_file():
            cfg_path = p
        else:
            raise CeilingError(
                f"unknown model '{name_or_path}': not a catalog name, file or directory",
                fix="see `ceiling predict --list-models`, or pass a path to a config.json",
            )
        name = p.name if p.is_dir() else p.stem
    hq = cfg_path.parent / "hf_quant_config.json"
    if hq.is_file():
        hf_quant = _read_json(hq)
    raw = _read_json(cfg_path)
    try:
        spec = build_model(raw, name=name, source=str(cfg_path), hf_quant=hf_quant)
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, ZeroDivisionError) as exc:
        # a value of the wrong shape the explicit checks (spec/checks.py) did not name
        raise CeilingError(
            f"model config {cfg_path} is malformed: {type(exc).__name__}: {exc}",
            fix="pass an unmodified Hugging Face config.json",
        ) from None
    return spec.with_weight_format(weight_format)


# ----------------------------------------------------------------------------- building


def _get(cfg: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    return default


def _require(cfg: dict[str, Any], key: str, where: str) -> Any:
    if cfg.get(key) is None:
        raise CeilingError(
            f"config field '{key}' is missing ({where})", fix="pass a complete HF config.json"
        )
    return cfg[key]


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
    if arch not in KNOWN_ARCHITECTURES:
        raise CeilingError(
            f"unknown architecture '{arch}' (field architectures)",
            fix="supported: " + ", ".join(sorted(KNOWN_ARCHITECTURES)),
        )
    cfg = raw
    notes: list[str] = []
    if isinstance(raw.get("text_config"), dict):
        cfg = raw["text_config"]
        inner = (cfg.get("architectures") or [arch])[0]
        if KNOWN_ARCHITECTURES.get(arch) == "wrapper":
            if inner not in KNOWN_ARCHITECTURES:
                raise CeilingError(
                    f"unknown architecture '{inner}' (field text_config.architectures)",
                    fix="supported: " + ", ".join(sorted(KNOWN_ARCHITECTURES)),
                )
            arch_family = KNOWN_ARCHITECTURES[inner]
        else:
            arch_family = KNOWN_ARCHITECTURES[arch]
        notes.append("language model read from text_config; vision tower not counted")
    else:
        arch_family = KNOWN_ARCHITECTURES[arch]
    if arch_family == "wrapper":
        raise CeilingError(f"{arch} config has no text_config", fix="pass the full config.json")

    qc = cfg.get("quantization_config") or raw.get("quantization_config")
    dtype = str(
        _get(cfg, "torch_dtype", "dtype", default=None)
        or _get(raw, "torch_dtype", "dtype", default="bfloat16")
    )
    quant = parse_quant(qc, dtype, hf_quant)
    if isinstance(raw.get("_ceiling_note"), str):
        notes.append(raw["_ceiling_note"])

    where = f"{name}: {arch}"
    check_config_values(cfg, where)
    hidden = int(_require(cfg, "hidden_size", where))
    n_layers = int(_require(cfg, "num_hidden_layers", where))
    vocab = int(_require(cfg, "vocab_size", where))
    heads = int(_require(cfg, "num_attention_heads", where))
    kv_heads = int(_get(cfg, "num_key_value_heads", default=heads))
    head_dim = int(_get(cfg, "head_dim", default=hidden // heads))
    inter = int(_get(cfg, "intermediate_size", default=0))

    n_experts = int(
        _get(cfg, "n_routed_experts", "num_experts", "num_local_experts", default=0) or 0
    )
    top_k = int(_get(cfg, "num_experts_per_tok", "experts_per_token", "moe_topk", default=0) or 0)
    if n_experts and not top_k:
        raise CeilingError(
            f"MoE config without top-k (field num_experts_per_tok) in {where}", fix=_FULL_CONFIG
        )
    moe_inter = int(_get(cfg, "moe_intermediate_size", default=0) or 0)
    if n_experts and not moe_inter:
        moe_inter = inter  # MiniMax-M2 and gpt-oss name the expert width intermediate_size
    n_shared = int(_get(cfg, "n_shared_experts", default=0) or 0)
    shared_inter = n_shared * moe_inter
    if cfg.get("shared_expert_intermediate_size"):
        shared_inter = int(cfg["shared_expert_intermediate_size"])
        n_shared = 1
    if cfg.get("shared_intermediate_size"):
        shared_inter = int(cfg["shared_intermediate_size"])
        n_shared = 1

    # Which layers are MoE.
    first_dense = int(_get(cfg, "first_k_dense_replace", default=0) or 0)
    freq = int(_get(cfg, "moe_layer_freq", default=1) or 1)
    sparse_step = int(_get(cfg, "decoder_sparse_step", default=1) or 1)
    mlp_only = set(cfg.get("mlp_only_layers") or [])

    def is_moe(i: int) -> bool:
        if not n_experts:
            return False
        if i < first_dense or i in mlp_only:
            return False
        if freq > 1 and (i - first_dense) % freq != 0:
            return False
        return not (sparse_step > 1 and (i + 1) % sparse_step != 0)

    # Attention kind per layer.
    is_mla = cfg.get("kv_lora_rank") is not None
    layer_types = cfg.get("layer_types")
    interval = cfg.get("full_attention_interval")
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window", True) else None

    def attn_kind(i: int) -> str:
        if is_mla:
            return "mla"
        if layer_types:
            t = layer_types[i]
            return {"linear_attention": "linear", "sliding_attention": "sliding"}.get(t, "full")
        if arch_family == "hybrid_moe" and interval:
            return "full" if (i + 1) % int(interval) == 0 else "linear"
        return "full"

    family = arch_family
    moe_prefix, expert_names, shared_prefix = (
        "mlp",
        ("gate_proj", "up_proj", "down_proj"),
        "mlp.shared_experts",
    )
    if arch == "MiniMaxM2ForCausalLM":
        moe_prefix, expert_names = "block_sparse_moe", ("w1", "w3", "w2")
    if arch_family == "hybrid_moe" or arch == "Qwen2MoeForCausalLM":
        shared_prefix = "mlp.shared_expert"
    gpt_oss = arch == "GptOssForCausalLM"

    modules: list[Module] = []
    layers: list[LayerSpec] = []

    def add(
        name: str,
        kind: str,
        rows: int,
        cols: int,
        layer: int | None,
        shard: str,
        count: int = 1,
        linear: bool = True,
    ) -> None:
        modules.append(Module(name, kind, rows, cols, count, layer, shard, linear))

    mla: dict[str, int] = {}
    if is_mla:
        q_lora = cfg.get("q_lora_rank")
        kv_lora = int(cfg["kv_lora_rank"])
        nope = int(_require(cfg, "qk_nope_head_dim", where))
        rope = int(_require(cfg, "qk_rope_head_dim", where))
        v_dim = int(_get(cfg, "v_head_dim", default=nope))
        mla = {
            "q_lora_rank": int(q_lora or 0),
            "kv_lora_rank": kv_lora,
            "qk_nope_head_dim": nope,
            "qk_rope_head_dim": rope,
            "v_head_dim": v_dim,
        }
    index_heads = int(cfg.get("index_n_heads") or 0)
    index_dim = int(cfg.get("index_head_dim") or 0)

    lin_k_heads = int(cfg.get("linear_num_key_heads") or 0)
    lin_v_heads = int(cfg.get("linear_num_value_heads") or 0)
    lin_k_dim = int(cfg.get("linear_key_head_dim") or 0)
    lin_v_dim = int(cfg.get("linear_value_head_dim") or 0)
    conv_k = int(cfg.get("linear_conv_kernel_dim") or 4)
    out_gate = bool(cfg.get("attn_output_gate"))

    for i in range(n_layers):
        pre = f"model.layers.{i}"
        kind = attn_kind(i)
        add(f"{pre}.input_layernorm", "norm", hidden, 1, i, "replicate", linear=False)
        add(f"{pre}.post_attention_layernorm", "norm", hidden, 1, i, "replicate", linear=False)
        if kind == "mla":
            a = f"{pre}.self_attn"
            qk_dim = mla["qk_nope_head_dim"] + mla["qk_rope_head_dim"]
            if mla["q_lora_rank"]:
                add(f"{a}.q_a_proj", "attn_replicated", mla["q_lora_rank"], hidden, i, "replicate")
                add(f"{a}.q_b_proj", "attn", heads * qk_dim, mla["q_lora_rank"], i, "tp")
            else:
                add(f"{a}.q_proj", "attn", heads * qk_dim, hidden, i, "tp")
            add(
                f"{a}.kv_a_proj_with_mqa",
                "attn_replicated",
                mla["kv_lora_rank"] + mla["qk_rope_head_dim"],
                hidden,
                i,
                "replicate",
            )
            add(
                f"{a}.kv_b_proj",
                "attn",
                heads * (mla["qk_nope_head_dim"] + mla["v_head_dim"]),
                mla["kv_lora_rank"],
                i,
                "tp",
            )
            add(f"{a}.o_proj", "attn", hidden, heads * mla["v_head_dim"], i, "tp")
            kv_per_tok = mla["kv_lora_rank"] + mla["qk_rope_head_dim"]
            if index_heads:  # DeepSeek-style sparse attention indexer (GLM-5): small, replicated
                q_in = mla["q_lora_rank"] or hidden
                add(
                    f"{a}.indexer.wq_b",
                    "attn_replicated",
                    index_heads * index_dim,
                    q_in,
                    i,
                    "replicate",
                )
                add(f"{a}.indexer.wk", "attn_replicated", index_dim, hidden, i, "replicate")
                add(
                    f"{a}.indexer.weights_proj",
                    "attn_replicated",
                    index_heads,
                    hidden,
                    i,
                    "replicate",
                )
                kv_per_tok += index_dim  # indexer key cache (fp8 in vLLM; counted at KV dtype)
            layers.append(LayerSpec(i, "mla", "moe" if is_moe(i) else "dense", kv_per_tok, 1))
        elif kind == "linear":
            a = f"{pre}.linear_attn"
            key_dim, val_dim = lin_k_heads * lin_k_dim, lin_v_heads * lin_v_dim
            if arch.startswith("Qwen3_5"):
                # Qwen3.5/3.6 checkpoints store the input projection split, and quantize the
                # parts apart (nvidia's NVFP4 checkpoint: qkv and z in FP8, b and a in BF16)
                add(f"{a}.in_proj_qkv", "linear_attn", 2 * key_dim + val_dim, hidden, i, "tp")
                add(f"{a}.in_proj_z", "linear_attn", val_dim, hidden, i, "tp")
                add(f"{a}.in_proj_b", "linear_attn", lin_v_heads, hidden, i, "tp")
                add(f"{a}.in_proj_a", "linear_attn", lin_v_heads, hidden, i, "tp")
            else:  # Qwen3-Next: fused qkvz and ba
                add(f"{a}.in_proj_qkvz", "linear_attn", 2 * key_dim + 2 * val_dim, hidden, i, "tp")
                add(f"{a}.in_proj_ba", "linear_attn", 2 * lin_v_heads, hidden, i, "tp")
            add(f"{a}.conv1d", "linear_attn", 2 * key_dim + val_dim, conv_k, i, "tp", linear=False)
            add(f"{a}.out_proj", "linear_attn", hidden, val_dim, i, "tp")
            ssm_bytes = 4 if str(cfg.get("mamba_ssm_dtype", "float32")) == "float32" else 2
            state = (
                lin_v_heads * lin_k_dim * lin_v_dim * ssm_bytes
                + (2 * key_dim + val_dim) * (conv_k - 1) * 2
            )
            layers.append(
                LayerSpec(i, "linear", "moe" if is_moe(i) else "dense", 0, 0, state_bytes=state)
            )
        else:
            a = f"{pre}.self_attn"
            q_rows = heads * head_dim * (2 if out_gate else 1)
            add(f"{a}.q_proj", "attn", q_rows, hidden, i, "tp")
            add(f"{a}.k_proj", "attn", kv_heads * head_dim, hidden, i, "tp")
            add(f"{a}.v_proj", "attn", kv_heads * head_dim, hidden, i, "tp")
            add(f"{a}.o_proj", "attn", hidden, heads * head_dim, i, "tp")
            win = int(window) if kind == "sliding" and window else None
            layers.append(
                LayerSpec(
                    i,
                    kind,
                    "moe" if is_moe(i) else "dense",
                    2 * kv_heads * head_dim,
                    kv_heads,
                    window=win,
                )
            )
        if is_moe(i):
            m = f"{pre}.{moe_prefix}"
            router = "mlp.router" if gpt_oss else f"{moe_prefix}.gate"
            add(f"{pre}.{router}", "router", n_experts, hidden, i, "replicate", linear=False)
            if gpt_oss:
                add(
                    f"{m}.experts.gate_up_proj",
                    "expert",
                    2 * moe_inter,
                    hidden,
                    i,
                    "ep",
                    count=n_experts,
                )
                add(f"{m}.experts.down_proj", "expert", hidden, moe_inter, i, "ep", count=n_experts)
            else:
                g, u, d = expert_names
                add(f"{m}.experts.0.{g}", "expert", moe_inter, hidden, i, "ep", count=n_experts)
                add(f"{m}.experts.0.{u}", "expert", moe_inter, hidden, i, "ep", count=n_experts)
                add(f"{m}.experts.0.{d}", "expert", hidden, moe_inter, i, "ep", count=n_experts)
            if shared_inter:
                s = f"{pre}.{shared_prefix}"
                add(f"{s}.gate_proj", "shared", shared_inter, hidden, i, "tp")
                add(f"{s}.up_proj", "shared", shared_inter, hidden, i, "tp")
                add(f"{s}.down_proj", "shared", hidden, shared_inter, i, "tp")
                if shared_prefix == "mlp.shared_expert":
                    add(
                        f"{pre}.mlp.shared_expert_gate",
                        "router",
                        1,
                        hidden,
                        i,
                        "replicate",
                        linear=False,
                    )
        else:
            if not inter:
                raise CeilingError(
                    f"dense layer {i} without intermediate_size in {where}", fix=_FULL_CONFIG
                )
            add(f"{pre}.mlp.gate_proj", "mlp", inter, hidden, i, "tp")
            add(f"{pre}.mlp.up_proj", "mlp", inter, hidden, i, "tp")
            add(f"{pre}.mlp.down_proj", "mlp", hidden, inter, i, "tp")

    add("model.embed_tokens", "embed", vocab, hidden, None, "tp", linear=False)
    add("model.norm", "norm", hidden, 1, None, "replicate", linear=False)
    tied = bool(_get(cfg, "tie_word_embeddings", default=raw.get("tie_word_embeddings", False)))
    # A tied lm_head shares the embedding's memory but is still read in full every step.
    # lm_head stays in the model dtype: engines load it as an unquantized ParallelLMHead.
    add("lm_head", "lm_head", vocab, hidden, None, "tp", linear=False)
    if tied:
        notes.append("tie_word_embeddings: lm_head shares memory with the embedding")

    _assign_formats(modules, quant)
    if tied:
        for mod in modules:
            if mod.kind == "embed":
                mod.nbytes = 0

    attention = (
        "mla"
        if is_mla
        else ("hybrid" if any(layer.attention == "linear" for layer in layers) else "gqa")
    )
    return ModelSpec(
        name=name,
        source=source,
        architecture=arch,
        family=family,
        hidden=hidden,
        num_layers=n_layers,
        vocab=vocab,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        attention=attention,
        dtype=dtype,
        quant=quant,
        modules=modules,
        layers=layers,
        n_experts=n_experts,
        top_k=top_k,
        n_shared=n_shared,
        moe_intermediate=moe_inter,
        mla=mla,
        notes=notes,
    )


def _assign_formats(modules: list[Module], quant: QuantScheme) -> None:
    for m in modules:
        m.fmt = quant.format_for(m.name, m.kind, m.linear)
        m.nbytes = m.fmt.nbytes(m.rows, m.cols) * m.count
