"""Regenerate the example output in README.md from the code, or check that it has not drifted.

Each example is a block of README.md between ``<!-- example: NAME -->`` and
``<!-- /example -->``: a console block holding the command and what ceiling prints for it at
80 columns (run in this process, on the shipped catalogs: no server, no GPU), abridged by
section (a kept section is printed whole; the others are named on one ``...`` line).
tests/test_readme_examples.py fails when README.md differs from what this writes.

    .venv/bin/python scripts/readme_examples.py          # rewrite the blocks in README.md
    .venv/bin/python scripts/readme_examples.py --check  # exit 1 if a block has drifted
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
COLUMNS = 80

#: name -> (argv after ``ceiling``, the titles of the tables kept, the sections left out)
EXAMPLES: dict[str, tuple[list[str], tuple[str, ...], str]] = {
    "predict-kimi": (
        ["predict", "--model", "kimi-k2.5", "--gpu", "rtx-pro-6000", "--gpus", "8",
         "--link", "pcie5-switch", "--tp", "8", "--engine", "vllm", "--what-if"],
        ("decode step breakdown", "what if"),
        "the op table, evidence, memory, prefill, batch curve, assumptions",
    ),
}  # fmt: skip


def run(argv: list[str]) -> str:
    """What ``ceiling ARGV`` prints on stdout at COLUMNS columns."""
    from ceiling.cli import main
    from ceiling.console import out

    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(COLUMNS)
    out.cache_clear()  # the console reads COLUMNS when it is made
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            rc = main(argv)
    finally:
        out.cache_clear()
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old
    if rc != 0:
        raise SystemExit(f"ceiling {shlex.join(argv)} exited {rc}")
    return buf.getvalue()


def abridge(text: str, keep: tuple[str, ...], left_out: str) -> str:
    """The lines before the first table, then each kept table: its title, its box and the
    indented lines under it (numbered notes); everything else becomes one ``...`` line."""
    lines = [line.rstrip() for line in text.splitlines()]
    starts = [i for i, line in enumerate(lines)
              if i + 1 < len(lines) and lines[i + 1].startswith("┏")]  # fmt: skip
    kept = lines[: starts[0]] if starts else lines
    for i in starts:
        if not lines[i].startswith(keep):
            continue
        end = next(j for j in range(i, len(lines)) if lines[j].startswith("└")) + 1
        while end < len(lines) and lines[end].startswith(" "):
            end += 1
        kept += lines[i:end]
    return "\n".join([*kept, f"... ({left_out} left out)"])


def block(name: str) -> str:
    argv, keep, left_out = EXAMPLES[name]
    body = abridge(run(argv), keep, left_out)
    return f"```console\n$ ceiling {shlex.join(argv)}\n{body}\n```"


def update(readme: str) -> str:
    """README text with every example block regenerated."""
    for name in EXAMPLES:
        pattern = re.compile(
            rf"(<!-- example: {re.escape(name)} -->\n).*?(\n<!-- /example -->)", re.DOTALL
        )
        if not pattern.search(readme):
            raise SystemExit(f"README.md has no block <!-- example: {name} -->")
        text = block(name)
        readme = pattern.sub(lambda m, text=text: m.group(1) + text + m.group(2), readme)
    return readme


def main(args: list[str]) -> int:
    text = README.read_text(encoding="utf-8")
    new = update(text)
    if "--check" in args:
        if new != text:
            print("README.md's examples differ from what the code prints: "
                  "run scripts/readme_examples.py", file=sys.stderr)  # fmt: skip
            return 1
        return 0
    if new != text:
        README.write_text(new, encoding="utf-8")
        print("README.md: examples regenerated")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
