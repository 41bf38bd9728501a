"""The one setup a doctor report describes: what the user stated, checked against what ceiling
saw of the server and the box.

A report whose title, prediction and bound describe another model or other hardware than the
server runs is a confident wrong answer (a CPU-served tiny model reported as 70B on four H100s,
its "bound" a million tokens per second). So every ``--model``, ``--gpu``, ``--tp`` and
``--served-model`` is set against what can be seen (``/v1/models``, the start-up log, ``/props``,
the GGUF, the variant launched, the GPUs of this box when the server runs on it) and a
contradiction is refused naming both values, before any slow work. What cannot be seen (a server
on another machine) is taken as given and said so ("as given, not seen").

Pure: the flow gathers :class:`Seen` and :class:`Stated` (``ceiling.flows.setup_seen``: HTTP,
NVML, the files); :func:`resolve` decides. Two models are the same for a prediction when their
shapes are (layers, width, experts): a catalog name and the Hugging Face id it comes from, a
base model and its instruct tune, a GGUF of it. Where no shape is at hand, a size in the names
("70B" against "8B") still tells two models apart; a served alias ("prod") tells nothing.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, Field

from ceiling.errors import CeilingError
from ceiling.spec.hardware import GpuHardware, Hardware

#: A parameter count in a model's name: "Llama-3.1-70B" -> "70", "qwen2.5-0.5b" -> "0.5"
#: (the first one: "Qwen3-30B-A3B" is 30B with 3B active).
_SIZE_TOKEN = re.compile(r"(?:^|[-_ /.])(\d+(?:\.\d+)?)b(?=$|[-_ /.])", re.IGNORECASE)


class ModelShape(BaseModel):
    """What decides a model's prediction, and the name it was read under."""

    name: str
    layers: int
    hidden: int
    experts: int = 0
    weights: str | None = Field(
        None, description="the weights' format (bf16, fp8...); None: a GGUF (predicted as served)"
    )

    def same_as(self, other: ModelShape) -> bool:
        ours = (self.layers, self.hidden, self.experts)
        if ours != (other.layers, other.hidden, other.experts):
            return False
        return self.weights is None or other.weights is None or self.weights == other.weights

    def text(self) -> str:
        moe = f", {self.experts} experts" if self.experts else ""
        weights = f", {self.weights}" if self.weights else ""
        return f"{self.name} ({self.layers} layers, hidden {self.hidden}{moe}{weights})"


class SeenModel(BaseModel):
    """A model the server shows: its name (a path, an HF id, a served id), where it was seen,
    its shape when readable here."""

    name: str
    where: str
    shape: ModelShape | None = None


class Seen(BaseModel):
    """What ceiling saw of the server and of the box it may run on."""

    url: str | None = None
    local: bool = Field(description="the server runs on this box: launched, or a loopback URL")
    served_ids: list[str] = Field(default_factory=list, description="/v1/models ids")
    models: list[SeenModel] = Field(default_factory=list)
    tp: int | None = None
    tp_where: str = ""
    device: str | None = Field(None, description="the start-up log's device: cpu, cuda, gpu")
    box_gpus: list[str] | None = Field(
        None, description="this box's GPUs as the driver names them; None: not probed"
    )
    box_catalog: list[str] = Field(default_factory=list, description="their catalog names")
    box_reason: str | None = Field(None, description="why the box has none")


class Stated(BaseModel):
    """What the user said (None: not said). ``gpu`` is the catalog name ``--gpu`` resolves to."""

    model: str | None = None
    shape: ModelShape | None = None
    gpu: str | None = None
    tp: int | None = None
    served_model: str | None = None


class Setup(BaseModel):
    """The setup the report describes: ``None`` fields are found on the box by the flow (the
    served model's files, the probed GPUs or this CPU, TP 1)."""

    served: str | None = None
    model: str | None = Field(None, description="what predict reads; None: the served model")
    gpu: str | None = Field(None, description="catalog GPU; None: this box's GPUs, else its CPU")
    tp: int | None = None
    notes: list[str] = Field(default_factory=list, description="what is as given, not seen")


def size_in_name(name: str) -> str | None:
    """The parameter count a model's name carries ("70" of ".../Llama-3.1-70B-Instruct")."""
    m = _SIZE_TOKEN.search(name.rsplit("/", 1)[-1])
    return str(float(m.group(1))) if m else None


def _refuse(message: str, fix: str) -> CeilingError:
    return CeilingError(message, fix=fix)


def _served(stated: Stated, seen: Seen) -> str | None:
    if stated.served_model and seen.served_ids and stated.served_model not in seen.served_ids:
        raise _refuse(
            f"--served-model {stated.served_model!r}, but {seen.url} serves "
            + ", ".join(repr(i) for i in seen.served_ids),
            fix="pass --served-model one of those names, or drop it (the first is used)",
        )
    return stated.served_model or (seen.served_ids[0] if seen.served_ids else None)


