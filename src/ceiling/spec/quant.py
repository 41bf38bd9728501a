"""Weight formats and the checkpoint's quantization scheme: which module is stored how.

Decode reads every weight byte it uses, scales included, so a module's size must be exact to
the scale layout: INT4 group-32 with bf16 scales is 0.5625 bytes/param, not 0.5. This module
turns a Hugging Face ``quantization_config`` (or a ModelOpt ``hf_quant_config.json``) into a
function ``module name -> WeightFormat``. Unknown methods raise a :class:`CeilingError` naming
the field, so a wrong guess never silently changes the prediction.
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from ceiling.errors import CeilingError


@dataclass(frozen=True)
class WeightFormat:
    """How one weight matrix is stored.

    bytes(rows, cols) = rows*cols*bits/8
                        + rows*ceil(cols/group) * (scale_bytes + zero_bits/8)   (group scales)
                        + ceil(rows/b0)*ceil(cols/b1) * scale_bytes             (2-D block scales)
                        + rows * scale_bytes                                    (per-channel)
                        + cols * gidx_bytes + extra_bytes                        (g_idx, global scales)
    ``compute`` is the tensor-core dtype its GEMM runs in (for the compute roofline).
    """

    name: str
    bits: float
    compute: str = "bf16"
    group: int | None = None
    block: tuple[int, int] | None = None
    per_channel: bool = False
    scale_bytes: float = 0.0
    zero_bits: int = 0
    gidx_bytes: int = 0
    extra_bytes: int = 0

    def nbytes(self, rows: int, cols: int) -> int:
        """Exact bytes of one ``rows x cols`` matrix (out x in) in this format, scales included."""
        total = math.ceil(rows * cols * self.bits / 8)
        if self.group:
            n_groups = rows * math.ceil(cols / self.group)
            total += math.ceil(n_groups * (self.scale_bytes + self.zero_bits / 8))
        if self.block:
            b0, b1 = self.block
            total += math.ceil(math.ceil(rows / b0) * math.ceil(cols / b1) * self.scale_bytes)
        if self.per_channel:
            total += math.ceil(rows * self.scale_bytes)
        total += cols * self.gidx_bytes + self.extra_bytes
        return total


def dense(dtype: str = "bf16") -> WeightFormat:
    """An unquantized format (bf16/fp16: 2 bytes, fp32: 4 bytes)."""
    bits = {"bf16": 16, "bfloat16": 16, "fp16": 16, "float16": 16, "fp32": 32, "float32": 32}
    if dtype not in bits:
        raise CeilingError(
            f"unsupported model dtype '{dtype}' (field torch_dtype/dtype)",
            fix="use bfloat16, float16 or float32",
        )
    name = (
        "fp32" if bits[dtype] == 32 else ("fp16" if "16" in dtype and "b" not in dtype else "bf16")
    )
    return WeightFormat(name=name, bits=bits[dtype], compute="bf16")


def fp8_block(b0: int = 128, b1: int = 128) -> WeightFormat:
    """FP8 e4m3 with one fp32 scale per b0 x b1 block (DeepSeek-V3 style)."""
    return WeightFormat(
        name=f"fp8-block{b0}x{b1}", bits=8, compute="fp8", block=(b0, b1), scale_bytes=4
    )


def fp8_tensor() -> WeightFormat:
    """FP8 e4m3 with one fp32 weight scale and one fp32 input scale per tensor (ModelOpt FP8)."""
    return WeightFormat(name="fp8-tensor", bits=8, compute="fp8", extra_bytes=8)


def fp8_channel() -> WeightFormat:
    """FP8 e4m3 with one fp32 scale per output channel (compressed-tensors 'channel')."""
    return WeightFormat(name="fp8-channel", bits=8, compute="fp8", per_channel=True, scale_bytes=4)


def nvfp4(group: int = 16) -> WeightFormat:
    """NVFP4: e2m1 values, one fp8 e4m3 scale per 16 elements, plus fp32 global + input scale."""
    return WeightFormat(
        name="nvfp4", bits=4, compute="fp4", group=group, scale_bytes=1, extra_bytes=8
    )


def mxfp4(group: int = 32) -> WeightFormat:
    """MXFP4 (OCP microscaling): e2m1 values, one e8m0 (1 byte) scale per 32 elements."""
    return WeightFormat(name="mxfp4", bits=4, compute="fp4", group=group, scale_bytes=1)


def int_group(bits: int, group: int, symmetric: bool = True, scale_bytes: int = 2) -> WeightFormat:
    """Integer weights with a bf16/fp16 scale per group (compressed-tensors w4a16 and kin)."""
    return WeightFormat(
        name=f"int{bits}-g{group}" + ("" if symmetric else "-asym"),
        bits=bits,
        compute="bf16",
        group=group,
        scale_bytes=scale_bytes,
        zero_bits=0 if symmetric else bits,
    )


def awq(bits: int = 4, group: int = 128) -> WeightFormat:
    """AWQ: packed int weights, fp16 scale and packed int zero point per group."""
    return WeightFormat(
        name=f"awq-int{bits}-g{group}",
        bits=bits,
        compute="bf16",
        group=group,
        scale_bytes=2,
        zero_bits=bits,
    )


def gptq(bits: int = 4, group: int = 128, desc_act: bool = False) -> WeightFormat:
    """GPTQ: packed int weights, fp16 scales, packed zeros, plus an int32 g_idx per input column."""
    return WeightFormat(
        name=f"gptq-int{bits}-g{group}",
        bits=bits,
        compute="bf16",
        group=group if group > 0 else None,
        per_channel=group <= 0,
        scale_bytes=2,
        zero_bits=bits,
        gidx_bytes=4,
    )


# Formats a user can ask for by name (--weight-format and the what-if table).
NAMED_FORMATS: dict[str, Callable[[], WeightFormat]] = {
    "bf16": lambda: dense("bf16"),
    "fp8": fp8_block,
    "fp8-tensor": fp8_tensor,
    "nvfp4": nvfp4,
    "mxfp4": mxfp4,
    "int4-g32": lambda: int_group(4, 32),
    "int4-g128": lambda: int_group(4, 128),
    "awq": awq,
    "gptq": gptq,
    "int8-g128": lambda: int_group(8, 128),
}


# llama.cpp's file types a user can name (--engine llamacpp --weight-format): names only, kept
# here so the CLI offers them without reading YAML at start-up; their mix rules are
# data/predict/gguf_mixes.yaml (a test keeps the two lists equal).
GGUF_MIXES: tuple[str, ...] = ("q4_k_m", "q5_k_m", "q6_k", "q8_0", "f16", "iq4_xs")


def named_format(name: str) -> WeightFormat:
    try:
        return NAMED_FORMATS[name]()
    except KeyError:
        gguf = name.lower() in GGUF_MIXES  # a llama.cpp file type asked of another engine
        raise CeilingError(
            f"{name} is a llama.cpp file type (GGUF): only --engine llamacpp reads it"
            if gguf
            else f"unknown weight format '{name}'",
            fix="one of: native, "
            + ", ".join(NAMED_FORMATS)
            + ("; or --engine llamacpp" if gguf else ""),
        ) from None


# ----------------------------------------------------------------------------- name matching

_PREFIXES = (
    ("language_model.model.", "model."),
    ("model.language_model.", "model."),
    ("language_model.", ""),
)


def _normalize(pattern: str) -> str:
    """Map multimodal wrappers' module prefixes onto the text model's ``model.layers...``."""
    for old, new in _PREFIXES:
        if pattern.startswith(old):
            return new + pattern[len(old) :]
    return pattern


def _pattern_regex(pattern: str) -> str:
    if pattern.startswith("re:"):
        return f"(?:{pattern[3:]})"
    p = _normalize(pattern)
    if any(c in p for c in "*?["):
        return f"(?:{fnmatch.translate(p)})"
    # A plain name skips that module, the subtree under it, or any module ending in it.
    return rf"(?:(?:.*\.)?{re.escape(p)}(?:\..*)?\Z)"


class NameMatcher:
    """Compiled union of ignore/target patterns ('re:' regex, glob, or plain module name)."""

    def __init__(self, patterns: list[str]) -> None:
        self.patterns = list(patterns)

    @cached_property
    def _rx(self) -> re.Pattern[str] | None:
        # compiled at the first match, not at parse: a MIXED_PRECISION export lists thousands
        # of module names, and a reader that only wants the formats (what-if) never matches
        body = "|".join(_pattern_regex(p) for p in self.patterns if p)
        return re.compile(body) if body else None

    def __call__(self, name: str) -> bool:
        return bool(self._rx and self._rx.match(name))


# ----------------------------------------------------------------------------- schemes


@dataclass
class QuantScheme:
    """The checkpoint's quantization: which format each module is stored in."""

    method: str  # none | compressed-tensors | fp8 | modelopt | mxfp4 | awq | gptq | override
    summary: str
    default: WeightFormat  # unquantized modules (model dtype)
    rules: list[tuple[Callable[[str, str], bool], WeightFormat]]
    ignore: NameMatcher
    kv_cache_dtype: str | None = None  # what the checkpoint suggests (e.g. fp8)

    def format_for(self, name: str, kind: str, linear: bool) -> WeightFormat:
        """Format of module ``name`` (kind: attn/mlp/expert/shared/router/lm_head/embed/...)."""
        # lm_head is quantized only where a rule names it (nvidia's NVFP4 exports: W4A16 lm_head);
        # a blanket rule (every linear layer, experts only) leaves it in the model dtype, as the
        # engines do
        if not (linear or kind == "lm_head") or self.ignore(name):
            return self.default
        for applies, fmt in self.rules:
            if kind == "lm_head" and applies in (_all_linear, _experts_only, _quantizable):
                continue
            if applies(name, kind):
                return fmt
        return self.default


