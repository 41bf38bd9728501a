"""Reports: Markdown and one self-contained HTML file, rendered from saved result documents.

``render(doc, out_dir)`` writes ``report.md`` and ``report.html`` beside the result JSON;
``render_file(path)`` re-renders a report from a ``doctor.json`` or ``sweep.json`` a user kept.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ceiling.errors import CeilingError


def render(
    doc: dict[str, Any] | Any,
    out_dir: str | Path,
    stem: str = "report",
    formats: tuple[str, ...] = ("md", "html"),
) -> dict[str, str]:
    """Write the report files for a result document; return format -> path."""
    from ceiling.report.html import render_html
    from ceiling.report.markdown import render_markdown

    if hasattr(doc, "model_dump"):
        doc = doc.model_dump(mode="json")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: dict[str, str] = {}
    if "md" in formats:
        p = out / f"{stem}.md"
        p.write_text(render_markdown(doc), encoding="utf-8")
        paths["md"] = str(p)
    if "html" in formats:
        p = out / f"{stem}.html"
        p.write_text(render_html(doc), encoding="utf-8")
        paths["html"] = str(p)
    return paths


def load_doc(path: str | Path) -> dict[str, Any]:
    """Read a result document (doctor.json / sweep.json) with a clear error."""
    p = Path(path)
    if not p.is_file():
        raise CeilingError(
            f"result file not found: {p}",
            fix="pass the doctor.json or sweep.json that `ceiling doctor`/`sweep` wrote",
        )
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise CeilingError(
            f"{p} is not valid JSON: {exc}", fix="pass an unmodified result file"
        ) from exc
    if not isinstance(doc, dict) or "schema_version" not in doc:
        raise CeilingError(
            f"{p} is not a ceiling result document (no schema_version)",
            fix="pass the doctor.json or sweep.json that ceiling wrote",
        )
    return doc


def render_file(path: str | Path, out_dir: str | Path | None = None) -> dict[str, str]:
    """Re-render the report of a saved result document (beside it unless ``out_dir``)."""
    p = Path(path)
    doc = load_doc(p)
    return render(doc, out_dir or p.parent)
