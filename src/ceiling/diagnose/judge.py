"""The measured side of the doctor and its judgement: decode step, attribution, verdict.

Why a module of its own: it turns the bench results and the expectation (``expect.py``) into
the attribution (measured step against predicted components, per concurrency level too) and the
verdict, without knowing how the flow obtained them.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from ceiling.diagnose.expect import predict_gpu
from ceiling.errors import CeilingError

if TYPE_CHECKING:
    from ceiling.diagnose.doctor import DoctorConfig, DoctorResult


class Measured(BaseModel):
    """The decode step as measured, and where the number comes from."""

    step_ms: float
    step_ci_ms: tuple[float, float] | None = None
    tok_s: float
    tok_s_ci: tuple[float, float] | None = None
    source: str


def measured_step(run: dict[str, Any] | None) -> Measured | None:
    """The decode step of a bench result (or one level of it).

    The client's per-stream rate (with its CI across repeats) is the default. When the engine
    reports its own inter-token latency (bench's ``server_metrics``, from /metrics) and the two
    disagree by more than CLIENT_AGREEMENT_PCT, the engine's number is the decode step: a
    starved client or frontend delivers tokens in bursts, and then the client's timing
    describes the delivery, not the step (throughput-killers.md H1).
    """
    from ceiling.diagnose.verdict import CLIENT_AGREEMENT_PCT
    from ceiling.report.extract import decode_stat

    if not run:
        return None
    mean, lo, hi = decode_stat(run)
    if mean is None and run.get("mean_tpot_ms"):
        mean = 1000.0 / float(run["mean_tpot_ms"])
    itl = ((run.get("server_metrics") or {}).get("quantities") or {}).get("itl") or {}
    srv = itl.get("server_mean_ms")
    client_step = 1000.0 / mean if mean else None
    if srv and (client_step is None or abs(client_step - srv) > CLIENT_AGREEMENT_PCT / 100 * srv):
        seen = (
            f"; the client's decode rate implies {client_step:.3g} ms per token"
            if client_step
            else ""
        )
        return Measured(
            step_ms=float(srv),
            tok_s=1000.0 / float(srv),
            source=(
                f"the engine's own inter-token latency ({itl.get('metric')}, "
                f"{int(itl.get('count') or 0)} tokens, /metrics){seen}: the client's timing "
                "is not the decode step here"
            ),
        )
    if client_step is None:
        return None
    ci = (lo, hi) if lo is not None and hi is not None else None
    step_ci = (1000.0 / hi, 1000.0 / lo) if ci and lo > 0 and hi > 0 else None
    return Measured(
        step_ms=client_step,
        step_ci_ms=step_ci,
        tok_s=mean,
        tok_s_ci=ci,
        source="client-measured decode rate (ceiling bench, per stream)"
        + (f"; the engine's own inter-token latency agrees ({srv:.3g} ms)" if srv else ""),
    )


def level_attributions(
    cfg: DoctorConfig, res: DoctorResult, footprint: Any, host: Any, variant: Any
) -> list[Any]:
    from ceiling.diagnose.attribute import attribute_levels
    from ceiling.report.extract import concurrency_points

    pts = concurrency_points(res.bench.get("concurrency"))
    rows = []
    outcomes = []
    for p in pts:
        m = measured_step(p)
        if m is None:
            continue
        outcomes.append(
            {"completed": p.get("completed"), "failed": p.get("failed"), "errors": p.get("errors")}
        )
        c = int(p["concurrency"])
        if host is not None and footprint is not None:
            from ceiling.diagnose.cpu_host import cpu_floor_components

            ctx = cfg.input_len + cfg.concurrency_max_tokens // 2
            comps = cpu_floor_components(footprint, host, batch=c, context=ctx)
        elif res.prediction and res.model:
            try:
                comps = predict_gpu(cfg, res, res.model["path"], variant, batch=c, what_if=False)[
                    "components_ms"
                ]
            except CeilingError:
                comps = {}
        else:
            comps = {}
        rows.append((c, m.step_ms, comps, p.get("output_throughput")))
    return attribute_levels(rows, outcomes)


def attribute_result(
    cfg: DoctorConfig, res: DoctorResult, footprint: Any, host: Any, variant: Any
) -> None:
    from ceiling.diagnose.attribute import attribute

    m = measured_step(res.bench.get("single"))
    levels = level_attributions(cfg, res, footprint, host, variant)
    res.levels = [lv.model_dump() for lv in levels]
    if m is None or not res.prediction:
        return
    res.measured = m.model_dump()
    comps = res.prediction.get("components_ms") or {}
    if host is not None:
        basis = (
            f"CPU floors: weights {footprint.weight_bytes / 1e6:.3g} MB and KV at "
            f"{host.mem_bw_GBps:.3g} GB/s, {2 * footprint.params / 1e6:.3g} MFLOP per token "
            f"at {host.gflops:.3g} GFLOP/s ({'measured' if host.measured else 'assumed'})"
        )
    else:
        basis = (
            f"predict for {res.hardware.get('name')} "
            f"(TP={res.prediction.get('deployment', {}).get('tp', '?')})"
        )
    a = attribute(
        m.step_ms,
        comps,
        basis=f"{basis}; measured step: {m.source}",
        measured_ci_ms=m.step_ci_ms,
        kinds=res.prediction.get("component_kind"),
    )
    res.attribution = a.model_dump()


def verdict_result(cfg: DoctorConfig, res: DoctorResult, footprint: Any, host: Any) -> None:
    from ceiling.diagnose.attribute import Attribution, LevelAttribution
    from ceiling.diagnose.verdict import VerdictInputs, build_verdict

    m = measured_step(res.bench.get("single"))
    mean, ci = (m.tok_s, m.tok_s_ci) if m else (None, None)
    pred = res.prediction if (res.prediction or {}).get("kind") != "cpu-floors" else None
    floors = None
    if host is not None and footprint is not None:
        floors = (
            f"{footprint.weight_bytes / 1e6:.3g} MB of weights per step at "
            f"{host.mem_bw_GBps:.3g} GB/s"
        )
    hidden = (
        footprint.hidden_size
        if footprint
        else ((res.prediction or {}).get("model", {}).get("hidden_size"))
    )
    tp = int(((res.prediction or {}).get("deployment") or {}).get("tp") or cfg.tp or 1)
    details = (pred or {}).get("details") or {}
    link_bw = None
    link_name = ((pred or {}).get("hardware") or {}).get("link")
    if link_name:
        from ceiling.spec.hardware import load_link

        with contextlib.suppress(CeilingError):
            link_bw = load_link(link_name).bw_GBps
    itl = (
        (((res.bench.get("single") or {}).get("server_metrics") or {}).get("quantities")) or {}
    ).get("itl") or {}
    inp = VerdictInputs(
        server_itl_ms=itl.get("server_mean_ms"),
        client_itl_ms=itl.get("client_mean_ms"),
        allreduce_bytes=details.get("allreduce_bytes"),
        allreduces_per_step=details.get("allreduces"),
        link_bw_GBps=link_bw,
        attribution=Attribution(**res.attribution) if res.attribution else None,
        measured_tok_s=mean,
        measured_ci=ci,
        prediction=pred,
        prediction_note=res.prediction_note,
        hardware_kind="cpu" if host is not None else "gpu",
        tp=tp,
        hidden_size=hidden,
        findings=res.findings,
        flag_checks=res.flag_checks,
        levels=[LevelAttribution(**lv) for lv in res.levels],
        target_tok_s=cfg.target_tok_s,
        floors_detail=floors,
    )
    v = build_verdict(inp)
    if host is not None and footprint is not None and res.attribution:
        w_ms = footprint.weight_bytes / (host.mem_bw_GBps * 1e9) * 1e3
        m_ms = res.attribution["measured_step_ms"]
        v.notes.insert(
            0,
            f"The numbers that decide it: reading {footprint.weight_bytes / 1e6:.3g} MB of "
            f"weights at this CPU's {host.mem_bw_GBps:.3g} GB/s takes {w_ms * 1000:.3g} us, "
            f"while a measured decode step takes {m_ms:.3g} ms ({m_ms / w_ms:.0f}x longer): "
            "the time goes to the framework (Python, scheduling, per-operator dispatch), "
            "not to memory traffic."
            + (
                f" The weights even fit in this CPU's {host.llc_bytes / 2**20:.0f} MiB "
                "last-level cache, so the DRAM-speed figure is an upper bound of the read time."
                if host.llc_bytes and footprint.weight_bytes < host.llc_bytes
                else ""
            ),
        )
    if res.server_died:
        v.notes.insert(
            0, f"The server died {res.server_death}; the verdict uses what was measured before."
        )
    res.verdict = v.model_dump()
