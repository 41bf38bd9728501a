"""Reports: Markdown and one self-contained HTML file, rendered from saved result documents.

``render(result, out_dir)`` writes ``report.md`` and ``report.html`` beside the result JSON;
``render_file(path)`` re-renders a report from a ``doctor.json`` or ``sweep.json`` a user kept
(or writes ``<name>-report.md/.html`` for a ``ceiling bench`` result, ceiling.report.bench),
read back into its nouns (``DoctorResult``/``SweepResult``): a file that does not match them is
refused with the field that does not, never half-rendered.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from ceiling.bench.results import KIND as BENCH_KIND
from ceiling.bench.results import RunResult, load_result
from ceiling.diagnose.schema import DoctorResult
from ceiling.errors import CeilingError
from ceiling.inputs import check_out_dir, read_json
from ceiling.outputs import write_atomic
from ceiling.redact import redact
from ceiling.report.bench import bench_plots, render_bench_markdown, title
from ceiling.report.html import page, render_html
from ceiling.report.markdown import Doc, render_markdown
from ceiling.sweep.schema import SweepResult

#: The result documents a report renders from (``kind`` of doctor.json / sweep.json).
REPORT_KINDS = ("doctor", "sweep", BENCH_KIND)


def render(
    doc: Doc | RunResult,
    out_dir: str | Path,
    stem: str = "report",
    formats: tuple[str, ...] = ("md", "html"),
) -> dict[str, str]:
    """Write the report files for a result document; return format -> path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: dict[str, str] = {}
    if isinstance(doc, RunResult):
        md = render_bench_markdown(doc)
        html = (lambda: page(title(doc), md, bench_plots(doc))) if "html" in formats else None
    else:
        md, html = render_markdown(doc), (lambda: render_html(doc))
    if "md" in formats:
        p = out / f"{stem}.md"
        write_atomic(p, redact(md), what="report")
        paths["md"] = str(p)
    if "html" in formats and html is not None:
        p = out / f"{stem}.html"
        write_atomic(p, redact(html()), what="report")
        paths["html"] = str(p)
    return paths


def load_doc(path: str | Path) -> Doc | RunResult:
    """Read a result document (doctor.json / sweep.json / a bench result) into its noun."""
    p = Path(path)
    fix = "pass the doctor.json, sweep.json or bench result that ceiling wrote"
    doc = read_json(p, "result file", fix=fix)
    if not isinstance(doc, dict) or "schema_version" not in doc:
        raise CeilingError(f"{p} is not a ceiling result document (no schema_version)", fix=fix)
    kind = doc.get("kind")
    if kind not in REPORT_KINDS:
        raise CeilingError(
            f"{p} is kind {kind!r}, not a doctor, sweep or bench result: no report to render",
            fix=fix,
        )
    if kind == BENCH_KIND:
        return load_result(p)
    model = DoctorResult if kind == "doctor" else SweepResult
    try:
        return model.model_validate(doc)
    except ValidationError as err:
        # A kept file may be hand-edited or from another version: its field is named.
        first = err.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "(top level)"
        raise CeilingError(
            f"{p} has a field ceiling cannot read ({where}: {first['msg']}): was it edited, "
            "or written by another version of ceiling?",
            fix="re-run the doctor/sweep that wrote it, or restore the original file",
        ) from None


def render_file(path: str | Path, out_dir: str | Path | None = None) -> dict[str, str]:
    """Re-render the report of a saved result document (beside it unless ``out_dir``)."""
    p = Path(path)
    doc = load_doc(p)
    out = out_dir or p.parent
    check_out_dir(out, "--out")
    # a folder may hold many bench results: each report is named after its file
    return render(doc, out, stem=f"{p.stem}-report" if isinstance(doc, RunResult) else "report")
