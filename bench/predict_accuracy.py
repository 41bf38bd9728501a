"""How far `ceiling predict` is from published decode measurements (decode_calibration.csv).

Prints one line per row it can model (measured, predicted, error %, fraction of the ceiling
reached), the rows it skips and why, and the median and max absolute % error. The prediction
is a *ceiling*: an engine should land at or below it, so the signed error
(predicted - measured) / measured is mostly positive at concurrency 1, where kernel and engine
inefficiencies the ceiling leaves out are largest.

    .venv/bin/python bench/predict_accuracy.py [--csv PATH] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ceiling.predict.calibration import default_csv, evaluate


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", type=Path, default=default_csv())
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    res = evaluate(args.csv)
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    print(
        f"{'id':6} {'metric':24} {'conc':>5} {'measured':>10} {'predicted':>10} "
        f"{'error%':>8} {'of ceiling':>10}"
    )
    for m in res["modelled"]:
        print(
            f"{m['id']:6} {m['metric']:24} {m['concurrency']:>5} {m['measured']:>10.2f} "
            f"{m['predicted']:>10.2f} {m['error_pct']:>+8.1f} {m['fraction_of_ceiling']:>10.2f}"
        )
    print("\nskipped:")
    for s in res["skipped"]:
        print(f"  {s['id']}: {s['why']}")
    print(
        f"\nmodelled {len(res['modelled'])} of {res['rows']} rows; "
        f"median |error| {res['median_abs_error_pct']} %, max |error| {res['max_abs_error_pct']} %; "
        f"median fraction of ceiling reached {res['median_fraction_of_ceiling']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
