"""A GGUF file's header, and llama.cpp's kernel data (``engines/data/llamacpp_kernels.yaml``).

Why apart from the step (``predict.llamacpp``): the header is a file format (magic, metadata,
tensor infos: a few fixed-width records, docs in ggml/docs/gguf.md), read by predict, by
calibrate (which types to time) and by the doctor (which file a llama-server serves). It is read
here by hand rather than through the ``gguf`` package: predict must not need numpy or a 1 MB
dependency to read 2 KB of header, and no tensor data is touched. The ggml type table (block
layouts) lives in the kernel data file beside the kernels and priors, so the file's schema is
here too and every reader gets it typed.
"""

from __future__ import annotations

import os
import struct
from functools import cache
from pathlib import Path
from typing import Any, BinaryIO

from pydantic import BaseModel, Field, JsonValue

from ceiling.errors import CeilingError
from ceiling.inputs import open_regular, size_text
from ceiling.spec._data import load_yaml

_GGUF_MAGIC = b"GGUF"
# GGUF metadata value types: id -> struct format (8: string, 9: array)
_SCALARS = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}


class GgmlType(BaseModel, extra="forbid"):
    """One ggml weight type's block layout: ``bytes`` per block of ``block`` weights."""

    id: int
    block: int = Field(gt=0)
    bytes: int = Field(gt=0)


class LayerKernels(BaseModel, extra="forbid"):
    matvec: int
    small: int
    router: int = 0
    expert_matvec: int = 0


class Kernels(BaseModel, extra="forbid"):
    dense_layer: LayerKernels
    moe_layer: LayerKernels
    attention_off_extra_small: int
    head: LayerKernels


class Priors(BaseModel, extra="forbid"):
    matvec_t0_us: float = Field(gt=0)
    matvec_eff: float = Field(gt=0, le=1)
    small_us_graph: float = Field(gt=0)
    small_us_eager: float = Field(gt=0)


class LlamaCppKernelsFile(BaseModel, extra="forbid"):
    """Schema of engines/data/llamacpp_kernels.yaml (a misspelled key fails at load)."""

    schema_version: int
    types: dict[str, GgmlType]
    kernels: Kernels
    priors: Priors
    split_modes: dict[str, str]


@cache
def kernel_data() -> LlamaCppKernelsFile:
    """engines/data/llamacpp_kernels.yaml, validated by its schema (read once)."""
    return load_yaml("llamacpp_kernels.yaml", folder="engines/data", schema=LlamaCppKernelsFile)


def bits_per_weight(type_name: str) -> float:
    """Bits per weight of a ggml type, from its block layout (Q4_K: 4.5)."""
    types = kernel_data().types
    t = types.get(type_name.upper())
    if t is None:
        raise CeilingError(
            f"unknown GGUF weight type {type_name!r}", fix=f"one of: {', '.join(types)}"
        )
    return 8.0 * t.bytes / t.block


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
    # heterogeneous by the format itself (numbers, strings, arrays): read through key()
    metadata: dict[str, JsonValue] = Field(default_factory=dict)
    tensors: list[GgufTensor] = Field(default_factory=list)

    def key(self, name: str, default: JsonValue = None) -> JsonValue:
        return self.metadata.get(f"{self.arch}.{name}", default)

    def int_key(self, name: str) -> int:
        """An integer of the architecture's metadata (0 when absent)."""
        value = self.key(name, 0)
        if isinstance(value, (list, dict)):  # an array (or its long-array count): no integer
            raise CeilingError(
                f"GGUF key {self.arch}.{name} is an array, not a number",
                fix="pass a GGUF file written by llama.cpp's converter",
            )
        return int(value or 0)


#: The most of a GGUF file read as its header. Real headers hold a vocabulary and the tensor
#: table: a few MB (a 256k-token vocabulary with its merges is ~10 MB); the file itself is
#: gigabytes of tensor data that predict never reads.
MAX_HEADER_BYTES = 64 << 20
_FIX = "pass a .gguf file written by llama.cpp's converter"


