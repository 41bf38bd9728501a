"""docs/doctor.md's stage order is the declared table the doctor runs (scripts/doctor_stage_order.py
writes it): the hand-written order had drifted from the code once."""

from __future__ import annotations

from pathlib import Path

from tests.script_module import load_script

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = load_script(ROOT / "scripts" / "doctor_stage_order.py", "doctor_stage_order")


def test_the_docs_stage_order_is_the_table():
    doc = (ROOT / "docs" / "doctor.md").read_text(encoding="utf-8")
    assert "<!-- stage-order -->" in doc
    assert SCRIPT.render(doc) == doc, (
        "docs/doctor.md's stage order has drifted from ceiling.flows.doctor.STAGES: run "
        "`.venv/bin/python scripts/doctor_stage_order.py` and commit docs/doctor.md"
    )


def test_a_stage_moved_in_the_docs_is_caught():
    doc = (ROOT / "docs" / "doctor.md").read_text(encoding="utf-8")
    drifted = doc.replace("-> sanity (", "-> sanity-moved (", 1)
    assert drifted != doc and SCRIPT.render(drifted) == doc
    # the order names every recorded stage of both modes, in the table's order
    text = SCRIPT.order_text().replace("\n", " ")
    at = {name: text.index(f"-> {name} ") for name in
          ("preflight", "launch", "sanity", "bench single", "trace single", "verdict")}  # fmt: skip
    assert list(at) == sorted(at, key=at.__getitem__)
