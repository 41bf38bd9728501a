"""Each component name the report uses (weights, kv, collectives, launch, host, "kernel
inefficiency / host overhead") is explained in plain words, once, under the verdict."""

from __future__ import annotations

from pathlib import Path

from ceiling.diagnose.attribute import UNEXPLAINED_LABEL
from ceiling.report import load_doc
from ceiling.report.glossary import MEANING, glossary_lines
from ceiling.report.markdown import render_markdown

DOCTOR_CPU = Path(__file__).parent / "data" / "report" / "doctor-cpu.json"


def _section(md: str) -> list[str]:
    body = md.split("## What the names mean\n\n", 1)[1].split("\n\n", 1)[0]
    return body.splitlines()


def test_every_component_in_the_report_is_explained_once_under_the_verdict():
    doc = load_doc(DOCTOR_CPU)
    md = render_markdown(doc)
    assert md.count("## What the names mean") == 1
    assert (
        md.index("## Verdict")
        < md.index("## What the names mean")
        < md.index("## Where the step time goes")
    )
    lines = _section(md)
    named = [line.split("**")[1] for line in lines]
    assert doc.attribution is not None
    used = [c.name for c in doc.attribution.components] + [UNEXPLAINED_LABEL]
    for name in used:
        assert named.count(name) == 1, (name, named)
    assert len(named) == len(set(named))


def test_launch_says_fixed_kernel_costs_and_inefficiency():
    lines = glossary_lines("launch 4.2 ms; collectives 3.1 ms; host 0.35 ms; kv 0.05 ms")
    text = "\n".join(lines)
    launch = next(line for line in lines if line.startswith("- **launch**"))
    assert "fixed kernel costs" in launch and "best known kernels" in launch
    for name in ("collectives", "host", "kv"):
        assert f"- **{name}**: {MEANING[name]}." in text
    assert "**weights**" not in text  # only the names the report uses
    assert glossary_lines("no component named here") == []