class _Header:
    """The start of a GGUF file, read through a budget: a header that claims more than
    :data:`MAX_HEADER_BYTES` (a corrupt count, a hostile file) is refused before it is read."""

    def __init__(self, f: BinaryIO, path: Path) -> None:
        self.f, self.path, self.left = f, path, MAX_HEADER_BYTES

    def need(self, n: int) -> None:
        """Refuse, unread, a count whose items cannot fit in what is left of the budget."""
        if n > self.left:
            raise CeilingError(
                f"{self.path}: the GGUF header is larger than {size_text(MAX_HEADER_BYTES)} "
                "(a count in it is corrupt)",
                fix=_FIX,
            )

    def take(self, n: int) -> bytes:
        self.need(n)
        raw = self.f.read(n)
        if len(raw) != n:
            raise CeilingError(
                f"{self.path}: the GGUF file ends inside its header",
                fix="pass a complete .gguf file",
            )
        self.left -= n
        return raw


def _read(h: _Header, fmt: str) -> Any:
    return struct.unpack("<" + fmt, h.take(struct.calcsize("<" + fmt)))[0]


def _string(h: _Header) -> str:
    return h.take(_read(h, "Q")).decode("utf-8", "replace")


def _value(h: _Header, vtype: int) -> Any:
    if vtype in _SCALARS:
        return _read(h, _SCALARS[vtype])
    if vtype == 8:
        return _string(h)
    if vtype == 9:
        etype, n = _read(h, "I"), _read(h, "Q")
        if etype in _SCALARS:  # one read for the whole array, however long
            raw = h.take(n * struct.calcsize("<" + _SCALARS[etype]))
            items = list(struct.unpack(f"<{n}{_SCALARS[etype]}", raw)) if n <= 64 else []
        else:
            h.need(n * 8)  # a string or an array is at least its 8-byte length
            items = [_value(h, etype) for _ in range(n)]
        # vocabularies are long and say nothing about kernels: keep a count only
        return items if n <= 64 else {"array_len": n}
    raise CeilingError(f"unknown GGUF metadata type {vtype}", fix="pass a GGUF v2/v3 file")


def read_gguf(path: str | Path) -> GgufInfo:
    """The header of a GGUF file (no tensor data is read): a regular file (a FIFO or a device
    is refused, not opened for a blocking read), at most :data:`MAX_HEADER_BYTES` of it."""
    p = Path(path)
    ids = {v.id: k for k, v in kernel_data().types.items()}
    with open_regular(p, "GGUF file", fix=_FIX) as f:
        h = _Header(f, p)
        if f.read(4) != _GGUF_MAGIC:
            raise CeilingError(f"{p} is not a GGUF file (no GGUF magic)", fix="pass a .gguf file")
        version = _read(h, "I")
        if version < 2:
            raise CeilingError(f"{p}: GGUF version {version} is too old", fix="convert it anew")
        n_tensors, n_kv = _read(h, "Q"), _read(h, "Q")
        h.need(n_kv * 12 + n_tensors * 24)  # the smallest record of each
        meta: dict[str, Any] = {}
        for _ in range(n_kv):
            k = _string(h)
            meta[k] = _value(h, _read(h, "I"))
        tensors = []
        for _ in range(n_tensors):
            name = _string(h)
            n_dims = _read(h, "I")
            h.need(n_dims * 8)
            dims = [_read(h, "Q") for _ in range(n_dims)]
            tid = _read(h, "I")
            _read(h, "Q")  # offset
            if tid not in ids:
                raise CeilingError(
                    f"{p}: tensor {name} has ggml type {tid}, not in ceiling's table",
                    fix="update engines/data/llamacpp_kernels.yaml",
                )
            tensors.append(GgufTensor(name=name, type=ids[tid], shape=dims))
    arch = str(meta.get("general.architecture", "llama"))
    return GgufInfo(path=str(p), arch=arch, metadata=meta, tensors=tensors)


def gguf_error(path: str | Path) -> CeilingError | None:
    """Why ``path`` is not a GGUF file ceiling can read (a FIFO, a directory, a device, a file
    without the GGUF magic), or None: a GGUF file, or nothing there at all (a catalog name: the
    caller says what it needs). A FIFO is never opened for a read that would block."""
    if not os.path.lexists(path):
        return None
    try:
        with open_regular(path, "GGUF file", fix=_FIX) as f:
            if f.read(4) == _GGUF_MAGIC:
                return None
    except OSError as exc:
        return CeilingError(f"cannot read GGUF file {path}: {exc.strerror}", fix=_FIX)
    except CeilingError as err:
        return err
    return CeilingError(f"{path} is not a GGUF file (no GGUF magic)", fix=_FIX)


def is_gguf(path: str | Path) -> bool:
    """Whether ``path`` is a regular file that starts with the GGUF magic."""
    return os.path.lexists(path) and gguf_error(path) is None
