"""The batch curve against measured serving records (aiconfigurator-core's silicon_sample.csv).

Per-user tok/s (1000 / TPOT) at concurrency 1-64 (``--max-concurrency``), predicted with the
record's engine, GPU, TP/EP layout, formats and context = input + output / 2, scored like the
single-stream rows (+ = predicted faster; numpy's percentiles). Every record is held out: none
was scored before this harness and nothing in predict comes from them. Needs the tables extra.

    .venv/bin/python experiments/validation/predict_batch_curve.py [--json] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# the harness (validation/) sits at the repository root, outside the installed package
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from validation.batch_validation import evaluate
from validation.silicon import silicon_records


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out", type=Path, help="write the JSON result here")
    ap.add_argument("--max-concurrency", type=int, default=64)
    args = ap.parse_args(argv)
    if not silicon_records():
        print("error: aiconfigurator-core is not installed\nfix: pip install 'ceiling[tables]'")
        return 2
    res = evaluate(args.max_concurrency)
    dp = evaluate(args.max_concurrency, attention_dp=True)
    summary = dp.model_dump(exclude={"scored"})
    if args.out:
        out = {"schema_version": 1, **res.model_dump(exclude={"scored"})}
        args.out.write_text(json.dumps({**out, "attention_dp": summary}, indent=1))
    if args.json:
        print(json.dumps({**res.model_dump(), "attention_dp": dp.model_dump()}, indent=1))
        return 0
    print(f"records at concurrency <= {args.max_concurrency}: {res.records}")
    print(f"scored {res.all.n}; skipped: {res.skipped}")
    print(f"\n{'group':22} {'n':>5} {'median|err|':>11} {'p90|err|':>9} {'signed':>7} {'tight':>6}")
    groups = {"ALL": res.all}
    for dim, by in (("concurrency", res.by_concurrency), ("backend", res.by_backend),
                    ("system", res.by_system)):  # fmt: skip
        groups.update({f"{dim}={k}": v for k, v in by.items()})
    for name, st in groups.items():
        print(
            f"{name:22} {st.n:>5} {st.median_abs_error_pct!s:>11} "
            f"{st.p90_abs_error_pct!s:>9} {st.median_signed_error_pct!s:>7} "
            f"{st.median_tightness!s:>6}"
        )
    print(f"\nbound violations (measured faster than the bound): {res.bound_violations}")
    st = dp.all
    print(
        f"\nattention data parallel + EP MoE (--dp ranks, per-rank batch; concurrency = all "
        f"ranks): {st.n} scored, median |err| {st.median_abs_error_pct} %, p90 "
        f"{st.p90_abs_error_pct} %, signed {st.median_signed_error_pct} %, "
        f"bound violations {dp.bound_violations}"
    )
    for k, v in dp.by_concurrency.items():
        print(f"  concurrency={k:6} {v.n:>4} median |err| {v.median_abs_error_pct} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
