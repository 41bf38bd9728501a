"""How long `ceiling env` takes on the broken test environment of tests/test_envcheck.py
(cold: empty cache, one `import torch` in the checked Python; warm: cached loads), and whether it
finds the five injected incompatibilities. Prints a table; `--json PATH` writes the figures.

    .venv/bin/python experiments/validation/env_check_time.py [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

INJECTED = {
    "abi_mismatch_torch",
    "cuda_library_missing",
    "duplicate_install",
    "missing_requirement",
    "requirement_conflict",
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    import torch

    from ceiling.envcheck.check import check_environment
    from env_helpers import build_broken_env

    root = Path(tempfile.mkdtemp(prefix="env-bench-"))
    t0 = time.monotonic()
    python = build_broken_env(root, Path(torch.__file__).resolve().parents[1], torch.__version__)
    build_s = time.monotonic() - t0
    rows = []
    for i in range(args.repeats):
        os.environ["CEILING_CACHE_DIR"] = str(root / f"cache{i}")
        for mode in ("cold", "warm"):
            t = time.monotonic()
            rep = check_environment(str(python))
            took = time.monotonic() - t
            found = {p.kind for p in rep.problems} & INJECTED
            rows.append({"run": i, "mode": mode, "s": round(took, 3), "found": len(found)})
    load = os.getloadavg()[0]
    print(f"broken venv built in {build_s:.2f} s; load average {load:.2f} on {os.cpu_count()} CPUs")
    print(f"{'run':>3} {'mode':>5} {'seconds':>8} {'found':>6}")
    for r in rows:
        print(f"{r['run']:>3} {r['mode']:>5} {r['s']:>8.2f} {r['found']:>4}/5")
    if args.json:
        args.json.write_text(json.dumps({"build_s": build_s, "load": load, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
