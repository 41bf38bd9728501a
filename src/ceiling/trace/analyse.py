"""``ceiling trace FILE...``: read the ranks' traces, split their steps, optionally beside a
prediction, and write the result and a predict profile."""

from __future__ import annotations

from pathlib import Path

from ceiling.errors import CeilingError
from ceiling.outputs import write_atomic
from ceiling.predict.schema import PredictRequest
from ceiling.spec.profile import save_profile
from ceiling.trace.measured import measured_split
from ceiling.trace.profile import to_profile
from ceiling.trace.reader import read_trace
from ceiling.trace.roles import assign as assign_roles
from ceiling.trace.schema import RankTrace, TraceReport
from ceiling.trace.split import split


def parse_window(text: str | None, traces: list[RankTrace]) -> tuple[float, float] | None:
    """``START:END`` in milliseconds from the first recorded event (either side may be empty)
    as trace microseconds."""
    if not text:
        return None
    fix = "give --window START:END in ms from the trace's start, e.g. 5:40 or 10: or :25"
    a, sep, b = text.partition(":")
    try:
        lo = float(a) if a.strip() else 0.0
        hi = float(b) if b.strip() else float("inf")
    except ValueError as exc:
        raise CeilingError(f"--window {text!r} is not START:END", fix=fix) from exc
    if not sep or lo < 0 or hi <= lo:
        raise CeilingError(f"--window {text!r} is not START:END with START < END", fix=fix)
    t0 = min((t.events[0].ts_us for t in traces if t.events), default=0.0)
    return t0 + lo * 1e3, t0 + hi * 1e3


def analyse(
    files: list[str],
    engine: str | None = None,
    window: str | None = None,
    request: PredictRequest | None = None,
    out: str | None = None,
    profile_out: str | None = None,
    report: str | None = None,
    batch: int | None = None,
    context: int | None = None,
) -> TraceReport:
    """The split of ``files`` (one per rank); with ``request``, beside predict's expected and
    bound at the trace's batch and context; ``out`` gets the report JSON, ``profile_out`` the
    trace as a predict profile, ``report`` the report section (.md, or .html with the plot)."""
    if not files:
        raise CeilingError("no trace file given", fix="ceiling trace RANK0.json.gz [RANK1 ...]")
    traces = [read_trace(f) for f in files]
    sp = split(traces, engine, parse_window(window, traces))
    rep = TraceReport(files=[str(f) for f in files], split=sp)
    if request is not None:
        from ceiling.predict.api import predict  # the model's catalogs: only when asked

        b = batch or sp.batch or request.batch
        c = context or sp.context or request.context
        update: dict[str, object] = {"batch": b, "context": c}
        if request.engine == "generic" and sp.engine in ("vllm", "sglang"):
            update["engine"] = sp.engine  # the engine the trace names
        req = request.model_copy(update=update)
        pred = predict(req)
        sp = assign_roles(sp, pred)  # GEMMs by layer role when the positions match
        rep.split = sp
        rep.prediction = (
            f"{req.model} on {req.gpu_name() or 'the hardware'}, {req.engine}, TP {req.tp}, "
            f"batch {b}, context {c}"
        )
        rep.predicted_step_ms = pred.decode_ms_per_token
        rep.bound_step_ms = pred.bound.decode_ms_per_token if pred.bound else None
        rep.measured = measured_split(sp, pred, rep.label or "trace", rep.files)
    if profile_out:
        prof = to_profile(sp, batch=batch, context=context)
        rep.profile_out = str(save_profile(prof, profile_out))
    if report:
        from ceiling.report.html import render_trace_html  # matplotlib, markdown-it: only here
        from ceiling.report.trace import render_trace_markdown

        html = Path(report).suffix.lower() in (".html", ".htm")
        text = render_trace_html(rep) if html else render_trace_markdown(rep)
        rep.report = str(write_atomic(Path(report), text, what="trace report"))
    if out:
        rep.out = str(Path(out))
        write_atomic(Path(out), rep.model_dump_json(indent=2) + "\n", what="trace report")
    return rep


def request_for(
    model: str | None, gpu: str | None, tp: int = 1, engine: str | None = None
) -> PredictRequest | None:
    """The prediction to set beside the trace (None without ``model``)."""
    if not model:
        return None
    if not gpu:
        raise CeilingError(
            "--model needs --gpu", fix="name the GPU the trace ran on, e.g. --gpu h200"
        )
    eng = engine if engine in ("vllm", "sglang", "trtllm", "generic") else "generic"
    return PredictRequest(model=model, gpu=gpu, tp=tp, gpus=tp, engine=eng)
