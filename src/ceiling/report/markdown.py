"""Markdown report: the verdict first, then the evidence, then how to reproduce it.

Markdown is the format people paste into issues and chat, so it carries every number the HTML
report does (as tables) but no plots.
"""

from __future__ import annotations

from typing import Any

from ceiling.report.extract import (
    Doc,
    ci_text,
    concurrency_points,
    decode_stat,
    fmt,
    itl_samples_ms,
    num,
    ttft_samples_ms,
)

# Facts that are bookkeeping or raw log text (shown under the findings that use them).
_HIDDEN_FACTS = {"findings", "evidence", "source", "schema_version", "warnings"}


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _cell(v: Any) -> str:
    return str(v).replace("|", "\\|").replace("\n", " ")


def table(headers: list[str], rows: list[list[Any]]) -> str:
    """A GitHub-flavoured Markdown table."""
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(_cell(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def _quantiles(vals: list[float]) -> list[str]:
    import numpy as np

    if not vals:
        return ["–"] * 4
    a = np.asarray(vals)
    return [fmt(float(np.percentile(a, q))) for q in (50, 90, 99)] + [str(len(vals))]


def verdict_lines(doc: Doc) -> list[str]:
    """The verdict section (shared by doctor and sweep reports)."""
    v = doc.get("verdict") or {}
    out = ["## Verdict", ""]
    if v.get("headline"):
        out += [f"**{v['headline']}**", ""]
    mean, lo, hi = v.get("measured_tok_s"), v.get("measured_ci_low"), v.get("measured_ci_high")
    if num(mean) is None:
        mean, lo, hi = decode_stat((doc.get("bench") or {}).get("single"))
    what = "Baseline" if doc.get("kind") == "sweep" else "Measured"
    out.append(f"- {what} single-stream decode: {ci_text(mean, lo, hi, 'tok/s')}")
    source = (doc.get("measured") or {}).get("source")
    if source:
        out.append(f"- Decode step from: {source}")
    if num(v.get("predicted_tok_s")) is not None:
        out.append(
            f"- Predicted ceiling for this exact configuration: {fmt(v['predicted_tok_s'])} tok/s"
        )
    elif v.get("prediction_note"):
        out.append(f"- Predicted ceiling: not available ({v['prediction_note']})")
    if v.get("best_config"):
        b = v["best_config"]
        out.append(
            f"- Best predicted configuration on this hardware: {b.get('change')} -> "
            f"{fmt(b.get('tok_s'))} tok/s"
        )
    gap = v.get("gap") or {}
    if gap:
        out.append(
            f"- Step time split: fundamental {fmt(gap.get('fundamental_ms'), 3)} ms, "
            f"configurable (predicted) {fmt(gap.get('configurable_ms'), 3)} ms, "
            f"unexplained (kernel inefficiency / host overhead) "
            f"{fmt(gap.get('unexplained_ms'), 3)} ms"
        )
    t = v.get("target")
    if t:
        out.append(f"- Target {fmt(t.get('target_tok_s'))} tok/s: {t.get('text')}")
    for note in v.get("notes") or []:
        out.append(f"- {note}")
    if doc.get("server_died"):
        death = " ".join(part.strip() for part in str(doc.get("server_death")).splitlines())
        out += [
            "",
            f"> **The server died during the doctor run**: {death}. "
            "Everything measured before that point is kept below.",
        ]
    return [*out, ""]


def _sanity(doc: Doc) -> list[str]:
    """The sanity gate: is the output right? (doctor's first stage; docs/sanity.md)"""
    s = doc.get("sanity") or {}
    if not s:
        return []
    out = [
        "## Output sanity",
        "",
        f"**{s.get('verdict')}** ({fmt(s.get('seconds'), 2)} s; model `{s.get('model')}`, "
        f"family {s.get('family')}: {s.get('family_reason')})",
        "",
    ]
    rows = [[c.get("status"), c.get("name"), c.get("summary")] for c in s.get("checks") or []]
    out += [table(["status", "check", "what it found"], rows), ""]
    for c in s.get("checks") or []:
        for line in (c.get("evidence") or [])[:3]:
            if c.get("status") in ("suspect", "broken"):
                out.append(f"- {c.get('name')}: `{_clip(str(line), 200).replace('`', chr(39))}`")
    return [*out, ""]


def _attribution(doc: Doc) -> list[str]:
    a = doc.get("attribution")
    if not a and doc.get("kind") == "sweep":
        return []
    if not a:
        return ["## Where the step time goes", "", "_No attribution: no decode measurement._", ""]
    rows = [
        [
            c["name"],
            fmt(c.get("predicted_ms"), 4),
            fmt(c.get("share_pct"), 2, "%"),
            c.get("kind"),
            c.get("note") or "",
        ]
        for c in a.get("components", [])
    ]
    rows.append(
        [
            a.get("unexplained_label"),
            fmt(a.get("unexplained_ms"), 4),
            fmt(a.get("unexplained_pct"), 2, "%"),
            "unexplained",
            a.get("unexplained_note") or "",
        ]
    )
    rows.append(["**measured step**", fmt(a.get("measured_step_ms"), 4), "100 %", "", ""])
    return [
        "## Where the step time goes",
        "",
        f"Basis: {a.get('basis', '')}",
        "",
        table(["component", "ms per step", "share of measured", "kind", "note"], rows),
        "",
        f"Bound by: **{a.get('bound_by')}**",
        "",
    ]


def _changes(doc: Doc) -> list[str]:
    v = doc.get("verdict") or {}
    out = ["## Configurable changes, ranked by predicted gain", ""]
    ch = v.get("changes") or []
    if not ch and doc.get("kind") == "sweep":
        return []
    if not ch:
        return [*out, "_No configurable change with a predicted gain was found._", ""]
    rows = [
        [
            i + 1,
            c.get("change"),
            fmt(c.get("predicted_gain_pct"), 1, "%"),
            c.get("source"),
            c.get("evidence") or "",
        ]
        for i, c in enumerate(ch)
    ]
    return [*out, table(["#", "change", "predicted gain", "source", "evidence"], rows), ""]


def _hypotheses(doc: Doc) -> list[str]:
    hs = (doc.get("verdict") or {}).get("hypotheses") or []
    if not hs:
        return []
    out = ["## The usual hypotheses", ""]
    out += [f"- **{h.get('hypothesis')}**: {h.get('answer')}" for h in hs]
    return [*out, ""]


def _concurrency(doc: Doc) -> list[str]:
    pts = concurrency_points((doc.get("bench") or {}).get("concurrency"))
    if not pts:
        return []
    lv = {int(x["concurrency"]): x for x in doc.get("levels") or []}
    rows = []
    for p in pts:
        c = int(p["concurrency"])
        a = lv.get(c, {})
        rows.append(
            [
                c,
                f"{p.get('completed', '–')}/{p.get('failed', 0)}",
                fmt(p.get("output_throughput")),
                fmt(p.get("mean_tpot_ms"), 3),
                fmt(a.get("measured_step_ms"), 3),
                fmt(a.get("decode_tok_s_total")),
                fmt(p.get("mean_ttft_ms"), 3),
                fmt(a.get("predicted_step_ms"), 4),
                fmt(a.get("unexplained_per_token_ms"), 4),
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
    sm = ((doc.get("bench") or {}).get("single") or {}).get("server_metrics") or {}
    q = sm.get("quantities") or {}
    if not sm.get("available") or not q:
        return []
    rows = [
        [
            name,
            f"`{v.get('metric')}`",
            fmt(v.get("server_mean_ms"), 3),
            fmt(v.get("client_mean_ms"), 3),
            fmt(v.get("overhead_ms"), 3),
        ]
        for name, v in q.items()
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
    b = doc.get("bench") or {}
    runs = (b.get("single"), b.get("concurrency"))
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
    comp = doc.get("comparison") or []
    if not comp:
        return []
    rows = [
        [
            c.get("label"),
            ci_text(c.get("tok_s"), c.get("low"), c.get("high")),
            fmt(c.get("delta_pct"), 1, "%") if c.get("delta_pct") is not None else "baseline",
            c.get("verdict") or "",
            c.get("status") or "",
            c.get("repeats") or "",
        ]
        for c in comp
    ]
    return [
        "## Variant comparison",
        "",
        table(["variant", "tok/s per stream", "vs baseline", "verdict", "status", "repeats"], rows),
        "",
    ]


def _sweep_trials(doc: Doc) -> list[str]:
    vs = doc.get("variants") if doc.get("kind") == "sweep" else None
    if not vs:
        return []
    rows = [
        [
            v.get("name"),
            v.get("status"),
            v.get("fingerprint"),
            v.get("repeats"),
            v.get("stop_reason") or v.get("error") or "",
            v.get("log_path") or "",
        ]
        for v in vs
    ]
    ledger = f"Ledger: `{doc.get('ledger')}`" if doc.get("ledger") else ""
    return [
        "## Trials",
        "",
        ledger,
        "",
        table(["variant", "status", "fingerprint", "repeats", "why it stopped", "log"], rows),
        "",
    ]


def _findings(doc: Doc) -> list[str]:
    out: list[str] = []
    facts = doc.get("facts") or {}
    shown = {
        k: v for k, v in facts.items() if k not in _HIDDEN_FACTS and v not in (None, [], {}, "")
    }
    if shown:
        rows = [[k, _clip(str(v), 200)] for k, v in sorted(shown.items())]
        out += ["## Engine facts", "", table(["fact", "value"], rows), ""]
    warns = facts.get("warnings") or []
    if warns:
        out += ["Warnings in the engine log:", ""]
        out += [f"- {_clip(str(w), 240)}" for w in warns]
        out.append("")
    fs = doc.get("findings") or []
    if fs:
        out += ["## Findings", ""]
        for f in fs:
            part = f" [{f['component']}]" if f.get("component") else ""
            out.append(
                f"- **{f.get('title')}**{part} ({f.get('severity')}, {f.get('kind')}): "
                f"{f.get('predicted_effect') or ''}"
            )
            for line in (f.get("evidence") or [])[:3]:
                out.append(f"  - `{_clip(str(line), 200).replace('`', chr(39))}`")
            if f.get("fix"):
                out.append(f"  - fix: {f['fix']}")
            elif f.get("withheld"):
                out.append(f"  - {f['withheld']}")
            if f.get("doc"):
                out.append(f"  - why and what to do: {f['doc']}")
        out.append("")
    return out


def _stages(doc: Doc) -> list[str]:
    st = doc.get("stages") or []
    if not st:
        return []
    rows = [
        [s.get("name"), s.get("status"), fmt(s.get("seconds"), 1), s.get("message") or ""]
        for s in st
    ]
    return ["## What ran", "", table(["stage", "status", "seconds", "message"], rows), ""]


def _hardware(doc: Doc) -> list[str]:
    hw = doc.get("hardware") or {}
    model = doc.get("model") or {}
    out = ["## Deployment", ""]
    tgt = doc.get("target") or {}
    if tgt:
        out.append(
            f"- Server: {tgt.get('url')} (model `{tgt.get('model')}`)"
            + (f", launched from `{tgt.get('variant')}`" if tgt.get("variant") else "")
        )
    if hw:
        out.append(f"- Hardware: {hw.get('description') or hw.get('name')}")
    if model:
        out.append(f"- Model: {model.get('name')} — {model.get('summary') or ''}")
    tel = doc.get("telemetry") or {}
    if tel:
        verdict = (tel.get("summary") or {}).get("verdict") or tel.get("reason")
        out.append(f"- Telemetry (NVML): {verdict or 'recorded'}")
    for a in doc.get("assumptions") or []:
        out.append(f"- Assumption: {a}")
    if len(out) == 2:
        return []
    return [*out, ""]


def _reproduce(doc: Doc) -> list[str]:
    cmds = doc.get("reproduce") or []
    if not cmds:
        return []
    return ["## Reproduce", "", "```sh", *cmds, "```", ""]


def render_markdown(doc: Doc) -> str:
    """The full Markdown report of a doctor or sweep result document."""
    title = doc.get("title") or "ceiling report"
    parts = [f"# {title}", ""]
    parts += verdict_lines(doc)
    parts += _sanity(doc)
    parts += _attribution(doc)
    parts += _changes(doc)
    parts += _hypotheses(doc)
    parts += _comparison(doc)
    parts += _concurrency(doc)
    parts += _latency(doc)
    parts += _server_view(doc)
    parts += _hardware(doc)
    parts += _findings(doc)
    parts += _stages(doc)
    parts += _sweep_trials(doc)
    parts += _reproduce(doc)
    return "\n".join(parts).rstrip() + "\n"
