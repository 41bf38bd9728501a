"""The doctor's llama.cpp stage: the one-stream bandwidth verdict of a llama-server run on a GPU,
and the server's own cost when a llama-bench result is at hand (reads the GGUF and the files)."""

from __future__ import annotations

from pathlib import Path

from ceiling.diagnose.llamacpp import server_cost_finding
from ceiling.diagnose.schema import DoctorConfig, DoctorResult
from ceiling.engines.llamacpp_gap import (
    BandwidthGap,
    bandwidth_gap,
    read_llama_bench,
    server_cost,
)
from ceiling.errors import CeilingError
from ceiling.predict.gguf import read_gguf
from ceiling.predict.llamacpp import load_profile
from ceiling.spec.hardware import load_gpu


def for_doctor(
    res: DoctorResult, llama_bench: str | None, profile: str | None = None
) -> BandwidthGap | None:
    """The one-stream bandwidth verdict of a doctor run on llama-server with a GPU: None when the
    run is not one (another engine, a CPU, no measured step, no readable GGUF)."""
    facts, hw, m = res.facts, res.hardware, res.measured
    if facts is None or facts.engine != "llamacpp" or hw is None or hw.kind != "gpu" or m is None:
        if llama_bench or profile:
            raise CeilingError("--llama-bench and --llamacpp-profile apply to a llama-server run on a GPU",
                               fix="drop them, or run the doctor on llama-server")  # fmt: skip
        return None
    if not facts.model or not Path(facts.model).is_file():
        raise CeilingError(f"the served GGUF {facts.model!r} is not readable here",
                           fix="run the doctor where the GGUF file is")  # fmt: skip
    cost = None
    if llama_bench:
        cost = server_cost(m.step_ms, read_llama_bench(llama_bench), facts.model,
                           facts.flash_attention, source=llama_bench)  # fmt: skip
        res.findings.append(server_cost_finding(cost))
    return bandwidth_gap(
        read_gguf(facts.model), m.step_ms, hw.name, load_gpu(hw.name).mem_bw_GBps,
        context=res.config.single_context,
        flash_attention=facts.flash_attention is not False,
        cuda_graphs=facts.enforce_eager is not True,
        gpu_layers=facts.gpu_layers, gpu_layers_total=facts.gpu_layers_total,
        profile=load_profile(profile) if profile else None, server=cost,
    )  # fmt: skip


def attach(res: DoctorResult, cfg: DoctorConfig) -> str:
    """Put the bandwidth verdict on ``res.verdict`` (a llama-server run on a GPU); the stage's line."""
    gap = for_doctor(res, cfg.llama_bench, cfg.llamacpp_profile)
    if res.verdict is not None:
        res.verdict.llamacpp = gap
    return gap.sentence if gap else "not a llama-server run on a GPU"
