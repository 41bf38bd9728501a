"""Write a GGUF file of a real model's shape with random weights, for llama.cpp kernel timing.

    python3 experiments/gpu/random_gguf.py --shape llama3.1-8b --ftype q4_k_m --out /tmp/m.gguf

Weights' values do not change a kernel's speed (llama.cpp's kernels have no data-dependent
work except the MoE router's choice, and random router weights spread tokens over experts as a
trained router does), so no download is needed: the file is written on the GPU machine, where
nothing can be fetched. Quantized tensors are written as quantized blocks directly (the ggml
block layouts: gguf.constants.GGML_QUANT_SIZES), with every block's f16 scale set to a small
finite value so no NaN reaches the sampler; the rest of each block is random bytes. Writing
blocks directly (not llama-quantize from an F16 file) keeps the 30B MoE file off an F16
intermediate of 61 GB that the machine's 64 GB disk could not hold.

The ``--ftype`` mixes follow llama.cpp's ``llama_tensor_get_type`` for that file type (the
``use_more_bits`` layers get Q6_K for attn_v and ffn_down in Q4_K_M; the output matrix is Q6_K;
norms and the MoE router stay F32), so the file's bytes per token match a quantized export.

The vocabulary is the tiny model's ASCII BPE idea at full size: printable ASCII tokens (a random
model emits any of them, and each one is valid UTF-8, so the server streams one token per
chunk), with three CONTROL tokens. It runs with the GPU image's python3 (numpy) and the carried
``gguf`` wheel; it must not import ceiling.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass

import numpy as np

SEED = 1234
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


@dataclass(frozen=True)
class Shape:
    arch: str  # llama.cpp's architecture name
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int  # dense feed-forward width (0: none)
    context: int
    rope_theta: float
    experts: int = 0
    experts_used: int = 0
    expert_ffn: int = 0
    qk_norm: bool = False


# public config.json values of each model (hidden_size, num_hidden_layers, ...)
SHAPES = {
    "llama3.1-8b": Shape("llama", 128256, 4096, 32, 32, 8, 128, 14336, 131072, 500000.0),
    "llama3.1-70b": Shape("llama", 128256, 8192, 80, 64, 8, 128, 28672, 131072, 500000.0),
    "qwen3-30b-a3b": Shape(
        "qwen3moe", 151936, 2048, 48, 32, 4, 128, 0, 40960, 1000000.0,
        experts=128, experts_used=8, expert_ffn=768, qk_norm=True,
    ),
    # held out of every fit (issue 27): other dense sizes and another MoE shape
    "mistral-nemo-12b": Shape("llama", 131072, 5120, 40, 32, 8, 128, 14336, 131072, 1000000.0),
    "qwen3-32b": Shape(
        "qwen3", 151936, 5120, 64, 64, 8, 128, 25600, 40960, 1000000.0, qk_norm=True,
    ),
    "mixtral-8x7b": Shape(
        "llama", 32000, 4096, 32, 32, 8, 128, 0, 32768, 1000000.0,
        experts=8, experts_used=2, expert_ffn=14336,
    ),
    # small twins for a local check of the writer on the CPU build
    "tiny-llama": Shape("llama", 4096, 256, 4, 4, 2, 64, 512, 4096, 500000.0),
    "tiny-moe": Shape(
        "qwen3moe", 4096, 256, 4, 4, 2, 64, 0, 4096, 1000000.0,
        experts=8, experts_used=2, expert_ffn=256, qk_norm=True,
    ),
}  # fmt: skip

# llama_ftype values (llama.h) written as general.file_type
FILE_TYPES = {"f16": 1, "q8_0": 7, "q4_k_m": 15, "q5_k_m": 17, "q6_k": 18, "iq4_xs": 30}


def _use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's use_more_bits(i_layer, n_layers) (llama-quant.cpp)."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def tensor_type(ftype: str, name: str, layer: int, n_layers: int, experts: int = 0) -> str:
    """The ggml type of one weight matrix in a file of ``ftype`` (``experts``: the model's
    expert count; llama-quant.cpp gives an 8-expert model Q8_0 attn_k/attn_v and, in Q4_K_M and
    IQ4_XS, a Q5_K attn_output)."""
    if ftype == "f16":
        return "F16"
    if ftype == "q8_0":
        return "Q8_0"
    if experts == 8 and name in ("attn_k", "attn_v"):
        return "Q8_0"
    if experts == 8 and name == "attn_output" and ftype in ("q4_k_m", "iq4_xs"):
        return "Q5_K"
    if ftype == "q6_k":
        return "Q6_K"
    if ftype == "iq4_xs":
        return "Q6_K" if name == "output" else "IQ4_XS"
    base = {"q4_k_m": "Q4_K", "q5_k_m": "Q5_K"}[ftype]
    if name == "output":
        return "Q6_K"
    if name in ("attn_v", "ffn_down", "ffn_down_exps") and _use_more_bits(layer, n_layers):
        return "Q6_K"
    return base


# where each block type keeps its f16 scale(s): byte offsets in the block
_F16_FIELDS = {
    "Q8_0": (0,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
    "IQ4_XS": (0,),
}


class Blocks:
    """Random block bytes of each type, made once and tiled (random generation of 40 GB would
    take minutes; a tiled 64 MiB pattern writes at disk speed and is as good for the kernels)."""

    def __init__(self, gguf_mod: object) -> None:
        self.gguf = gguf_mod
        self.rng = np.random.default_rng(SEED)
        self.cache: dict[str, np.ndarray] = {}

    def pattern(self, ggml_type: str) -> np.ndarray:
        if ggml_type not in self.cache:
            if ggml_type == "F16":
                pat = (self.rng.standard_normal(1 << 24) * 0.02).astype(np.float16).view(np.uint8)
            elif ggml_type == "F32":
                pat = np.ones(1 << 16, dtype=np.float32).view(np.uint8)
            else:
                qt = getattr(self.gguf.GGMLQuantizationType, ggml_type)
                _, block_bytes = self.gguf.GGML_QUANT_SIZES[qt]
                n_blocks = (64 << 20) // block_bytes
                pat = self.rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
                scale = np.frombuffer(np.float16(2e-4).tobytes(), dtype=np.uint8)
                for off in _F16_FIELDS[ggml_type]:
                    pat[:, off : off + 2] = scale
                pat = pat.reshape(-1)
            self.cache[ggml_type] = pat
        return self.cache[ggml_type]

    def nbytes(self, ggml_type: str, shape: tuple[int, ...]) -> int:
        n = int(np.prod(shape))
        if ggml_type == "F16":
            return 2 * n
        if ggml_type == "F32":
            return 4 * n
        qt = getattr(self.gguf.GGMLQuantizationType, ggml_type)
        block, block_bytes = self.gguf.GGML_QUANT_SIZES[qt]
        return n // block * block_bytes

    def data(self, ggml_type: str, shape: tuple[int, ...]) -> np.ndarray:
        nb = self.nbytes(ggml_type, shape)
        return np.resize(self.pattern(ggml_type), nb)


def tensors(s: Shape, ftype: str) -> list[tuple[str, str, tuple[int, ...]]]:
    """(name, ggml type, numpy shape = (..., rows, cols)) of every tensor, in file order."""
    out: list[tuple[str, str, tuple[int, ...]]] = []
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    out.append(
        ("token_embd.weight", tensor_type(ftype, "token_embd", 0, s.layers), (s.vocab, s.hidden))
    )
    for i in range(s.layers):
        p = f"blk.{i}."

        def t(name: str, shape: tuple[int, ...], p: str = p, i: int = i) -> None:
            out.append(
                (f"{p}{name}.weight", tensor_type(ftype, name, i, s.layers, s.experts), shape)
            )

        out.append((p + "attn_norm.weight", "F32", (s.hidden,)))
        t("attn_q", (q, s.hidden))
        t("attn_k", (kv, s.hidden))
        t("attn_v", (kv, s.hidden))
        t("attn_output", (s.hidden, q))
        if s.qk_norm:
            out.append((p + "attn_q_norm.weight", "F32", (s.head_dim,)))
            out.append((p + "attn_k_norm.weight", "F32", (s.head_dim,)))
        out.append((p + "ffn_norm.weight", "F32", (s.hidden,)))
        if s.experts:
            out.append((p + "ffn_gate_inp.weight", "F32", (s.experts, s.hidden)))
            t("ffn_gate_exps", (s.experts, s.expert_ffn, s.hidden))
            t("ffn_up_exps", (s.experts, s.expert_ffn, s.hidden))
            t("ffn_down_exps", (s.experts, s.hidden, s.expert_ffn))
        else:
            t("ffn_gate", (s.ffn, s.hidden))
            t("ffn_up", (s.ffn, s.hidden))
            t("ffn_down", (s.hidden, s.ffn))
    out.append(("output_norm.weight", "F32", (s.hidden,)))
    out.append(
        ("output.weight", tensor_type(ftype, "output", s.layers - 1, s.layers), (s.vocab, s.hidden))
    )
    return out  # fmt: skip


def vocabulary(n: int) -> list[str]:
    """Three CONTROL tokens, the printable ASCII characters, then distinct ASCII words."""
    specials = ["<s>", "</s>", "<pad>"]
    chars = [chr(c) for c in range(33, 127)] + ["Ġ", "Ċ"]  # byte-level ' ' and '\n'
    words = [f"w{i}" for i in range(n - len(specials) - len(chars))]
    return specials + chars + words


def write(
    shape_name: str, ftype: str, out_path: str, header_only: bool = False
) -> dict[str, object]:
    import gguf  # the carried wheel (the GPU image has numpy, pyyaml, tqdm, requests)

    s = SHAPES[shape_name]
    w = gguf.GGUFWriter(out_path, s.arch)
    w.add_name(f"random-{shape_name}-{ftype}")
    w.add_context_length(s.context)
    w.add_embedding_length(s.hidden)
    w.add_block_count(s.layers)
    w.add_head_count(s.heads)
    w.add_head_count_kv(s.kv_heads)
    w.add_key_length(s.head_dim)
    w.add_value_length(s.head_dim)
    w.add_rope_dimension_count(s.head_dim)
    w.add_rope_freq_base(s.rope_theta)
    w.add_layer_norm_rms_eps(1e-5 if s.arch == "llama" else 1e-6)
    w.add_vocab_size(s.vocab)
    w.add_file_type(FILE_TYPES[ftype])
    if s.experts:
        w.add_expert_count(s.experts)
        w.add_expert_used_count(s.experts_used)
        w.add_expert_feed_forward_length(s.expert_ffn)
        # llama's MoE (Mixtral) sizes its experts by feed_forward_length; qwen3moe by the above
        w.add_feed_forward_length(s.expert_ffn * (1 if s.arch == "llama" else s.experts_used))
    else:
        w.add_feed_forward_length(s.ffn)
    tokens = vocabulary(s.vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL] * 3 + [gguf.TokenType.NORMAL] * (s.vocab - 3))
    w.add_token_merges(["w 0"])
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    w.add_pad_token_id(2)
    w.add_add_bos_token(True)
    w.add_chat_template(CHAT_TEMPLATE)
    blocks = Blocks(gguf)
    plan = tensors(s, ftype)
    total = 0
    for name, ggml_type, shape in plan:
        nb = blocks.nbytes(ggml_type, shape)
        total += nb
        if ggml_type in ("F16", "F32"):
            dt = np.float16 if ggml_type == "F16" else np.float32
            w.add_tensor_info(name, shape, np.dtype(dt), nb)
        else:
            qt = getattr(gguf.GGMLQuantizationType, ggml_type)
            block, block_bytes = gguf.GGML_QUANT_SIZES[qt]
            byte_shape = (*shape[:-1], shape[-1] // block * block_bytes)
            w.add_tensor_info(name, byte_shape, np.dtype(np.uint8), nb, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for _name, ggml_type, shape in [] if header_only else plan:
        arr = blocks.data(ggml_type, shape)
        if ggml_type == "F16":
            arr = arr.view(np.float16)
        elif ggml_type == "F32":
            arr = arr.view(np.float32)
        w.write_tensor_data(arr)
    w.close()
    types: dict[str, int] = {}
    for _name, ggml_type, shape in plan:
        types[ggml_type] = types.get(ggml_type, 0) + int(np.prod(shape))
    return {"file": out_path, "shape": shape_name, "ftype": ftype, "bytes": total,
            "params_by_type": types}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), required=True)
    ap.add_argument("--ftype", choices=sorted(FILE_TYPES), required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument(
        "--header-only",
        action="store_true",
        help="metadata and tensor infos only (what predict --engine llamacpp reads)",
    )
    a = ap.parse_args(argv)
    t0 = time.time()
    tmp = f"{a.out}.tmp{os.getpid()}"
    info = write(a.shape, a.ftype, tmp, a.header_only)
    os.replace(tmp, a.out)
    info["file"] = a.out
    info["seconds"] = round(time.time() - t0, 1)
    import json

    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