def _check_model(stated: Stated, seen: Seen) -> list[str]:
    if stated.model is None:
        return []
    fix = (
        "drop --model (the doctor reads the served model), or point --url at the server that "
        f"serves {stated.model}"
    )
    agreed = False
    for m in seen.models:
        if m.shape is not None and stated.shape is not None:
            if not m.shape.same_as(stated.shape):
                raise _refuse(
                    f"--model {stated.shape.text()}, but the server serves "
                    f"{m.shape.text()} ({m.where})",
                    fix=fix,
                )
            agreed = True
            continue
        ours, theirs = size_in_name(stated.model), size_in_name(m.name)
        if ours and theirs and ours != theirs:
            raise _refuse(
                f"--model {stated.model} ({ours.removesuffix('.0')}B), but the server serves "
                f"{m.name} ({theirs.removesuffix('.0')}B, {m.where})",
                fix=fix,
            )
    if agreed:
        return []
    named = ", ".join(f"{m.name!r} ({m.where})" for m in seen.models)
    return [
        f"model {stated.model}: as given (--model), not seen"
        + (f"; the server names {named}" if named else "")
    ]


def _check_gpu(stated: Stated, seen: Seen) -> list[str]:
    where = f"the server at {seen.url}" if seen.url else "the server"
    if stated.gpu is None:
        if seen.local:
            return []
        return [
            f"hardware: this box's, not seen: {where} runs on another machine "
            "(pass --gpu and --tp to name its hardware)"
        ]
    if seen.device == "cpu":
        raise _refuse(
            f"--gpu {stated.gpu}, but the server's start-up log says it runs on the CPU "
            "(device cpu)",
            fix="drop --gpu (the doctor then measures this CPU), or examine the GPU server",
        )
    if not seen.local:
        return [f"GPU {stated.gpu}: as given (--gpu), not seen: {where} runs on another machine"]
    if stated.gpu.endswith((".yaml", ".yml")):  # a GPU of the user's own: no catalog to match
        return []
    if seen.box_gpus == []:
        raise _refuse(
            f"--gpu {stated.gpu}, but {where} runs on this box, which has no GPU "
            f"({seen.box_reason or 'none found'})",
            fix="drop --gpu (the doctor then measures this CPU), or run the doctor on the "
            f"{stated.gpu} machine",
        )
    boxed = seen.box_gpus or []
    if boxed and len(seen.box_catalog) == len(boxed) and stated.gpu not in seen.box_catalog:
        raise _refuse(
            f"--gpu {stated.gpu}, but {where} runs on this box, whose GPUs are "
            f"{len(boxed)} x {boxed[0]} ({seen.box_catalog[0]})",
            fix=f"drop --gpu (the probed {seen.box_catalog[0]} is used), or run the doctor on "
            f"the {stated.gpu} machine",
        )
    return []


def _check_tp(stated: Stated, seen: Seen) -> list[str]:
    if stated.tp is None:
        return []
    if seen.tp is not None and seen.tp != stated.tp:
        raise _refuse(
            f"--tp {stated.tp}, but {seen.tp_where} says tensor-parallel size {seen.tp}",
            fix=f"drop --tp (TP {seen.tp} is read from there), or pass --tp {seen.tp}",
        )
    boxed = seen.box_gpus or []
    if seen.local and boxed and stated.tp > len(boxed):
        raise _refuse(
            f"--tp {stated.tp}, but the server runs on this box, which has {len(boxed)} GPU(s)",
            fix=f"pass --tp {len(boxed)} or less, or drop --tp",
        )
    if seen.tp is None and not seen.local:
        return [f"TP {stated.tp}: as given (--tp), not seen"]
    return []


def resolve(stated: Stated, seen: Seen) -> Setup:
    """The setup to describe; CeilingError (exit 2) naming both values when what the user
    stated contradicts what was seen."""
    served = _served(stated, seen)
    notes = _check_model(stated, seen) + _check_gpu(stated, seen) + _check_tp(stated, seen)
    return Setup(
        served=served,
        model=stated.model,
        gpu=stated.gpu,
        tp=stated.tp if stated.tp is not None else seen.tp,
        notes=notes,
    )


def report_title(served: str | None, hardware: Hardware | None, tp: int | None = None) -> str:
    """The report's title: the served model on the hardware it was predicted for (the GPUs its
    TP uses, not every GPU of the box)."""
    if hardware is None:
        return f"ceiling doctor — {served or 'server'}"
    gpus = (tp or hardware.gpus) if isinstance(hardware, GpuHardware) else 1
    many = f"{gpus} x " if gpus > 1 else ""
    cpu = "CPU " if hardware.kind == "cpu" else ""
    return f"ceiling doctor — {served or 'server'} on {cpu}{many}{hardware.name}"
