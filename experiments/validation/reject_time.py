"""How long each command takes to refuse a bad input (issue 25: "every bad input rejected in
< 1 s, before any engine, rank or request starts"). Each case runs the real CLI in a fresh
process (`python -m ceiling ...`, the interpreter's start and ceiling's imports included, as a
user meets it) against a closed port and a scratch folder; prints one line per case and,
with --out, a JSON record.

    .venv/bin/python experiments/validation/reject_time.py [--repeat 3] [--out FILE]

Per case: the best and the worst wall time of --repeat runs, the exit code (2: bad input, the
documented code), whether an `error:` line was printed, and whether anything appeared in the
scratch folder (a started run would write there).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CLOSED = "http://127.0.0.1:9"  # nothing listens on the discard port here

# (name, argv after `ceiling`); {d}: the scratch folder. Every one is bad input by its options
# or its files alone, checked before anything slow starts.
CASES: list[tuple[str, list[str]]] = [
    ("commbench --sizes 1e309", ["commbench", "--sizes", "1e309", "--results", "{d}/r.json"]),
    ("commbench --world-sizes 100000", ["commbench", "--world-sizes", "100000"]),
    ("commbench --env with no =", ["commbench", "--env", "NCCL_ALGO"]),
    ("sweep plan is a device", ["sweep", "/dev/null", "--out-dir", "{d}/sw"]),
    ("sweep plan is a directory", ["sweep", "{d}", "--out-dir", "{d}/sw"]),
    ("sanity --url ftp://", ["sanity", "--url", "ftp://127.0.0.1:9"]),
    ("ready --path without slash", ["ready", "--url", CLOSED, "--path", "health x"]),
    ("ready --ready-timeout -1", ["ready", "--url", CLOSED, "--ready-timeout", "-1"]),
    ("env --shm-root a FIFO", ["env", "--shm-root", "{d}/fifo"]),
    ("deploy variant is a FIFO", ["deploy", "{d}/fifo", "--out-dir", "{d}/dep"]),
    ("bench --max-tokens -5", ["bench", "--url", CLOSED, "--max-tokens", "-5"]),
    ("bench --burstiness inf", ["bench", "--url", CLOSED, "--mode", "rate", "--burstiness", "inf"]),
    (
        "doctor --concurrency -1",
        ["doctor", "--url", CLOSED, "--concurrency", "-1", "--out-dir", "{d}/doc"],
    ),
    (
        "predict --mem-clock 1e308",
        ["predict", "--model", "llama-3.1-8b", "--gpu", "h200", "--mem-clock", "1e308"],
    ),
    ("compare NaN input", ["compare", "{d}/nan.json", "{d}/nan.json"]),
    ("trace FILE is /dev/zero", ["trace", "/dev/zero"]),
]


def _scratch() -> Path:
    d = Path(tempfile.mkdtemp(prefix="ceiling-reject-"))
    os.mkfifo(d / "fifo")
    (d / "nan.json").write_text('{"kind": "bench", "schema_version": 1, "summary": NaN}')
    return d


def _run(argv: list[str], d: Path) -> tuple[float, int, str]:
    args = [a.replace("{d}", str(d)) for a in argv]
    t0 = time.perf_counter()
    p = subprocess.run(
        [sys.executable, "-m", "ceiling", *args],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "NO_COLOR": "1"},
    )
    return time.perf_counter() - t0, p.returncode, p.stderr + p.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    rows = []
    for name, argv in CASES:
        d = _scratch()
        before = sorted(p.name for p in d.iterdir())
        times, code, text = [], 0, ""
        for _ in range(a.repeat):
            s, code, text = _run(argv, d)
            times.append(s)
        written = sorted(set(p.name for p in d.iterdir()) - set(before))
        row = {
            "case": name,
            "best_s": round(min(times), 3),
            "worst_s": round(max(times), 3),
            "exit_code": code,
            "error_line": "error:" in text,
            "traceback": "Traceback" in text,
            "written": written,
            "first_line": text.strip().splitlines()[0][:140] if text.strip() else "",
        }
        rows.append(row)
        print(
            f"{name:34s} best {row['best_s']:5.2f} s  worst {row['worst_s']:5.2f} s  "
            f"exit {code}  {'error: line' if row['error_line'] else 'NO error: line'}"
            f"{'  TRACEBACK' if row['traceback'] else ''}{'  wrote ' + str(written) if written else ''}"
        )
    slow = [r["case"] for r in rows if r["best_s"] >= 1.0]
    print(
        f"{len(rows)} cases, {len(rows) - len(slow)} refused in < 1 s (best of {a.repeat})"
        + (f"; slower: {', '.join(slow)}" if slow else "")
    )
    if a.out:
        a.out.write_text(
            json.dumps(
                {
                    "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "machine": f"{platform.machine()}, {os.cpu_count()} cores",
                    "load_1min": os.getloadavg()[0],
                    "repeat": a.repeat,
                    "cases": rows,
                },
                indent=1,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
