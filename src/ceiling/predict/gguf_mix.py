"""A GGUF tensor table without a file: a model config quantized by llama.cpp's own mix rules.

``predict --engine llamacpp`` reads the weight types from a GGUF header (``predict.gguf``). A
user choosing between Q4_K_M and Q6_K has no file yet, so this module writes the header
llama-quantize would: the model's weight matrices under llama.cpp's tensor names and shapes
(ggml order: row length first), each in the type the mix gives its role and layer
(``data/predict/gguf_mixes.yaml``, read from llama-quant.cpp's ``llama_tensor_get_type``). The
result is a :class:`GgufInfo`, the same noun a real header gives, so the step is priced by the
same code (``predict.llamacpp.predict_gguf``) either way. Apart from ``predict.llamacpp`` (near its
size cap) and from the header reader (this writes no file and reads none).
"""

from __future__ import annotations

from functools import cache
from typing import Literal

from pydantic import Field

from ceiling.errors import CeilingError
from ceiling.predict.gguf import GgufInfo, GgufTensor, kernel_data
from ceiling.spec._data import DataModel, load_yaml
from ceiling.spec.model import load_model
from ceiling.spec.modelspec import ModelSpec, Module

Role = Literal[
    "output", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"
]
Condition = Literal[
    "more_bits", "first_eighth", "experts_8", "gqa_4", "model_70b", "no_imatrix", "row_not_in_block"
]


class MixRule(DataModel):
    """One branch of llama_tensor_get_type_impl: tensors of ``roles`` meeting every ``when``."""

    roles: list[Role] = Field(min_length=1)
    when: list[Condition] = Field(default_factory=list)
    type: str


class Mix(DataModel):
    file_type: int  # llama_ftype, written as general.file_type
    default: str
    rules: list[MixRule]


class Model70b(DataModel):
    arch: str
    layers: int
    gqa: bool  # also needs fewer KV heads than heads


class GgufMixesFile(DataModel):
    """Schema of data/predict/gguf_mixes.yaml (a misspelled key fails at load)."""

    schema_version: int
    source: str
    imatrix: bool
    architectures: dict[str, str]
    model_70b: list[Model70b]
    fallback: dict[str, str]
    mixes: dict[str, Mix]


@cache
def mixes() -> GgufMixesFile:
    return load_yaml("predict/gguf_mixes.yaml", schema=GgufMixesFile)