def _all_linear(_name: str, _kind: str) -> bool:
    return True


def _experts_only(_name: str, kind: str) -> bool:
    return kind == "expert"


def _ct_weight_format(w: dict[str, Any], where: str) -> WeightFormat:
    bits = w.get("num_bits")
    typ = w.get("type", "int")
    strategy = w.get("strategy", "group" if w.get("group_size") else "channel")
    group = w.get("group_size")
    sym = w.get("symmetric", True)
    if typ == "float" and bits == 8:
        if strategy == "block":
            blk = w.get("block_structure") or [128, 128]
            return fp8_block(int(blk[0]), int(blk[1]))
        if strategy == "tensor":
            return fp8_tensor()
        return fp8_channel()
    if typ == "float" and bits == 4:
        return nvfp4(int(group or 16))
    if typ == "int" and bits in (2, 3, 4, 8):
        if strategy == "group" and group:
            return int_group(int(bits), int(group), bool(sym))
        if strategy == "channel":
            return WeightFormat(
                name=f"int{bits}-channel",
                bits=bits,
                per_channel=True,
                scale_bytes=2,
                zero_bits=0 if sym else int(bits),
            )
    raise CeilingError(
        f"unsupported compressed-tensors weights scheme at {where}: "
        f"num_bits={bits} type={typ} strategy={strategy}",
        fix="supported: int 2/3/4/8 group or channel, float 8 (block/tensor/channel), float 4 (nvfp4)",
    )


