"""``predict --engine llamacpp``: the decode step of a GGUF file on llama.cpp's CUDA kernels.

llama.cpp reads every weight in its GGUF type (Q4_K, Q6_K, Q8_0, F16, IQ4_XS ...) with its own
mat-vec kernels, so the bytes per token come from the file's tensor types (ggml block layouts,
``engines/data/llamacpp_kernels.yaml``), not from a PyTorch dtype. One token's step:

    step = sum over weight matrices read (t0 + bytes / achieved bandwidth of that type)
         + KV bytes at the context / bandwidth + small kernels x their cost (graph or eager)

The achieved bandwidth per type is a prior (the hopper bf16 mat-vec prior for every type) or,
with a profile from ``ceiling calibrate --engine llamacpp``, what llama.cpp's own kernels did on
this GPU (test-backend-ops perf). The bound is the same bytes at the datasheet bandwidth.
MoE files read the routed experts only (expert_used_count of expert_count per layer).

The GGUF header is read here by hand (magic, metadata, tensor infos: a few fixed-width records,
docs in ggml/docs/gguf.md) rather than through the ``gguf`` package: predict must not need numpy
or a 1 MB dependency to read 2 KB of header, and no tensor data is touched.
"""

from __future__ import annotations

import re
import struct
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any, BinaryIO

from pydantic import BaseModel, Field

from ceiling.errors import CeilingError
from ceiling.outputs import write_atomic
from ceiling.spec._data import load_yaml

SCHEMA_VERSION = 1
_GGUF_MAGIC = b"GGUF"
# GGUF metadata value types: id -> struct format (8: string, 9: array)
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
            12: "d"}  # fmt: skip


class _GgmlType(BaseModel, extra="forbid"):
    id: int
    block: int = Field(gt=0)
    bytes: int = Field(gt=0)


class _LayerKernels(BaseModel, extra="forbid"):
    matvec: int
    small: int
    router: int = 0
    expert_matvec: int = 0


class _Kernels(BaseModel, extra="forbid"):
    dense_layer: _LayerKernels
    moe_layer: _LayerKernels
    attention_off_extra_small: int
    head: _LayerKernels


class _Priors(BaseModel, extra="forbid"):
    matvec_t0_us: float = Field(gt=0)
    matvec_eff: float = Field(gt=0, le=1)
    small_us_graph: float = Field(gt=0)
    small_us_eager: float = Field(gt=0)


class LlamaCppKernelsFile(BaseModel, extra="forbid"):
    """Schema of engines/data/llamacpp_kernels.yaml (a misspelled key fails at load)."""

    schema_version: int
    types: dict[str, _GgmlType]
    kernels: _Kernels
    priors: _Priors
    split_modes: dict[str, str]


@cache
def kernel_data() -> dict[str, Any]:
    # validated by its schema at load; read as plain data by the step below
    data = load_yaml("llamacpp_kernels.yaml", folder="engines/data", schema=LlamaCppKernelsFile)
    return data.model_dump()


def bits_per_weight(type_name: str) -> float:
    """Bits per weight of a ggml type, from its block layout (Q4_K: 4.5)."""
    t = kernel_data()["types"].get(type_name.upper())
    if t is None:
        known = ", ".join(kernel_data()["types"])
        raise CeilingError(f"unknown GGUF weight type {type_name!r}", fix=f"one of: {known}")
    return 8.0 * t["bytes"] / t["block"]