def more_bits(i: int, n: int) -> bool:
    """llama.cpp's use_more_bits(i_layer, n_layers): the first and last eighth, every third
    layer between (the short circuit keeps the C and Python ``%`` of a negative apart)."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


# HF module name suffix -> llama.cpp tensor role (convert_hf_to_gguf's tensor map): the builder's
# names are the checkpoints', the mix rules speak llama.cpp's
_ROLE = {
    "q_proj": "attn_q",
    "k_proj": "attn_k",
    "v_proj": "attn_v",
    "o_proj": "attn_output",
    "gate_proj": "ffn_gate",
    "up_proj": "ffn_up",
    "down_proj": "ffn_down",
    "w1": "ffn_gate",
    "w3": "ffn_up",
    "w2": "ffn_down",
}
_ONE_D = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "shared_expert_gate": "ffn_gate_inp_shexp",
}
_SUFFIX = {"expert": "_exps", "shared": "_shexp", "mlp": "", "attn": ""}


class _Model:
    """The few facts of a model the rules read (llama.cpp's hparams of the file)."""

    def __init__(self, spec: ModelSpec, arch: str) -> None:
        data = mixes()
        self.layers, self.experts = spec.num_layers, spec.n_experts
        gqa = spec.kv_heads < spec.heads
        self.gqa_ratio = spec.heads // max(spec.kv_heads, 1)
        self.is_70b = any(
            m.arch == arch and m.layers == spec.num_layers and (gqa or not m.gqa)
            for m in data.model_70b
        )


def _holds(cond: str, m: _Model, layer: int, row: int, default: str) -> bool:
    block = kernel_data().types[default].block
    return {
        "more_bits": more_bits(layer, m.layers),
        "first_eighth": layer < m.layers // 8,
        "experts_8": m.experts == 8,
        "gqa_4": m.gqa_ratio >= 4,
        "model_70b": m.is_70b,
        "no_imatrix": not mixes().imatrix,
        "row_not_in_block": row % block != 0,
    }[cond]


def tensor_type(mix: Mix, role: str, m: _Model, layer: int, row: int) -> str:
    """The type of one quantizable tensor: the first rule that matches, else the default; a
    type whose block does not divide the row falls back (tensor_type_fallback)."""
    typ = next(
        (
            r.type
            for r in mix.rules
            if role in r.roles and all(_holds(c, m, layer, row, mix.default) for c in r.when)
        ),
        mix.default,
    )
    types = kernel_data().types
    if types[typ].block > 1 and row % types[typ].block:
        typ = mixes().fallback.get(typ, "F16")
        if row % types[typ].block:
            typ = "F16"
    return typ


def mix_error(name: str) -> CeilingError:
    return CeilingError(
        f"--weight-format {name} is not a llama.cpp file type",
        fix="with --engine llamacpp pass one of: "
        + ", ".join(mixes().mixes)
        + " (or --gguf FILE for the exact file)",
    )


def _gguf_name(mod: Module) -> tuple[str, str | None]:
    """(llama.cpp's tensor name, its role for the mix rules; None: never quantized)."""
    if mod.kind == "embed":
        return "token_embd.weight", "token_embd"  # no rule names it unless tied (the caller)
    if mod.kind == "lm_head":
        return "output.weight", "output"
    if mod.kind == "router":  # ffn_gate_inp: kept F32 by the quantizer
        return f"blk.{mod.layer}.ffn_gate_inp.weight", None
    role = _ROLE.get(mod.name.rsplit(".", 1)[-1])
    if role is None or mod.kind not in _SUFFIX:
        raise CeilingError(
            f"no llama.cpp tensor for module {mod.name} ({mod.kind})",
            fix="pass --gguf FILE.gguf: this model's tensors are read from its file",
        )
    return f"blk.{mod.layer}.{role}{_SUFFIX[mod.kind]}.weight", role


def _tensors(mod: Module, spec: ModelSpec, mix: Mix, m: _Model) -> list[GgufTensor]:
    """The GGUF tensor(s) of one module: norms 1-D F32; a tied lm_head none (llama.cpp then
    gives token_embd the output's type); gpt-oss-style fused gate_up experts as two tensors."""
    if mod.kind in ("norm", "shared_gate"):  # 1-D in the file, never quantized
        last = mod.name.rsplit(".", 1)[-1]
        name = (
            f"blk.{mod.layer}.{_ONE_D.get(last, last)}" if mod.layer is not None else "output_norm"
        )
        return [GgufTensor(name=f"{name}.weight", type="F32", shape=[mod.cols * mod.rows])]
    if mod.kind == "lm_head" and spec.tied_embeddings:
        return []
    layer = mod.layer if mod.layer is not None else 0  # output/token_embd: no layer rule
    experts = [mod.count] if mod.kind == "expert" else []
    if mod.name.endswith("gate_up_proj"):
        return [
            GgufTensor(
                name=f"blk.{mod.layer}.ffn_{r}_exps.weight",
                type=tensor_type(mix, f"ffn_{r}", m, layer, mod.cols),
                shape=[mod.cols, mod.rows // 2, *experts],
            )
            for r in ("gate", "up")
        ]
    name, role = _gguf_name(mod)
    if mod.kind == "embed" and spec.tied_embeddings:
        role = "output"  # llama.cpp: no output.weight, so token_embd takes the output's rule
    typ = "F32" if role is None else tensor_type(mix, role, m, layer, mod.cols)
    return [GgufTensor(name=name, type=typ, shape=[mod.cols, mod.rows, *experts])]


def tensor_table(spec: ModelSpec, mix_name: str) -> GgufInfo:
    """The GGUF header llama-quantize ``mix_name`` would write for ``spec`` (no tensor data)."""
    data = mixes()
    mix = data.mixes.get(mix_name.lower())
    if mix is None:
        raise mix_error(mix_name)
    arch = data.architectures.get(spec.architecture)
    if arch is None or spec.attention != "gqa":
        raise CeilingError(
            f"no llama.cpp mix for {spec.name} ({spec.architecture}): its GGUF tensors are "
            "not built here",
            fix="pass --gguf FILE.gguf; mixes are priced for: " + ", ".join(data.architectures),
        )
    m = _Model(spec, arch)
    tensors: list[GgufTensor] = []
    for mod in spec.modules:
        tensors += _tensors(mod, spec, mix, m)
    meta = {
        "general.architecture": arch,
        "general.name": spec.name,
        "general.file_type": mix.file_type,
        f"{arch}.block_count": spec.num_layers,
        f"{arch}.embedding_length": spec.hidden,
        f"{arch}.attention.head_count": spec.heads,
        f"{arch}.attention.head_count_kv": spec.kv_heads,
        f"{arch}.attention.key_length": spec.head_dim,
        f"{arch}.attention.value_length": spec.head_dim,
        f"{arch}.vocab_size": spec.vocab,
    }
    if spec.n_experts:
        meta |= {f"{arch}.expert_count": spec.n_experts, f"{arch}.expert_used_count": spec.top_k}
    path = f"{spec.name}-{mix_name.lower()}.gguf (none: llama.cpp's {mix_name.upper()} mix)"
    return GgufInfo(path=path, arch=arch, metadata=meta, tensors=tensors)


def mix_info(model: str, mix_name: str) -> GgufInfo:
    """The tensor table of ``model`` (a catalog name or config, as --model takes it) in the
    llama.cpp file type ``mix_name``; a format of the other engines is refused naming ours."""
    if mix_name.lower() not in mixes().mixes:
        raise mix_error(mix_name)
    return tensor_table(load_model(model), mix_name)


def mix_assumption(mix_name: str) -> str:
    """The assumption line of a prediction priced from a mix instead of a file."""
    imatrix = "with" if mixes().imatrix else "without"
    return (
        f"no GGUF file: the tensor types llama-quantize {mix_name.upper()} would give this "
        f"config ({imatrix} an importance matrix; data/predict/gguf_mixes.yaml, from "
        "llama.cpp's llama_tensor_get_type); pass --gguf for the exact file"
    )
