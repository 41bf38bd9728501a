"""Write a run's figures into the CI page (docs/ci.md): one table row per run, newest first.

scripts/test.sh and scripts/demo.sh call it at their end, so the figures that change with every
sitting (wall time per phase, test counts, the demo's decode step) live in one page the scripts
keep, and the README states none of them.

    python scripts/ci_record.py test --page docs/ci.md --phases PHASES.tsv --pytest-log LOG \\
        --rc RC [--args "PYTEST ARGS"]
    python scripts/ci_record.py demo --page docs/ci.md --phases PHASES.tsv --doctor DOCTOR.json \\
        --rc RC

PHASES.tsv: one ``name<TAB>seconds`` line per phase, in order. The page keeps the last
``KEEP`` rows of each table, between the markers ``<!-- ci:<table>:begin -->`` and
``<!-- ci:<table>:end -->``. Standard library only: it runs before anything else is known to
work.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import subprocess
import sys
from pathlib import Path

KEEP = 20
#: The words pytest's last line uses for each outcome ("718 passed, 2 skipped, 1 rerun in 600s").
OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed", "rerun")
TEST_PHASES = ("venv", "system", "vllm", "lint", "types", "tests", "llamacpp", "engine")
DEMO_PHASES = ("venv", "vllm", "model", "doctor")


class PageError(Exception):
    """The page lacks a table's markers (it was edited by hand): nothing is written."""


def minutes(seconds: float) -> str:
    s = round(seconds)  # rounded first: 59.7 s is 1:00, not 0:60
    return f"{s // 60}:{s % 60:02d}"


def read_phases(path: Path) -> dict[str, float]:
    phases: dict[str, float] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            name, seconds = line.split("\t")
            phases[name] = phases.get(name, 0.0) + float(seconds)
    return phases


def pytest_counts(log: str) -> dict[str, int]:
    """Outcome counts from pytest's last summary line ('== 3 passed, 1 rerun in 9.1s ==')."""
    log = re.sub(r"\x1b\[[0-9;]*m", "", log)  # a run on a terminal is logged in colour
    for line in reversed(log.splitlines()):
        if re.search(r"\bin [\d.]+s\b", line) and any(w in line for w in OUTCOMES):
            counts = {}
            for n, word in re.findall(r"(\d+) (\w+)", line):
                word = {"errors": "error", "reruns": "rerun"}.get(word, word)
                if word in OUTCOMES:
                    counts[word] = int(n)
            return counts
    return {}


def machine() -> str:
    """Cores, memory and the load average when the run ended (the box may be shared)."""
    mem_gb = 0.0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem_gb = int(line.split()[1]) / 2**20
    load = os.getloadavg()
    return (
        f"{os.cpu_count()} cores, {mem_gb:.0f} GB; load {load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f}"
    )


def commit() -> str:
    proc = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    )
    return proc.stdout.strip() or "-"


def insert_row(page: str, table: str, row: str, keep: int = KEEP) -> str:
    """``page`` with ``row`` first in ``table`` (header kept, at most ``keep`` rows)."""
    begin, end = f"<!-- ci:{table}:begin -->", f"<!-- ci:{table}:end -->"
    if begin not in page or end not in page or page.index(begin) > page.index(end):
        raise PageError(f"the page has no {begin} ... {end} block")
    head, rest = page.split(begin, 1)
    body, tail = rest.split(end, 1)
    lines = [ln for ln in body.strip("\n").splitlines() if ln.strip()]
    header = [ln for ln in lines[:2] if ln.startswith("|")]  # the header and its |---| line
    rows = [ln for ln in lines[len(header) :] if ln.startswith("|")]
    rows = [row, *rows][:keep]
    return head + begin + "\n" + "\n".join(header + rows) + "\n" + end + tail


def test_row(phases: dict[str, float], counts: dict[str, int], rc: int, args: str) -> str:
    total = sum(phases.values())
    shown = " | ".join(minutes(phases[p]) if p in phases else "-" for p in TEST_PHASES)
    outcome = ", ".join(f"{counts[w]} {w}" for w in OUTCOMES if counts.get(w)) or "no summary"
    status = "ok" if rc == 0 else f"rc {rc}"
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M")
    extra = f" `{args}`" if args.strip() else ""
    return (
        f"| {when} | {commit()} | {machine()} | {shown} | **{minutes(total)}** | {outcome} | "
        f"{status}{extra} |"
    )


def demo_row(phases: dict[str, float], doctor: Path, rc: int) -> str:
    step = "-"
    try:
        verdict = json.loads(doctor.read_text()).get("verdict") or {}
        ms = (verdict.get("bottleneck") or {}).get("step_ms")
        if isinstance(ms, int | float):
            step = f"{ms:.2f} ms"
    except (OSError, ValueError):
        pass  # no doctor.json (the demo failed): the row says "-" and the exit status
    total = sum(phases.values())
    shown = " | ".join(minutes(phases[p]) if p in phases else "-" for p in DEMO_PHASES)
    status = "ok" if rc == 0 else f"rc {rc}"
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M")
    return f"| {when} | {commit()} | {machine()} | {shown} | **{minutes(total)}** | {step} | {status} |"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("kind", choices=["test", "demo"])
    ap.add_argument("--page", type=Path, required=True)
    ap.add_argument("--phases", type=Path, required=True)
    ap.add_argument("--rc", type=int, required=True)
    # repeatable: test.sh runs two pytest sessions (no engine, in parallel; then the engines)
    ap.add_argument("--pytest-log", type=Path, action="append", default=[])
    ap.add_argument("--args", default="")
    ap.add_argument("--doctor", type=Path)
    a = ap.parse_args(argv)
    phases = read_phases(a.phases)
    if a.kind == "test":
        # no log when a phase before the tests failed: the row then says "no summary"
        counts: dict[str, int] = {}
        for path in a.pytest_log:
            if path.is_file():
                for word, n in pytest_counts(path.read_text(errors="replace")).items():
                    counts[word] = counts.get(word, 0) + n
        row = test_row(phases, counts, a.rc, a.args)
    else:
        row = demo_row(phases, a.doctor or Path("-"), a.rc)
    try:
        page = insert_row(a.page.read_text(), a.kind, row)
    except (OSError, PageError) as e:
        print(f"error: the CI page was not updated: {e}", file=sys.stderr)
        print(f"fix: restore {a.page} from git (its ci:{a.kind} markers)", file=sys.stderr)
        return 1
    tmp = a.page.with_name(a.page.name + ".tmp")
    tmp.write_text(page)
    tmp.replace(a.page)  # atomic: a run cut off here leaves the old page whole
    print(f"== figures of this run: {a.page} ({row.split(' | **')[1].split('**')[0]} in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
