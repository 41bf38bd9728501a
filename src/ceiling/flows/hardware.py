"""What a doctor examines, found on the box: the hardware (probed GPUs, the ``--gpu`` named, or
this CPU measured on the spot) and the model directory to predict. I/O (NVML/nvidia-smi, a CPU
measurement, the file system), so it lives in the flow layer; ``ceiling.diagnose.expect`` turns
what is found here into the expectation, without I/O.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ceiling.diagnose.expect import GgufFile, serves_gguf
from ceiling.diagnose.facts import EngineFacts
from ceiling.diagnose.schema import DoctorConfig
from ceiling.errors import CeilingError
from ceiling.flows.setup_seen import catalog_name_of
from ceiling.flows.target import server_props
from ceiling.predict.gguf import is_gguf
from ceiling.probe.cpu_host import describe_cpu
from ceiling.probe.topology import probe
from ceiling.server.schema import ServedModel
from ceiling.spec.hardware import GpuHardware, Hardware


def describe_hardware(cfg: DoctorConfig) -> tuple[Hardware, list[str]]:
    """(the hardware, assumptions it adds): probed GPUs, the ``--gpu`` named, else this CPU
    (measured unless ``measure_cpu`` is off)."""
    topo = probe()
    if topo.gpus and not cfg.gpu:
        g = topo.gpus[0]
        return GpuHardware(
            name=g.catalog_name or g.name,
            gpus=len(topo.gpus),
            link=topo.link_for([x.index for x in topo.gpus]),
            # peer-to-peer on every pair (None: not probed); findings check advice against it
            p2p=None
            if not topo.pairs or any(p.p2p is None for p in topo.pairs)
            else all(p.p2p for p in topo.pairs),
            description=f"{len(topo.gpus)} x {g.name}"
            + (
                f" (catalog: {g.catalog_name})"
                if g.catalog_name
                else " (not in the predict catalog: pass --gpu)"
            ),
        ), []
    if cfg.gpu:
        return GpuHardware(
            name=cfg.gpu,
            gpus=cfg.tp or 1,
            description=f"{cfg.gpu} (given with --gpu, not probed)",
        ), []
    cpu = describe_cpu(measure=cfg.measure_cpu, gpu_probe=topo.reason or "no NVIDIA GPU found")
    notes = [] if cpu.measured else [f"CPU rates are assumed, not measured: {cpu.source}"]
    return cpu, notes


def find_model_dir(cfg: DoctorConfig, variant: Any, models: list[ServedModel]) -> str | None:
    """The model to predict: ``--model``, the variant's model, else the served root (an HF id
    the catalog holds: its catalog entry)."""
    if cfg.model_path:
        return cfg.model_path
    if variant is not None and variant.model_path() is not None:
        return str(variant.model_path())
    for m in models:
        if m.root and Path(m.root).exists():
            return m.root
    root = models[0].root if models else None
    # an HF id the catalog holds (a server that loaded it from the hub): its catalog entry
    return (catalog_name_of(root) or root) if root else None


def find_gguf(
    cfg: DoctorConfig, variant: Any, facts: EngineFacts | None, url: str | None
) -> GgufFile | None:
    """The GGUF a llama.cpp target serves, readable here: ``--model``, the variant's model, the
    file llama-server's ``/props`` names, else the one its start-up log loaded."""
    found = [
        (cfg.model_path, "--model"),
        (
            str(variant.model_path()) if variant is not None and variant.model_path() else None,
            "the variant's model",
        ),
    ]
    for path, source in found:
        if path and is_gguf(path):
            return GgufFile(path=path, source=source)
    props = server_props(url) if url else None  # asked only when the files above did not say
    for path, source in (
        (props.model_path if props else None, "the server's /props"),
        (facts.model if facts is not None else None, "the start-up log"),
    ):
        if path and is_gguf(path):
            return GgufFile(path=path, source=source)
    return None


def target_gguf(
    cfg: DoctorConfig,
    variant: Any,
    engine: str | None,
    facts: EngineFacts | None,
    url: str | None,
) -> GgufFile | None:
    """The GGUF of a llama.cpp target (None: the target is not llama.cpp); CeilingError when
    none is readable here: a llama.cpp server is not predicted from a model it does not serve."""
    if not serves_gguf(engine, facts):
        return None
    gguf = find_gguf(cfg, variant, facts, url)
    if gguf is None:
        raise CeilingError(
            "a llama.cpp server, and no GGUF file readable here to predict it from "
            "(--model, the variant, /props, the log)",
            fix="pass --model FILE.gguf (the file the server serves)",
        )
    return gguf