def _target_matcher(targets: list[str]) -> Callable[[str, str], bool]:
    if any(t == "Linear" for t in targets):
        return _all_linear
    # 're:' regexes and module names (e.g. 'lm_head', or every layer's projection by its full
    # name, as nvidia's ModelOpt mixed-precision exports list them)
    names = NameMatcher([t for t in targets if t])
    if not names.patterns:
        raise CeilingError(
            f"unsupported compressed-tensors targets {targets} (field config_groups.*.targets)",
            fix="supported: 'Linear', 're:' patterns or module names",
        )
    return lambda name, _kind: names(name)


def _modelopt_format(algo: str, group: Any, where: str) -> WeightFormat:
    """The weight format of one ModelOpt ``quant_algo`` (weights only: decode streams them)."""
    algo = algo.upper()
    if algo in ("NVFP4", "W4A16_NVFP4", "W4A8_NVFP4_FP8"):
        return nvfp4(int(group or 16))
    if algo in ("FP8", "FP8_PER_CHANNEL_PER_TOKEN"):
        return fp8_channel() if "CHANNEL" in algo else fp8_tensor()
    if algo == "FP8_BLOCK":
        return fp8_block()
    if algo in ("W4A16_AWQ", "W4A8_AWQ"):
        return awq(4, int(group or 128))
    raise CeilingError(
        f"unsupported ModelOpt quant_algo '{algo}' ({where})",
        fix="supported ModelOpt algorithms: NVFP4 (W4A16_NVFP4), FP8, FP8_BLOCK, W4A16_AWQ, "
        "MIXED_PRECISION of these",
    )


