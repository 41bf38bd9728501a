"""Write the doctor's stage order into docs/doctor.md from the declared table, or check it.

The order is ``ceiling.flows.doctor.STAGES`` read by ``doctor_context.stage_order`` (each
recorded stage, when it runs and why it sits there), wrapped at 100 columns between
``<!-- stage-order -->`` and ``<!-- /stage-order -->``: the docs had drifted from the code once
when the order was written by hand. tests/test_doctor_stage_order.py fails when they differ.

    .venv/bin/python scripts/doctor_stage_order.py          # rewrite the block
    .venv/bin/python scripts/doctor_stage_order.py --check  # exit 1 if it has drifted
"""

from __future__ import annotations

import re
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "doctor.md"
BLOCK = re.compile(r"(<!-- stage-order -->\n)(.*?)(<!-- /stage-order -->)", re.S)


def order_text() -> str:
    from ceiling.flows.doctor import STAGES
    from ceiling.flows.doctor_context import stage_order

    # wrapped at spaces, never inside a hyphenated word such as "start-up"
    return "\n".join(textwrap.wrap(stage_order(STAGES), 100, break_on_hyphens=False)) + "\n"


def render(doc: str) -> str:
    if not BLOCK.search(doc):
        raise SystemExit(f"{DOC}: no <!-- stage-order --> block")
    return BLOCK.sub(lambda m: m[1] + order_text() + m[3], doc, count=1)


def main(argv: list[str]) -> int:
    doc = DOC.read_text(encoding="utf-8")
    new = render(doc)
    if "--check" in argv:
        if new != doc:
            print(f"{DOC}: the stage order differs from the code: run {Path(__file__).name}")
            return 1
        return 0
    DOC.write_text(new, encoding="utf-8")
    print(f"{DOC}: stage order written")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
