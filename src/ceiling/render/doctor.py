"""What ``ceiling doctor``, ``ceiling sweep`` and ``ceiling report`` print.

The verdict's sentences are fields of the result (computed from its numbers in
``diagnose/verdict_model.py``), so ``--json`` carries them too; these functions only lay them
out. The reports themselves (Markdown, HTML) are files, written by ``ceiling.report``.
"""

from __future__ import annotations

from pathlib import Path

from ceiling.diagnose.schema import DoctorResult
from ceiling.render import emit_json, esc, out, table
from ceiling.sweep.schema import SweepResult


def doctor(result: DoctorResult, json_out: bool = False) -> None:
    """The headline and where the report is (``--json``: the whole doctor.json)."""
    if json_out:
        emit_json(result)
        return
    o = out()
    o.print(esc(result.verdict.headline if result.verdict else "no verdict"))
    if result.verdict is not None and result.verdict.capacity is not None:
        o.print(esc(result.verdict.capacity.sentence))
    html, md = result.files.get("report_html"), result.files.get("report_md")
    o.print(f"report: {esc(html)}  ({esc(md)})")


def sweep(result: SweepResult, out_dir: Path, json_out: bool = False) -> None:
    """Every variant against the baseline, the headline, and where the report is."""
    if json_out:
        emit_json(result)
        return
    rows = [
        [
            v.name,
            v.status,
            str(v.repeats),
            f"{v.tok_s:.4g}" if v.tok_s is not None else "–",
            f"{v.delta_pct:+.2f} %" if v.delta_pct is not None else "baseline",
            v.verdict or "",
        ]
        for v in result.variants
    ]
    header = ["variant", "status", "repeats", "tok/s per stream", "vs baseline", "verdict"]
    o = out()
    o.print(table("sweep", header, [[esc(c) for c in r] for r in rows]))
    o.print(esc(result.verdict.headline))
    o.print(f"report: {esc(out_dir / 'report.html')}")


def report_paths(paths: dict[str, str], json_out: bool = False) -> None:
    """The report files ``ceiling report`` wrote (format -> path)."""
    if json_out:
        emit_json(paths)
        return
    for kind, path in paths.items():
        out().print(f"{kind}: {esc(path)}")
