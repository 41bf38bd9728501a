"""Reports: Markdown and one self-contained HTML file, rendered from saved result documents.

``render(result, out_dir)`` writes ``report.md`` and ``report.html`` beside the result JSON;
``render_file(path)`` re-renders a report from a ``doctor.json`` or ``sweep.json`` a user kept,
read back into its nouns (``DoctorResult``/``SweepResult``): a file that does not match them is
refused with the field that does not, never half-rendered.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from ceiling.diagnose.schema import DoctorResult
from ceiling.errors import CeilingError
from ceiling.inputs import check_out_dir, read_json
from ceiling.outputs import write_atomic
from ceiling.redact import redact
from ceiling.report.html import render_html
from ceiling.report.markdown import Doc, render_markdown
from ceiling.sweep.schema import SweepResult

#: The result documents a report renders from (``kind`` of doctor.json / sweep.json).
REPORT_KINDS = ("doctor", "sweep")


def render(
    doc: Doc,
    out_dir: str | Path,
    stem: str = "report",
    formats: tuple[str, ...] = ("md", "html"),
) -> dict[str, str]:
    """Write the report files for a result document; return format -> path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: dict[str, str] = {}
    if "md" in formats:
        p = out / f"{stem}.md"
        write_atomic(p, redact(render_markdown(doc)), what="report")
        paths["md"] = str(p)
    if "html" in formats:
        p = out / f"{stem}.html"
        write_atomic(p, redact(render_html(doc)), what="report")
        paths["html"] = str(p)
    return paths


def load_doc(path: str | Path) -> Doc:
    """Read a result document (doctor.json / sweep.json) into its noun, with a clear error."""
    p = Path(path)
    fix = "pass the doctor.json or sweep.json that `ceiling doctor`/`sweep` wrote"
    doc = read_json(p, "result file", fix=fix)
    if not isinstance(doc, dict) or "schema_version" not in doc:
        raise CeilingError(f"{p} is not a ceiling result document (no schema_version)", fix=fix)
    kind = doc.get("kind")
    if kind not in REPORT_KINDS:
        what = "a bench result" if kind == "ceiling.bench.result" else f"kind {kind!r}"
        raise CeilingError(
            f"{p} is {what}, not a doctor or sweep result: there is no report to render",
            fix="`ceiling compare A.json B.json` reads bench results; " + fix,
        )
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
    return render(doc, out)