def _modelopt_mixed(
    layers: dict[str, Any],
) -> list[tuple[Callable[[str, str], bool], WeightFormat]]:
    """ModelOpt MIXED_PRECISION: ``quantized_layers`` maps each module to its own algorithm."""
    by_fmt: dict[str, tuple[WeightFormat, list[str]]] = {}
    for name, spec in layers.items():
        spec = spec if isinstance(spec, dict) else {"quant_algo": spec}
        fmt = _modelopt_format(
            str(spec.get("quant_algo") or ""), spec.get("group_size"), f"quantized_layers.{name}"
        )
        by_fmt.setdefault(fmt.name, (fmt, []))[1].append(name)
    rules: list[tuple[Callable[[str, str], bool], WeightFormat]] = []
    for fmt, names in by_fmt.values():
        m = NameMatcher(names)
        rules.append(((lambda mm: lambda name, _kind: mm(name))(m), fmt))
    return rules


def parse_quant(
    qc: dict[str, Any] | None, model_dtype: str, hf_quant: dict[str, Any] | None = None
) -> QuantScheme:
    """Build the scheme from ``quantization_config`` (and/or a ModelOpt ``hf_quant_config.json``)."""
    default = dense(model_dtype)
    if hf_quant and not qc:
        q = hf_quant.get("quantization", hf_quant)
        qc = {
            "quant_method": "modelopt",
            "quant_algo": q.get("quant_algo"),
            "quantized_layers": q.get("quantized_layers"),
            "group_size": q.get("group_size"),
            "ignore": q.get("exclude_modules", []),
            "kv_cache_quant_algo": q.get("kv_cache_quant_algo"),
        }
    if not qc:
        return QuantScheme("none", f"unquantized {default.name}", default, [], NameMatcher([]))
    method = qc.get("quant_method")
    if method == "compressed-tensors":
        rules = []
        names = []
        for gname, group in (qc.get("config_groups") or {}).items():
            w = group.get("weights")
            if not w:
                continue
            fmt = _ct_weight_format(w, f"quantization_config.config_groups.{gname}.weights")
            rules.append((_target_matcher(group.get("targets", ["Linear"])), fmt))
            names.append(fmt.name)
        kv = qc.get("kv_cache_scheme")
        return QuantScheme(
            method,
            f"compressed-tensors {', '.join(names)}; ignore {len(qc.get('ignore') or [])} patterns",
            default,
            rules,
            NameMatcher(qc.get("ignore") or []),
            "fp8" if kv and kv.get("num_bits") == 8 else None,
        )
    if method == "fp8":
        blk = qc.get("weight_block_size")
        fmt = fp8_block(int(blk[0]), int(blk[1])) if blk else fp8_tensor()
        skip = qc.get("modules_to_not_convert") or qc.get("ignored_layers") or []
        return QuantScheme(
            method,
            f"{fmt.name}; {len(skip)} modules kept",
            default,
            [(_all_linear, fmt)],
            NameMatcher(skip),
        )
    if method == "modelopt" and str(qc.get("quant_algo") or "").upper() == "MIXED_PRECISION":
        layers = qc.get("quantized_layers") or {}
        if not layers and hf_quant:
            layers = hf_quant.get("quantization", hf_quant).get("quantized_layers") or {}
        if not layers:
            raise CeilingError(
                "ModelOpt MIXED_PRECISION without quantized_layers (field quantized_layers)",
                fix="keep the checkpoint's hf_quant_config.json beside config.json",
            )
        rules = _modelopt_mixed(layers)
        skip = qc.get("ignore") or qc.get("exclude_modules") or []
        kv = qc.get("kv_cache_scheme") or {}
        kv_algo = qc.get("kv_cache_quant_algo") or (
            (hf_quant or {}).get("quantization", hf_quant or {}).get("kv_cache_quant_algo")
        )
        kv_fp8 = kv.get("num_bits") == 8 or str(kv_algo or "").upper() == "FP8"
        return QuantScheme(
            method,
            f"ModelOpt mixed precision {', '.join(f.name for _, f in rules)}; "
            f"{len(layers)} modules",
            default,
            rules,
            NameMatcher(skip),
            "fp8" if kv_fp8 else None,
        )
    if method == "modelopt":
        algo = str(qc.get("quant_algo") or "").upper()
        if algo == "NVFP4":
            group = qc.get("group_size")
            if group is None:
                for grp in (qc.get("config_groups") or {}).values():
                    group = (grp.get("weights") or {}).get("group_size") or group
            fmt = nvfp4(int(group or 16))
        elif algo == "FP8":
            fmt = fp8_tensor()
        else:
            raise CeilingError(
                f"unsupported ModelOpt quant_algo '{qc.get('quant_algo')}' (field quant_algo)",
                fix="supported ModelOpt algorithms: NVFP4, FP8",
            )
        skip = qc.get("ignore") or qc.get("exclude_modules") or []
        kv = qc.get("kv_cache_scheme") or {}
        kv_fp8 = (
            kv.get("num_bits") == 8 or str(qc.get("kv_cache_quant_algo") or "").upper() == "FP8"
        )
        return QuantScheme(
            method,
            f"ModelOpt {fmt.name}; exclude {len(skip)} patterns",
            default,
            [(_all_linear, fmt)],
            NameMatcher(skip),
            "fp8" if kv_fp8 else None,
        )
    if method == "mxfp4":
        skip = qc.get("modules_to_not_convert") or []
        # vLLM/HF apply MXFP4 to the MoE experts only; other linears stay in the model dtype.
        return QuantScheme(
            method,
            "MXFP4 experts (group 32, e8m0 scales)",
            default,
            [(_experts_only, mxfp4())],
            NameMatcher(skip),
        )
    if method in ("awq", "gptq"):
        bits = int(qc.get("bits", qc.get("w_bit", 4)))
        group = int(qc.get("group_size", qc.get("q_group_size", 128)))
        fmt = awq(bits, group) if method == "awq" else gptq(bits, group, bool(qc.get("desc_act")))
        skip = qc.get("modules_to_not_convert") or []
        return QuantScheme(method, f"{fmt.name}", default, [(_all_linear, fmt)], NameMatcher(skip))
    raise CeilingError(
        f"unsupported quantization method '{method}' (field quantization_config.quant_method)",
        fix="supported: compressed-tensors, fp8, modelopt (NVFP4/FP8), mxfp4, awq, gptq; "
        "or pass --weight-format to override",
    )


# Module kinds an override leaves in the model dtype, as quantizers do: Gated DeltaNet's tiny
# (hidden -> v_heads) gate projections stay 16-bit in the published exports (AutoRound's
# extra_config sets them to bits 16; nvidia's ModelOpt NVFP4 Qwen3.5/3.6 leaves them out of
# quantized_layers: reference/models/)
KEEP_16BIT_KINDS = frozenset({"linear_attn_gate"})


def _quantizable(_name: str, kind: str) -> bool:
    return kind not in KEEP_16BIT_KINDS


def override_scheme(fmt: WeightFormat, model_dtype: str) -> QuantScheme:
    """Every linear layer except lm_head, routers, embeddings and ``KEEP_16BIT_KINDS`` in ``fmt``
    (what-if / override)."""
    default = dense(model_dtype)
    return QuantScheme(
        "override",
        f"all linear layers {fmt.name} (override; lm_head, routers and Gated DeltaNet's "
        f"in_proj_a/b {default.name})",
        default,
        [(_quantizable, fmt)],
        NameMatcher(["lm_head"]),
    )
