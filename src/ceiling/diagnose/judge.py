"""The doctor's judgement: the measured step against the expectation, and the verdict.

Why a module of its own: it turns the bench results and the prediction (``expect.py``) into the
attribution (measured step against predicted components, per concurrency level too) and the
verdict, without knowing how the flow obtained them. Pure functions: each takes the nouns it
reads and returns a new one; nothing is written into a result in place.
"""

from __future__ import annotations

import contextlib

from ceiling.diagnose.attribute import Attribution, LevelAttribution, attribute, attribute_levels
from ceiling.diagnose.closed_loop import ClosedLoopCapacity, closed_loop_capacity
from ceiling.diagnose.expect import at_concurrency
from ceiling.diagnose.measured import ServerView, levels, measured_step
from ceiling.diagnose.runtime import batch_width
from ceiling.diagnose.schema import DoctorConfig, DoctorResult, Measured
from ceiling.diagnose.verdict import VerdictInputs, build_verdict
from ceiling.diagnose.verdict_model import CpuReadNote, Verdict
from ceiling.engines.diagnosis_data import file_predictor
from ceiling.errors import CeilingError
from ceiling.gap_schema import BandwidthGap
from ceiling.predict.schema import Prediction
from ceiling.spec.hardware import CpuHardware, Hardware, load_link
from ceiling.trace.measured import measured_split
from ceiling.trace.roles import assign as assign_gemm_roles
from ceiling.trace.schema import MeasuredSplit


def level_attributions(cfg: DoctorConfig, res: DoctorResult) -> list[LevelAttribution]:
    """Per concurrency level: the measured step against the prediction at that batch."""
    rows = []
    outcomes = []
    for lv in levels(res.bench.get("concurrency")):
        m = measured_step(lv)
        if m is None or lv.concurrency is None:
            continue
        c = lv.concurrency
        width = batch_width(lv)  # the engine's own count; None without its counters
        outcomes.append(
            {"completed": lv.completed, "failed": lv.failed, "errors": lv.errors}
            | ({"engine_batch": width} if width is not None else {})
        )
        # predicted at the batch the engine ran (its counters), not the one the client sent
        ran = c if width is None or width >= c else max(1, round(width))
        at_c = at_concurrency(cfg, res.prediction, ran) if res.prediction is not None else None
        comps = at_c.components_ms if at_c is not None else {}
        rows.append((c, m.step_ms, comps, lv.output_throughput))
    return attribute_levels(rows, outcomes)


def basis(pred: Prediction, hardware: Hardware | None) -> str:
    """Where the predicted components come from, in one line."""
    if isinstance(hardware, CpuHardware):
        w = pred.details.weight_bytes_read_per_gpu or pred.model.weight_bytes
        flops = pred.details.flops_per_gpu or 0.0
        return (
            f"CPU floors: weights {w / 1e6:.3g} MB and KV at {hardware.mem_bw_GBps:.3g} GB/s, "
            f"{flops / 1e6:.3g} MFLOP per token at {hardware.gflops:.3g} GFLOP/s "
            f"({'measured' if hardware.measured else 'assumed'})"
        )
    if file_predictor(pred.deployment.engine) is not None:  # priced from the file it serves
        return (
            f"predict --engine {pred.deployment.engine} for {pred.hardware.gpu} "
            f"({pred.evidence.tables})"
        )
    return f"predict for {pred.hardware.gpu} (TP={pred.deployment.tp})"


def attribution(res: DoctorResult, m: Measured | None) -> Attribution | None:
    """The single-stream step split into the predicted components and the remainder."""
    if m is None or res.prediction is None:
        return None
    pred = res.prediction
    return attribute(
        m.step_ms,
        pred.components_ms,
        basis=f"{basis(pred, res.hardware)}; measured step: {m.source}",
        measured_ci_ms=m.step_ci_ms,
        kinds=pred.component_kind,  # type: ignore[arg-type]
    )


def _link_bw(pred: Prediction | None) -> float | None:
    if pred is None or not pred.hardware.link:
        return None
    with contextlib.suppress(CeilingError):
        return load_link(pred.hardware.link).bw_GBps
    return None


def traced_split(res: DoctorResult) -> MeasuredSplit | None:
    """The single-stream window's split against the prediction (None: no window recorded).
    predict's figures are at batch 1, as the single-stream window runs."""
    win = next((t for t in res.traces if t.recorded and t.label == "single" and t.split), None)
    if win is None or win.split is None:
        return None
    sp = win.split
    # against the model's own evidence where the trace fed the prediction (not itself)
    pred = res.model_prediction or res.prediction
    if pred is not None:  # GEMMs by layer role where the positions match predict's
        sp = assign_gemm_roles(sp, pred)
    ms = measured_split(sp, pred, win.label, win.files)
    single = measured_step(res.bench.get("single"))
    if single is not None and single.step_ms > 0:
        ms.notes.append(
            f"The traced step ({ms.step_ms:.3g} ms) is "
            f"{(ms.step_ms / single.step_ms - 1) * 100:+.3g} % against the untraced bench step "
            f"({single.step_ms:.3g} ms): the profiler's own cost; the split's shares hold, "
            "its milliseconds are of the traced step"
        )
    return ms


def verdict(cfg: DoctorConfig, res: DoctorResult, bandwidth: BandwidthGap | None = None) -> Verdict:
    """The verdict on what ``res`` holds (its measurement, prediction, findings, levels);
    ``bandwidth``: the engine's own split of the single-stream step, the gap's basis."""
    single = res.bench.get("single")
    m = measured_step(single)
    hw = res.hardware
    pred = res.prediction
    floors = cpu_read = None
    if isinstance(hw, CpuHardware) and pred is not None:
        w = int(pred.details.weight_bytes_read_per_gpu or pred.model.weight_bytes)
        floors = f"{w / 1e6:.3g} MB of weights per step at {hw.mem_bw_GBps:.3g} GB/s"
        if res.attribution is not None:
            cpu_read = CpuReadNote(
                weight_bytes=w,
                mem_bw_GBps=hw.mem_bw_GBps,
                step_ms=res.attribution.measured_step_ms,
                llc_bytes=hw.llc_bytes,
            )
    itl = ServerView.of(single).quantity("itl")
    return build_verdict(
        VerdictInputs(
            attribution=res.attribution,
            measured_tok_s=m.tok_s if m else None,
            measured_ci=m.tok_s_ci if m else None,
            prediction=pred,
            prediction_note=res.prediction_note,
            hardware_kind="cpu" if isinstance(hw, CpuHardware) else "gpu",
            link_bw_GBps=_link_bw(pred),
            findings=res.findings,
            flag_checks=res.flag_checks,
            levels=res.levels,
            server_itl_ms=itl.server_mean_ms,
            client_itl_ms=itl.client_mean_ms,
            target_tok_s=cfg.target_tok_s,
            floors_detail=floors,
            server_death=res.server_death if res.server_died else None,
            cpu_read=cpu_read,
            measured_split=traced_split(res),
            bandwidth=bandwidth,
            capacity=_capacity(cfg, res),
        )
    )


def _capacity(cfg: DoctorConfig, res: DoctorResult) -> ClosedLoopCapacity | None:
    """--slo: the concurrency sweep's levels judged against them (None: no SLOs given)."""
    if not cfg.slo:
        return None
    sweep = res.bench.get("concurrency")
    return closed_loop_capacity(sweep.levels if sweep else [], [s.text for s in cfg.slo])
