"""How far `ceiling predict` is from published decode measurements, and whether its bound holds.

Rows: data/predict/reference/decode_calibration.csv (shared) and decode_validation.csv (more
published runs, each with its source). For each row: measured, expected, bound, error of
expected (+ = predicted faster, in every metric), whether it is held out (`seen: no` in its
file: scored before any model change made with it in sight), and the margin to the bound
(negative beyond -5 %: the measurement beats the bound, a bug in the bound). Then median and p90 |error| of expected over single-stream rows, by engine,
GPU, weight format and MoE/dense; the bound violations; and the measured before/after pairs
(whatif_pairs.csv) with the measured and predicted change. Last, the evidence check of every
single-stream row: the time the measured step leaves beyond the bound, what each source of
evidence (table, prior, engine) costs of it, and where one source alone costs more than the
whole slack (that evidence cannot be true in that step) or the model leaves time unexplained.

These rows are for validation only: no constant is fitted to them. The held-out rows' figures
are printed apart from the rows the model was changed beside (`seen: yes`).

    .venv/bin/python experiments/validation/predict_accuracy.py [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# the harness (validation/) sits at the repository root, outside the installed package
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from validation.accounting import HeldOutAccount, held_out_account, ledger
from validation.calibration import EvidenceCheck, evaluate, evidence_checks, pairs

from ceiling.predict import tables


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    res = evaluate()
    prs = pairs()
    checks = evidence_checks()
    account = held_out_account(res, with_tables=tables.info() is not None)
    if args.json:
        ev = [c.model_dump() for c in checks]
        prs_json = [p.model_dump() for p in prs]
        extra = {
            "pairs": prs_json,
            "evidence_checks": ev,
            "held_out_as_first_scored": account.model_dump(),
            "validation_sets": [s.model_dump() for s in ledger().sets],
        }
        print(json.dumps({**res.model_dump(), **extra}, indent=2))
        return 0
    _print_account(account)
    print(
        f"{'id':5} {'held':4} {'use':5} {'engine':6} {'metric':24} {'conc':>4} {'measured':>9} "
        f"{'expected':>9} {'err%':>7} {'bound':>9} {'margin%':>8} {'tight':>6}"
    )
    for m in res.modelled:
        flag = "  VIOLATION" if m.violation else ""
        held = "yes" if m.held_out else ""
        print(
            f"{m.id:5} {held:4} {m.use:5} {m.engine:6} {m.metric:24} "
            f"{m.concurrency:>4} "
            f"{m.measured:>9.2f} {m.expected:>9.2f} {m.error_pct:>+7.1f} "
            f"{m.bound:>9.2f} {m.bound_margin_pct:>+8.1f} {m.tightness:>6.2f}{flag}"
        )
    print("\nskipped:")
    for s in res.skipped:
        print(f"  {s.id}: {s.why}")
    print(
        f"\n{'group (single stream unless named)':34} {'n':>3} {'median |err|':>13} {'p90 |err|':>10} "
        f"{'viol':>5} {'tight':>6}"
    )
    rows = {
        "HELD-OUT single stream": res.held_out_single_stream,
        "seen single stream": res.seen_single_stream,
        "HELD-OUT all rows": res.held_out_all_rows,
        "HELD-OUT batch (conc. > 1)": res.held_out_batch,
        **{f"held-out {k}": v for k, v in res.held_out_by_added.items()},
        "ALL single stream": res.single_stream,
        "no spec decoding, single": res.no_spec_single_stream,
        "spec decoding, single": res.spec_single_stream,
        "all rows (any conc.)": res.all_rows,
    }
    rows.update(res.by_group)
    for name, st in rows.items():
        print(
            f"{name:34} {st.n:>3} {st.median_abs_error_pct!s:>13} "
            f"{st.p90_abs_error_pct!s:>10} {st.bound_violations:>5} "
            f"{st.median_tightness!s:>6}"
        )
    print(f"held-out rows (seen: no): {', '.join(res.held_out_ids) or 'none'}")
    print(f"\nbound violations (a measurement faster than the bound): {res.bound_violations}")
    print(f"\n{'pair':4} {'kind':28} {'measured':>9} {'predicted':>9} {'gap':>6}  sign  <=5pt held")
    ok_sign = ok_5 = 0
    for p in prs:
        if p.skipped is not None:
            print(f"{p.id:4} {p.kind:28} skipped: {p.skipped}")
            continue
        ok_sign += p.right_sign
        ok_5 += p.within_5_points
        print(
            f"{p.id:4} {p.kind[:28]:28} {p.measured_delta_pct:>+8.1f}% "
            f"{p.predicted_delta_pct:>+8.1f}% {p.gap_points:>6.1f}  "
            f"{'yes' if p.right_sign else 'NO':4}  {'yes' if p.within_5_points else 'no':5} "
            f"{'yes' if p.held_out else ''}"
        )
    print(f"pairs: right sign {ok_sign} of {len(prs)}, within 5 points {ok_5} of {len(prs)}")
    _print_checks(checks)
    return 0


def _print_account(acc: HeldOutAccount) -> None:
    """The held-out rows apart, as first scored and now, then every validation set's ledger
    line (validation_sets.yaml): when added, seen or not, its figures as first scored."""
    print(f"HELD-OUT rows (seen: no), as first scored ({acc.evidence}) and now")
    print(f"{'id':5} {'added':20} {'first scored':20} {'first err%':>10} {'now err%':>9}")
    for r in acc.rows:
        first = "-" if r.first_error_pct is None else f"{r.first_error_pct:+.1f}"
        now = "-" if r.error_pct is None else f"{r.error_pct:+.1f}"
        print(f"{r.id:5} {r.added:20} {r.first_scored:20} {first:>10} {now:>9}")
    print(f"{'':27} {'n':>3} {'median |err|':>13} {'p90 |err|':>10}")
    for name, st in (
        ("held-out, as first scored", acc.held_out_first),
        ("held-out, now", acc.held_out_now),
        ("seen (looked at), now", acc.seen_now),
    ):
        print(f"{name:27} {st.n:>3} {st.median_abs_error_pct!s:>13} {st.p90_abs_error_pct!s:>10}")
    print("\nvalidation sets (validation_sets.yaml): added, seen, first scored n / median / p90")
    for s in ledger().sets:
        f = s.first
        first = f"{f.n} / {f.median_abs_error_pct} / {f.p90_abs_error_pct}" if f else "-"
        print(f"  {s.name:26} {s.added:40} seen {s.seen:8} {first}")
    print()


def _print_checks(checks: list[EvidenceCheck]) -> None:
    """The evidence check table (calibration.EvidenceCheck): ms per token."""
    print(
        f"\nevidence check (single stream, ms/token): slack = measured - bound; "
        f"each source's cost of it\n{'id':5} {'measured':>8} {'bound':>6} {'slack':>6} "
        f"{'table':>6} {'prior':>6} {'engine':>6} {'unexpl':>6}  verdict"
    )
    for c in checks:
        ex = c.excess_ms_by_source
        if c.contradicted:
            top = ", ".join(f"{n} {v:.2f}" for n, s, v in c.top_ops if s in c.contradicted)
            verdict = f"{'+'.join(c.contradicted)} alone exceeds the slack ({top})"
        elif c.unexplained_ms > 0.1 * c.measured_ms:
            verdict = f"model misses {c.unexplained_ms:.2f} ms"
        else:
            verdict = ""
        print(
            f"{c.id:5} {c.measured_ms:>8.2f} {c.bound_ms:>6.2f} {c.slack_ms:>6.2f} "
            f"{ex.get('table', 0):>6.2f} {ex.get('prior', 0):>6.2f} {ex.get('engine', 0):>6.2f} "
            f"{c.unexplained_ms:>6.2f}  {verdict}"
        )
    bad = [c.id for c in checks if c.contradicted]
    miss = [c.id for c in checks if not c.contradicted and c.unexplained_ms > 0.1 * c.measured_ms]
    print(f"evidence contradicted by the measured step: {len(bad)} of {len(checks)} {bad}")
    print(f"model misses > 10 % of the step: {len(miss)} of {len(checks)} {miss}")


if __name__ == "__main__":
    sys.exit(main())