class GgufTensor(BaseModel):
    name: str
    type: str
    shape: list[int]

    @property
    def params(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> float:
        return self.params * bits_per_weight(self.type) / 8.0


class GgufInfo(BaseModel):
    """What the file's header says: its metadata (scalars and short arrays) and tensors."""

    path: str
    arch: str
    metadata: dict[str, Any] = Field(default_factory=dict)
    tensors: list[GgufTensor] = Field(default_factory=list)

    def key(self, name: str, default: Any = None) -> Any:
        return self.metadata.get(f"{self.arch}.{name}", default)


def _read(f: BinaryIO, fmt: str) -> Any:
    size = struct.calcsize("<" + fmt)
    raw = f.read(size)
    if len(raw) != size:
        raise CeilingError("the GGUF file ends inside its header", fix="pass a complete .gguf file")
    return struct.unpack("<" + fmt, raw)[0]


def _string(f: BinaryIO) -> str:
    n = _read(f, "Q")
    if n > 1 << 24:
        raise CeilingError("a GGUF header string is implausibly long", fix="pass a .gguf file")
    return f.read(n).decode("utf-8", "replace")


def _value(f: BinaryIO, vtype: int) -> Any:
    if vtype in _SCALARS:
        return _read(f, _SCALARS[vtype])
    if vtype == 8:
        return _string(f)
    if vtype == 9:
        etype, n = _read(f, "I"), _read(f, "Q")
        items = [_value(f, etype) for _ in range(n)]
        # vocabularies are long and say nothing about kernels: keep a count only
        return items if n <= 64 else {"array_len": n}
    raise CeilingError(f"unknown GGUF metadata type {vtype}", fix="pass a GGUF v2/v3 file")


def read_gguf(path: str | Path) -> GgufInfo:
    """The header of a GGUF file (no tensor data is read)."""
    p = Path(path)
    ids = {v["id"]: k for k, v in kernel_data()["types"].items()}
    try:
        f = p.open("rb")
    except OSError as exc:
        raise CeilingError(f"cannot read {p}: {exc.strerror}", fix="pass a .gguf file") from None
    with f:
        if f.read(4) != _GGUF_MAGIC:
            raise CeilingError(f"{p} is not a GGUF file (no GGUF magic)", fix="pass a .gguf file")
        version = _read(f, "I")
        if version < 2:
            raise CeilingError(f"{p}: GGUF version {version} is too old", fix="convert it anew")
        n_tensors, n_kv = _read(f, "Q"), _read(f, "Q")
        meta: dict[str, Any] = {}
        for _ in range(n_kv):
            k = _string(f)
            meta[k] = _value(f, _read(f, "I"))
        tensors = []
        for _ in range(n_tensors):
            name = _string(f)
            dims = [_read(f, "Q") for _ in range(_read(f, "I"))]
            tid = _read(f, "I")
            _read(f, "Q")  # offset
            if tid not in ids:
                raise CeilingError(f"{p}: tensor {name} has ggml type {tid}, not in ceiling's "
                                   "table", fix="update engines/data/llamacpp_kernels.yaml")  # fmt: skip
            tensors.append(GgufTensor(name=name, type=ids[tid], shape=dims))
    arch = str(meta.get("general.architecture", "llama"))
    return GgufInfo(path=str(p), arch=arch, metadata=meta, tensors=tensors)


class MatvecRate(BaseModel):
    """One weight type's measured mat-vec: bytes read and time (test-backend-ops perf)."""

    type: str
    bytes: float
    time_us: float
    shape: str = ""

    @property
    def GBps(self) -> float:
        return self.bytes / self.time_us / 1e3


class LlamaCppProfile(BaseModel):
    """``ceiling calibrate --engine llamacpp``: llama.cpp's own kernels on one GPU."""

    schema_version: int = SCHEMA_VERSION
    kind: str = "llamacpp-kernels"
    gpu: str | None = None
    source: str = ""
    matvec: dict[str, MatvecRate] = Field(default_factory=dict)


class LlamaCppPart(BaseModel):
    name: str
    type: str | None = None
    bytes: float = 0.0
    expected_ms: float
    bound_ms: float
    source: str


class LlamaCppPrediction(BaseModel):
    schema_version: int = SCHEMA_VERSION
    kind: str = "predict-llamacpp"
    gguf: str
    arch: str
    gpu: str
    context: int
    cuda_graphs: bool
    flash_attention: bool
    bytes_per_token: float
    step_ms: float = Field(description="expected single-stream decode step")
    bound_ms: float = Field(description="bytes at the datasheet bandwidth")
    tok_s: float
    evidence: str = Field(description="priors, or the calibrate profile used")
    parts: list[LlamaCppPart] = Field(default_factory=list)


def _weights_read(info: GgufInfo) -> Iterator[tuple[GgufTensor, float]]:
    """Each weight tensor with the share of it one token reads."""
    n_exp = int(info.key("expert_count", 0) or 0)
    used = int(info.key("expert_used_count", 0) or 0)
    for t in info.tensors:
        if not t.name.endswith(".weight") or len(t.shape) < 2:
            continue  # norms and biases: small kernels
        if t.name.startswith("token_embd"):
            yield t, 1.0 / t.shape[1]  # one row per token (get_rows)
        elif "_exps." in t.name and n_exp:
            yield t, used / n_exp
        else:
            yield t, 1.0


def predict_gguf(
    gguf: str | Path | GgufInfo,
    gpu_name: str,
    bandwidth_GBps: float,
    context: int = 1024,
    cuda_graphs: bool = True,
    flash_attention: bool = True,
    profile: LlamaCppProfile | None = None,
) -> LlamaCppPrediction:
    """The single-stream decode step of ``gguf`` (a file or its read header) on one GPU of
    ``bandwidth_GBps``."""
    info = gguf if isinstance(gguf, GgufInfo) else read_gguf(gguf)
    pri, kern = kernel_data()["priors"], kernel_data()["kernels"]
    by_type: dict[str, list[float]] = {}
    for t, share in _weights_read(info):
        by_type.setdefault(t.type, []).append(t.nbytes * share)
    parts: list[LlamaCppPart] = []
    bw = bandwidth_GBps * 1e9
    for typ, sizes in sorted(by_type.items()):
        total = sum(sizes)
        rate = profile.matvec.get(typ) if profile else None
        if rate is not None:
            # measured on a matrix large enough that its fixed cost is inside the rate
            exp_s, src = total / (rate.GBps * 1e9), f"llama.cpp mat-vec {rate.GBps:.0f} GB/s"
        else:
            exp_s = len(sizes) * pri["matvec_t0_us"] * 1e-6 + total / (pri["matvec_eff"] * bw)
            src = f"prior: {pri['matvec_t0_us']} us + {pri['matvec_eff']} x bandwidth"
        parts.append(LlamaCppPart(name=f"weights {typ}", type=typ, bytes=total,
                                  expected_ms=exp_s * 1e3, bound_ms=total / bw * 1e3,
                                  source=src))  # fmt: skip
    layers = int(info.key("block_count", 0) or 0)
    kv_heads = int(info.key("attention.head_count_kv", 0) or 0)
    head_dim = int(info.key("attention.key_length", 0) or 0)
    if not head_dim and info.key("attention.head_count"):
        head_dim = int(info.key("embedding_length")) // int(info.key("attention.head_count"))
    kv_bytes = 2 * layers * kv_heads * head_dim * 2 * context  # K and V, f16
    kv_extra = 1.0 if flash_attention else 2.0  # without FA the scores are written and re-read
    parts.append(LlamaCppPart(name="KV cache (f16)", bytes=kv_bytes,
                              expected_ms=kv_extra * kv_bytes / (pri["matvec_eff"] * bw) * 1e3,
                              bound_ms=kv_bytes / bw * 1e3,
                              source=f"context {context}"))  # fmt: skip
    moe = bool(info.key("expert_count"))
    per_layer = kern["moe_layer" if moe else "dense_layer"]["small"]
    if not flash_attention:
        per_layer += kern["attention_off_extra_small"]
    small = layers * per_layer + kern["head"]["small"]
    small_us = pri["small_us_graph"] if cuda_graphs else pri["small_us_eager"]
    parts.append(LlamaCppPart(name="small kernels", expected_ms=small * small_us * 1e-3,
                              bound_ms=0.0, source=f"{small} x {small_us} us "
                              f"({'CUDA graph' if cuda_graphs else 'eager'})"))  # fmt: skip
    step = sum(p.expected_ms for p in parts)
    total_bytes = sum(p.bytes for p in parts)
    return LlamaCppPrediction(
        gguf=info.path, arch=info.arch, gpu=gpu_name, context=context, cuda_graphs=cuda_graphs,
        flash_attention=flash_attention, bytes_per_token=total_bytes, step_ms=step,
        bound_ms=sum(p.bound_ms for p in parts), tok_s=1000.0 / step,
        evidence=f"llama.cpp kernels measured: {profile.source}" if profile else "priors only",
        parts=parts,
    )  # fmt: skip


_SQL_INSERT = re.compile(r"^INSERT INTO test_backend_ops \((.*?)\) VALUES \((.*)\);\s*$")
_SQL_VALUE = re.compile(r"'((?:[^']|'')*)'|([^,\s][^,]*)")
_PARAM = re.compile(r"type_a=(\w+),type_b=\w+,m=(\d+),n=1,k=(\d+),")


def profile_from_sql(text: str, gpu: str | None = None, source: str = "") -> LlamaCppProfile:
    """``test-backend-ops perf --output sql`` (MUL_MAT at one token) -> a profile: each weight
    type's bytes read (its block layout at m x k) over the measured time per run."""
    prof = LlamaCppProfile(gpu=gpu, source=source or "test-backend-ops perf (MUL_MAT, n=1)")
    for line in text.splitlines():
        m = _SQL_INSERT.match(line)
        if not m:
            continue
        names = [c.strip() for c in m.group(1).split(",")]
        values = [a.replace("''", "'") if a else b.strip() for a, b in _SQL_VALUE.findall(m[2])]
        row = dict(zip(names, values, strict=False))
        p = _PARAM.search(row.get("op_params", ""))
        if row.get("op_name") != "MUL_MAT" or not p or float(row.get("time_us") or 0) <= 0:
            continue
        typ = p.group(1).upper()
        if typ not in kernel_data()["types"]:
            continue
        rows_, cols = int(p.group(2)), int(p.group(3))
        nbytes = rows_ * cols * bits_per_weight(typ) / 8.0
        prof.gpu = prof.gpu or row.get("device_description") or None
        prof.matvec[typ] = MatvecRate(type=typ, bytes=nbytes, time_us=float(row["time_us"]),
                                      shape=f"{rows_}x{cols}")  # fmt: skip
    if not prof.matvec:
        raise CeilingError(
            "no MUL_MAT timing at one token in the test-backend-ops output",
            fix="run `test-backend-ops perf -b CUDA0 -o MUL_MAT --output sql -p 'n=1,'`",
        )
    return prof


def run_backend_ops(binary: str | Path, types: list[str], timeout_s: float = 300.0) -> str:
    """Run llama.cpp's ``test-backend-ops perf`` for the mat-vec of ``types`` (one token, its
    4096 x 14336 case: a matrix of 33-117 MB, past launch overhead) on the first CUDA device."""
    names = "|".join(t.lower().replace("_k", "_K") for t in types)
    argv = [str(binary), "perf", "-b", "CUDA0", "-o", "MUL_MAT", "--output", "sql",
            "-p", f"type_a=({names}),type_b=f32,m=4096,n=1,k=14336,"]  # fmt: skip
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CeilingError(f"test-backend-ops did not run: {exc}",
                           fix="pass --test-backend-ops PATH (bench/gpu/llamacpp_cuda.sh builds it)") from None  # fmt: skip
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise CeilingError(f"test-backend-ops failed: {tail}", fix="check the CUDA device")
    return proc.stdout


def load_profile(path: str | Path) -> LlamaCppProfile:
    """A profile written by ``ceiling calibrate --engine llamacpp``."""
    p = Path(path)
    try:
        return LlamaCppProfile.model_validate_json(p.read_text())
    except (OSError, ValueError) as exc:
        raise CeilingError(
            f"{p} is not a llama.cpp kernel profile ({type(exc).__name__})",
            fix="write one with `ceiling calibrate --engine llamacpp --out FILE`",
        ) from None


def predict_cli(
    gguf: str | Path | None,
    gpu: str,
    context: int,
    cuda_graphs: bool,
    profile: str | None,
) -> LlamaCppPrediction:
    """``ceiling predict --engine llamacpp --gguf FILE --gpu NAME [--profile FILE]``."""
    from ceiling.spec.hardware import load_gpu

    if gguf is None:
        raise CeilingError(
            "predict --engine llamacpp reads the weight types from a GGUF file",
            fix="pass --gguf FILE.gguf (its header is read; no tensor data)",
        )
    hw = load_gpu(gpu)
    prof = load_profile(profile) if profile else None
    return predict_gguf(gguf, gpu, hw.mem_bw_GBps, context, cuda_graphs, profile=prof)


def calibrate_cli(
    binary: str | None, recorded: str | None, gguf: str | None, out: str | None
) -> LlamaCppProfile:
    """``ceiling calibrate --engine llamacpp``: run test-backend-ops (or read its recorded SQL
    output) for the weight types of ``gguf`` (default: F16, Q8_0, Q6_K, Q5_K, Q4_K, IQ4_XS)."""
    types = ["F16", "Q8_0", "Q6_K", "Q5_K", "Q4_K", "IQ4_XS"]
    if gguf:
        types = sorted({t.type for t, _ in _weights_read(read_gguf(gguf))} - {"F32"}) or types
    if recorded:
        p = Path(recorded)
        try:
            text = p.read_text()
        except OSError as exc:
            raise CeilingError(
                f"cannot read {p}: {exc.strerror}", fix="pass the SQL file"
            ) from None
        prof = profile_from_sql(text, source=str(p))
    elif binary:
        prof = profile_from_sql(run_backend_ops(binary, types), source=f"{binary} perf")
    else:
        raise CeilingError(
            "calibrate --engine llamacpp needs llama.cpp's test-backend-ops",
            fix="pass --test-backend-ops PATH (bench/gpu/llamacpp_cuda.sh build makes it), or "
            "--from-output FILE with a recorded `--output sql` run",
        )
    if out:
        write_atomic(Path(out), prof.model_dump_json(indent=2) + "\n")
    return prof
