"""Markdown report: the verdict first, then the evidence, then how to reproduce it.

Markdown is the format people paste into issues and chat, so it carries every number the HTML
report does (as tables) but no plots.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ceiling.diagnose.measured import ServerView
from ceiling.diagnose.schema import DoctorResult
from ceiling.diagnose.verdict_model import Verdict
from ceiling.fmt import pct
from ceiling.report.extract import (
    ci_text,
    decode_stat,
    fmt,
    itl_samples_ms,
    levels,
    num,
    table,
    ttft_samples_ms,
)
from ceiling.report.glossary import glossary_lines
from ceiling.report.trace import doctor_reports, trace_lines
from ceiling.sweep.schema import SweepResult

Doc = DoctorResult | SweepResult

# Facts that are bookkeeping or raw log text (shown under the findings that use them).
_HIDDEN_FACTS = {"findings", "evidence", "source", "schema_version", "warnings"}


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _pct_or_dash(value: float | None) -> str:
    return "–" if value is None else pct(value)


def _quantiles(vals: list[float]) -> list[str]:
    if not vals:
        return ["–"] * 4
    a = np.asarray(vals)
    return [fmt(float(np.percentile(a, q))) for q in (50, 90, 99)] + [str(len(vals))]


def verdict_lines(doc: Doc) -> list[str]:
    """The verdict section (doctor and sweep reports)."""
    if isinstance(doc, SweepResult):
        sv = doc.verdict
        out = ["## Verdict", "", f"**{sv.headline}**", ""]
        ci = ci_text(sv.measured_tok_s, sv.measured_ci_low, sv.measured_ci_high, "tok/s")
        out.append(f"- Baseline single-stream decode: {ci}")
        out += [f"- {note}" for note in sv.notes]
        return [*out, ""]
    v = doc.verdict
    out = ["## Verdict", ""]
    if v is not None:
        out += [f"**{v.headline}**", ""]
    mean, lo, hi = (v.measured_tok_s, v.measured_ci_low, v.measured_ci_high) if v else (None,) * 3
    if num(mean) is None:
        mean, lo, hi = decode_stat(doc.bench.get("single"))
    out.append(f"- Measured single-stream decode: {ci_text(mean, lo, hi, 'tok/s')}")
    if doc.measured is not None:
        out.append(f"- Decode step from: {doc.measured.source}")
    if v is not None:
        out += _expected_lines(doc, v)
    if doc.server_died:
        death = " ".join(part.strip() for part in str(doc.server_death).splitlines())
        out += [
            "",
            f"> **The server died during the doctor run**: {death}. "
            "Everything measured before that point is kept below.",
        ]
    return [*out, ""]


def _expected_lines(doc: DoctorResult, v: Verdict) -> list[str]:
    out = []
    if v.predicted_tok_s is not None:
        out.append(
            f"- Expected for this exact configuration (this engine's kernels): "
            f"{fmt(v.predicted_tok_s)} tok/s"
        )
    elif v.prediction_note:
        out.append(f"- Expected rate: not predicted ({v.prediction_note})")
    if v.bound_tok_s is not None:
        what = "hardware floors" if v.predicted_tok_s is None else "best kernels, no host time"
        out.append(f"- Bound of this layout ({what}): {fmt(v.bound_tok_s)} tok/s")
    if v.best_config is not None:
        out.append(
            f"- Best expected configuration on this hardware: {v.best_config.change} -> "
            f"{fmt(v.best_config.tok_s)} tok/s"
        )
    if v.gap is not None:
        out.append(
            f"- Step time split: fundamental {fmt(v.gap.fundamental_ms, 3)} ms, "
            f"configurable (predicted) {fmt(v.gap.configurable_ms, 3)} ms, "
            f"unexplained (kernel inefficiency / host overhead) "
            f"{fmt(v.gap.unexplained_ms, 3)} ms"
        )
    if v.target is not None:
        out.append(f"- Target {fmt(v.target.target_tok_s)} tok/s: {v.target.text}")
    out += [f"- {note}" for note in v.notes]
    return out


def _sanity(doc: Doc) -> list[str]:
    """The sanity gate: is the output right? (doctor's first stage; docs/sanity.md)"""
    s = doc.sanity if isinstance(doc, DoctorResult) else None
    if s is None:
        return []
    out = [
        "## Output sanity",
        "",
        f"**{s.verdict}** ({fmt(s.seconds, 2)} s; model `{s.model}`, "
        f"family {s.family}: {s.family_reason})",
        "",
    ]
    override = doc.sanity_override if isinstance(doc, DoctorResult) else None
    if override:
        out += [
            f"**Measured past a {s.verdict} verdict**: {override}. "
            "The figures below time the server's kernels; its output is not a model's answer.",
            "",
        ]
    rows = [[c.status, c.name, c.summary] for c in s.checks]
    out += [table(["status", "check", "what it found"], rows), ""]
    for c in s.checks:
        for line in c.evidence[:3]:
            if c.status in ("suspect", "broken"):
                out.append(f"- {c.name}: `{_clip(str(line), 200).replace('`', chr(39))}`")
    return [*out, ""]


def _attribution(doc: Doc) -> list[str]:
    if not isinstance(doc, DoctorResult):
        return []
    a = doc.attribution
    if a is None:
        return ["## Where the step time goes", "", "_No attribution: no decode measurement._", ""]
    rows: list[list[Any]] = [
        [c.name, fmt(c.predicted_ms, 4), pct(c.share_pct), c.kind, c.note or ""]
        for c in a.components
    ]
    rows.append(
        [
            a.unexplained_label,
            fmt(a.unexplained_ms, 4),
            pct(a.unexplained_pct),
            "unexplained",
            a.unexplained_note or "",
        ]
    )
    rows.append(["**measured step**", fmt(a.measured_step_ms, 4), "100 %", "", ""])
    return [
        "## Where the step time goes",
        "",
        f"Basis: {a.basis}",
        "",
        table(["component", "ms per step", "share of measured", "kind", "note"], rows),
        "",
        f"Bound by: **{a.bound_by}**",
        "",
    ]


def _changes(doc: Doc) -> list[str]:
    if not isinstance(doc, DoctorResult):
        return []
    out = ["## Configurable changes, ranked by expected gain", ""]
    ch = doc.verdict.changes if doc.verdict is not None else []
    if not ch:
        return [*out, "_No configurable change with an expected gain was found._", ""]
    rows = [
        [i + 1, c.change, _pct_or_dash(c.predicted_gain_pct), c.source, c.evidence or ""]
        for i, c in enumerate(ch)
    ]
    return [*out, table(["#", "change", "expected gain", "source", "evidence"], rows), ""]


def _bandwidth(doc: Doc) -> list[str]:
    """verdict.gap.bandwidth: the engine's bandwidth at one stream, the gap split, the what-ifs."""
    v = doc.verdict if isinstance(doc, DoctorResult) else None
    g = v.gap.bandwidth if v is not None and v.gap is not None else None
    if g is None:
        return []
    parts = [[p.name, fmt(p.ms, 3), p.who, p.why] for p in g.parts]
    ifs = [[w.lever, w.change, fmt(w.step_ms, 3), fmt(w.saves_ms, 3), w.source] for w in g.what_ifs]
    return [
        f"## {g.engine}: memory bandwidth at one stream",
        "",
        g.sentence,
        "",
        table(["part", "ms per step", "who can change it", "why"], parts),
        "",
        table(["lever", "what-if", "step ms", "saves ms", "source"], ifs),
        "",
    ]


def _hypotheses(doc: Doc) -> list[str]:
    if not isinstance(doc, DoctorResult) or doc.verdict is None or not doc.verdict.hypotheses:
        return []
    out = ["## The usual hypotheses", ""]
    out += [f"- **{h.hypothesis}**: {h.answer}" for h in doc.verdict.hypotheses]
    return [*out, ""]


def _concurrency(doc: Doc) -> list[str]:
    if not isinstance(doc, DoctorResult):
        return []
    pts = levels(doc.bench.get("concurrency"))
    if not pts:
        return []
    lv = {x.concurrency: x for x in doc.levels}
    rows = []
    for p in pts:
        a = lv.get(p.concurrency or 0)
        rows.append(
            [
                p.concurrency,
                f"{p.completed}/{p.failed}",
                fmt(p.output_throughput),
                fmt(p.mean_tpot_ms, 3),
                fmt(a.measured_step_ms if a else None, 3),
                fmt(a.decode_tok_s_total if a else None),
                fmt(p.mean_ttft_ms, 3),
                fmt(a.predicted_step_ms if a else None, 4),
                fmt(a.unexplained_per_token_ms if a else None, 4),
            ]
        )
    out = [
        "## Throughput vs concurrency",
        "",
        table(
            [
                "concurrency",
                "ok/failed",
                "output tok/s",
                "client TPOT ms",
                "decode step ms",
                "decode tok/s (all streams)",
                "mean TTFT ms",
                "floors ms per step",
                "unexplained ms per token",
            ],
            rows,
        ),
        "",
    ]
    if lv:
        out += [
            "The decode step is the client's TPOT, or the engine's own inter-token latency when "
            "the two disagree (see the verdict). A step serves one token per running stream: "
            "when the unexplained time per step stays flat as streams are added, it is per-step "
            "overhead (host, launch), and its share per token falls.",
            "",
        ]
    return out


def _server_view(doc: Doc) -> list[str]:
    single = doc.bench.get("single") if isinstance(doc, DoctorResult) else None
    view = ServerView.of(single)
    if not view.available or not view.quantities:
        return []
    rows = [
        [
            name,
            f"`{q.metric}`",
            fmt(q.server_mean_ms, 3),
            fmt(q.client_mean_ms, 3),
            fmt(q.overhead_ms, 3),
        ]
        for name, q in view.quantities.items()
    ]
    return [
        "## Server view (/metrics) vs client, single-stream run",
        "",
        table(
            ["quantity", "engine metric", "server mean ms", "client mean ms", "client - server ms"],
            rows,
        ),
        "",
    ]


def _latency(doc: Doc) -> list[str]:
    if not isinstance(doc, DoctorResult):
        return []
    runs = (doc.bench.get("single"), doc.bench.get("concurrency"))
    ttft, itl = ttft_samples_ms(*runs), itl_samples_ms(*runs)
    if not ttft and not itl:
        return []
    rows = [["TTFT", *_quantiles(ttft)], ["ITL", *_quantiles(itl)]]
    return [
        "## Latency distributions (ms)",
        "",
        table(["metric", "p50", "p90", "p99", "samples"], rows),
        "",
    ]


def _comparison(doc: Doc) -> list[str]:
    if not isinstance(doc, SweepResult) or not doc.comparison:
        return []
    rows = [
        [
            c.label,
            ci_text(c.tok_s, c.low, c.high),
            fmt(c.delta_pct, 1, "%") if c.delta_pct is not None else "baseline",
            c.verdict or "",
            c.status or "",
            c.repeats if c.repeats is not None else "",
        ]
        for c in doc.comparison
    ]
    return [
        "## Variant comparison",
        "",
        table(["variant", "tok/s per stream", "vs baseline", "verdict", "status", "repeats"], rows),
        "",
    ]


def _sweep_trials(doc: Doc) -> list[str]:
    if not isinstance(doc, SweepResult) or not doc.variants:
        return []
    rows = [
        [
            v.name,
            v.status,
            v.fingerprint,
            v.repeats,
            v.stop_reason or v.error or "",
            v.log_path or "",
        ]
        for v in doc.variants
    ]
    return [
        "## Trials",
        "",
        f"Ledger: `{doc.ledger}`" if doc.ledger else "",
        "",
        table(["variant", "status", "fingerprint", "repeats", "why it stopped", "log"], rows),
        "",
    ]


def _findings(doc: Doc) -> list[str]:
    if not isinstance(doc, DoctorResult):
        return []
    out: list[str] = []
    facts = doc.facts.model_dump(mode="json") if doc.facts is not None else {}
    shown = {
        k: v for k, v in facts.items() if k not in _HIDDEN_FACTS and v not in (None, [], {}, "")
    }
    if shown:
        rows = [[k, _clip(str(v), 200)] for k, v in sorted(shown.items())]
        out += ["## Engine facts", "", table(["fact", "value"], rows), ""]
    warns = doc.facts.warnings if doc.facts is not None else []
    if warns:
        out += ["Warnings in the engine log:", ""]
        out += [f"- {_clip(str(w), 240)}" for w in warns]
        out.append("")
    if doc.findings:
        out += ["## Findings", ""]
        for f in doc.findings:
            part = f" [{f.component}]" if f.component else ""
            out.append(
                f"- **{f.title}**{part} ({f.severity}, {f.kind}): {f.predicted_effect or ''}"
            )
            for line in f.evidence[:3]:
                out.append(f"  - `{_clip(str(line), 200).replace('`', chr(39))}`")
            if f.fix:
                out.append(f"  - fix: {f.fix}")
            elif f.withheld:
                out.append(f"  - {f.withheld}")
            if f.doc:
                out.append(f"  - why and what to do: {f.doc}")
        out.append("")
    return out


def _stages(doc: Doc) -> list[str]:
    if not isinstance(doc, DoctorResult) or not doc.stages:
        return []
    rows = [[s.name, s.status, fmt(s.seconds, 1), s.message or ""] for s in doc.stages]
    return ["## What ran", "", table(["stage", "status", "seconds", "message"], rows), ""]


def _hardware(doc: Doc) -> list[str]:
    if not isinstance(doc, DoctorResult):
        return []
    out = ["## Deployment", ""]
    tgt = doc.target
    if tgt.url or tgt.variant:
        out.append(
            f"- Server: {tgt.url} (model `{tgt.model}`)"
            + (f", launched from `{tgt.variant}`" if tgt.variant else "")
        )
    if doc.hardware is not None:
        out.append(f"- Hardware: {doc.hardware.description or doc.hardware.name}")
    if doc.model is not None:
        out.append(f"- Model: {doc.model.name} — {doc.model.summary}")
    tel = doc.telemetry
    if tel is not None:
        verdict = tel.overview.get("verdict") or tel.reason
        out.append(f"- Telemetry (NVML): {verdict or 'recorded'}")
    out += [f"- Assumption: {a}" for a in doc.assumptions]
    if len(out) == 2:
        return []
    return [*out, ""]


def _reproduce(doc: Doc) -> list[str]:
    if not doc.reproduce:
        return []
    return ["## Reproduce", "", "```sh", *doc.reproduce, "```", ""]


def _trace(doc: Doc) -> list[str]:
    """The engine trace's measured split of each window doctor recorded (``doctor --trace``)."""
    out = [line for rep in doctor_reports(doc) for line in trace_lines(rep)]
    ev = getattr(doc, "trace_evidence", None)
    if ev is not None:  # the single-stream window fed predict: say which ops it timed
        step = (
            f" Expected step {ev.step_ms_before:.4g} -> {ev.step_ms:.4g} ms."
            if ev.step_ms_before is not None and ev.step_ms is not None
            else ""
        )
        out += [
            f"Timed by the engine's own trace (`{ev.profile}`, the what-ifs' evidence on this "
            f"box): {', '.join(ev.from_trace) or 'none'}. Kept their previous evidence: "
            f"{', '.join(ev.kept) or 'none'}.{step}"
            + ("" if ev.from_trace else "".join(f" {n}." for n in ev.notes)),
            "",
        ]
    return out


def render_markdown(doc: Doc) -> str:
    """The full Markdown report of a doctor or sweep result."""
    head = [f"# {doc.title or 'ceiling report'}", "", *verdict_lines(doc)]
    parts: list[str] = []
    for section in (
        _sanity,
        _attribution,
        _trace,
        _changes,
        _bandwidth,
        _hypotheses,
        _comparison,
        _concurrency,
        _latency,
        _server_view,
        _hardware,
        _findings,
        _stages,
        _sweep_trials,
        _reproduce,
    ):
        parts += section(doc)
    names = glossary_lines("\n".join(head + parts))
    return "\n".join(head + names + parts).rstrip() + "\n"
