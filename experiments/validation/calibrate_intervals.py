"""Calibrate predict's 80 % interval (issue 39) leave-one-setup-out, and say what coverage it reached.

Rows: the project's own validation rows, every one scored as predict's `expected` against the
measurement (speed terms): decode_calibration.csv and decode_validation.csv (`use: all`, decode
metrics) and the batch curve's serving records of aiconfigurator-core (concurrency <= 64, with
and without attention DP; `predict.batch_validation`). A setup is one model on one GPU type with
one engine (a row set apart: a published row and a serving record are never the same setup).

Fit (`fit`): the spreads of `predict.interval` (one per evidence level, one per engine, one per
setup factor) by weighted maximum likelihood of the log-errors (every setup weighs the same),
then one scale so that 80 % of the fitted rows (weighted) fall inside. A level or factor the
rows do not carry gets a rule from the others, never a number of its own:
profile = table x 0.5 and trace = table x 0.25 (evidence.yaml's confidences: 1 - 0.9 and
1 - 0.95 against a table's 1 - 0.8), prior_borrowed = prior x 1.4 ((1 - 0.3) / (1 - 0.5)),
the host-time estimate (`engine` level, a few % of any step, not fitted) = prior,
an engine without rows and a GPU vendor without rows = the widest calibrated engine / the
borrowed-prior spread. No level goes below FLOOR (5 %: a measured step's own run-to-run spread),
where the fit leaves a level's error to the engine terms.

Leave-one-setup-out: each setup's rows get the interval of spreads fitted on every other
setup; the coverage and widths printed (and written to intervals.yaml) are those. The file's
spreads are then fitted on all setups. Nothing here changes `expected`.

Check (never fitted): the vLLM 0.25 H200 run (experiments/results/2026-12-06_h200-vllm): its
predictions committed before serving, their intervals from the written file, against the
measured steps.

    PYTHONPATH=src .venv/bin/python experiments/validation/calibrate_intervals.py [--write]
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from pathlib import Path

import numpy as np
import yaml
from pydantic import BaseModel
from scipy.optimize import minimize

# the harness (validation/) sits at the repository root, outside the installed package
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from validation import batch_validation, calibration
from validation.silicon import silicon_records

from ceiling.errors import CeilingError
from ceiling.predict import interval
from ceiling.predict.core import predict_one
from ceiling.predict.schema import Prediction

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "src/ceiling/data/predict/intervals.yaml"
H200 = ROOT / "experiments/results/2026-12-06_h200-vllm"
COVERAGE, Z = 0.8, 1.2816
DECODE_METRICS = ("decode_tok_s_per_stream", "aggregate_output_tok_s", "tpot_ms")
FIT_LEVELS = ("table", "prior", "prior_borrowed")
FLOOR = 0.05  # log sigma no level goes below: a measured step's run-to-run spread
MIN_WEIGHT = 2.0  # setups' worth of share a level or factor needs to be fitted


class Row(BaseModel):
    id: str
    set: str
    setup: str
    err: float  # log(expected speed / measured speed)
    f: interval.Features


Row.model_rebuild()  # resolved here: the tests load this script outside sys.modules


def _csv_rows() -> list[Row]:
    out = []
    for p in calibration.validation_csvs():
        for row in csv.DictReader(p.open()):
            if (row.get("use") or calibration._legacy_use(row)) != "all":
                continue
            if row["metric"] not in DECODE_METRICS:
                continue
            pred, _ = calibration.predict_row(row)
            req, _ = calibration.request_for(row)
            if pred is None or req is None:
                continue
            p_full = calibration._decode_step(req)
            f = interval.features(p_full)
            if f is None:
                continue
            err = calibration.speed_error_pct(row["metric"], float(row["value"]), pred[0])
            conc = int(row["concurrency"])
            out.append(
                Row(
                    id=row["id"],
                    set="published single stream" if conc == 1 else "published batch",
                    setup=f"pub|{Path(req.model).name}|{req.gpu}|{req.engine}",
                    err=math.log1p(err / 100),
                    f=f,
                )
            )
    return out


def _batch_rows() -> list[Row]:
    out = []
    recs = [r for r in silicon_records() if r.concurrency * r.attention_dp <= 64]
    for rec in recs:
        adp = rec.attention_dp > 1
        req, _ = batch_validation.request_for(rec, attention_dp=adp)
        if req is None:
            continue
        try:
            p = predict_one(req, curve=False, strict=False)
        except CeilingError:
            continue
        f = interval.features(p)
        if f is None:
            continue
        meas = 1000.0 / rec.tpot_ms
        out.append(
            Row(
                id=rec.id,
                set="serving records, attention DP" if adp else "serving records",
                setup=f"rec{'-adp' if adp else ''}|{rec.model_path}|{rec.system}|{rec.backend}",
                err=math.log(p.decode_tok_s_per_stream / meas),
                f=f,
            )
        )
    return out


# ----------------------------------------------------------------------------------- the fit


class Params(BaseModel):
    levels: dict[str, float]
    engines: dict[str, float]
    factors: dict[str, float]
    weight: dict[str, float]  # rows' weight behind each fitted name

    def data(self) -> interval.IntervalsFile:
        sp = {k: _spread(v, self.weight.get(k, 0.0)) for k, v in self.levels.items()}
        return interval.IntervalsFile.model_validate(
            {
                "schema_version": 1,
                "coverage": COVERAGE,
                "z": Z,
                "produced_by": "experiments/validation/calibrate_intervals.py",
                "fitted_on": "",
                "levels": sp,
                "engines": {
                    k: _spread(v, self.weight.get(f"engine:{k}", 0.0))
                    for k, v in self.engines.items()
                },
                "default_engine": _spread(max(self.engines.values()), 0.0, "widest engine"),
                "factors": {
                    k: _spread(v, self.weight.get(k, 0.0)) for k, v in self.factors.items()
                },
                "leave_one_setup_out": {
                    "setups": 0,
                    "rows": 0,
                    "coverage": 0,
                    "coverage_setup_weighted": 0,
                    "by_set": {},
                    "rows_by_set": {},
                    "median_width_pct": 0,
                },
            }
        )


RULES = {
    "profile": ("table", 0.5),
    "trace": ("table", 0.25),
    "prior_borrowed": ("prior", 1.4),
    # the host-time estimate (a small share of any step; evidence.yaml 0.3-0.5, a prior's)
    "engine": ("prior", 1.0),
}


def _spread(sigma: float, weight: float, rule: str = "") -> dict[str, object]:
    ok = weight >= MIN_WEIGHT
    how = "fitted" if ok else (rule or "rule (too few rows)")
    return {"sigma": round(sigma, 4), "rows": round(weight, 2), "calibrated": ok, "how": how}


def fit(rows: list[Row]) -> Params:
    setups: dict[str, int] = {}
    for r in rows:
        setups[r.setup] = setups.get(r.setup, 0) + 1
    w = np.array([1.0 / setups[r.setup] for r in rows])
    e = np.array([r.err for r in rows])
    weight: dict[str, float] = {}
    for lvl in FIT_LEVELS:
        weight[lvl] = float(
            sum(wi * r.f.shares.get(lvl, 0.0) for wi, r in zip(w, rows, strict=True))
        )
    engines = sorted({r.f.engine for r in rows})
    for eng in engines:
        weight[f"engine:{eng}"] = float(
            sum(wi for wi, r in zip(w, rows, strict=True) if r.f.engine == eng)
        )
    for fac in ("spec_decoding", "attention_dp", "gpu_vendor"):
        weight[fac] = float(sum(wi for wi, r in zip(w, rows, strict=True) if fac in r.f.factors))
    lv = [lvl for lvl in FIT_LEVELS if weight[lvl] >= MIN_WEIGHT]
    fc = [f for f in ("spec_decoding", "attention_dp", "gpu_vendor") if weight[f] >= MIN_WEIGHT]
    S = np.array([[r.f.shares.get(lvl, 0.0) for lvl in lv] for r in rows])
    E = np.array([[r.f.engine == eng for eng in engines] for r in rows], dtype=float)
    F = np.array([[f in r.f.factors for f in fc] for r in rows], dtype=float).reshape(len(rows), -1)
    n_l, n_e = len(lv), len(engines)

    def var(theta: np.ndarray) -> np.ndarray:
        s = np.exp(theta)
        ev = S @ s[:n_l]
        return ev**2 + E @ s[n_l : n_l + n_e] ** 2 + F @ s[n_l + n_e :] ** 2 + 1e-6

    def nll(theta: np.ndarray) -> float:
        v = var(theta)
        return float(np.sum(w * (np.log(v) + e**2 / v)))

    theta0 = np.full(n_l + n_e + len(fc), math.log(0.1))
    theta = minimize(nll, theta0, method="L-BFGS-B", bounds=[(-7, 1)] * len(theta0)).x
    # one scale: 80 % of the fitted rows (weighted) inside
    ratio = np.abs(e) / (Z * np.sqrt(var(theta)))
    order = np.argsort(ratio)
    cum = np.cumsum(w[order]) / w.sum()
    k = float(ratio[order][np.searchsorted(cum, COVERAGE)])
    s = np.exp(theta) * k
    levels = {lvl: float(s[i]) for i, lvl in enumerate(lv)}
    for lvl in FIT_LEVELS:  # a level too thin to fit: its ladder neighbour's rule
        levels.setdefault(lvl, levels.get("prior", 0.2) * (1.4 if lvl == "prior_borrowed" else 1))
    for lvl, (base, mult) in RULES.items():
        if lvl not in lv:
            levels[lvl] = levels[base] * mult
    # no evidence is surer than a measured step's own run-to-run spread (a judgement, not a fit)
    levels = {lvl: max(levels[lvl], FLOOR) for lvl in interval.LEVELS}
    eng = {name: float(s[n_l + i]) for i, name in enumerate(engines)}
    factors = {f: float(s[n_l + n_e + i]) for i, f in enumerate(fc)}
    factors.setdefault("spec_decoding", max(eng.values()))
    factors.setdefault("attention_dp", max(eng.values()))
    factors.setdefault("gpu_vendor", levels["prior_borrowed"])
    return Params(levels=levels, engines=eng, factors=factors, weight=weight)


def _sigma(r: Row, d: interval.IntervalsFile) -> float:
    return interval.sigma(r.f, d)[0]


def loo(rows: list[Row]) -> tuple[dict[str, object], list[tuple[Row, bool, float]]]:
    setups = sorted({r.setup for r in rows})
    scored: list[tuple[Row, bool, float]] = []
    for s in setups:
        train = [r for r in rows if r.setup != s]
        d = fit(train).data()
        for r in rows:
            if r.setup != s:
                continue
            sg = _sigma(r, d)
            inside = abs(r.err) <= Z * sg
            scored.append((r, inside, 2 * math.sinh(Z * sg) * 100))
    by_set: dict[str, list[bool]] = {}
    per_setup: dict[str, list[bool]] = {}
    for r, ok, _ in scored:
        by_set.setdefault(r.set, []).append(ok)
        per_setup.setdefault(r.setup, []).append(ok)
    figures = {
        "setups": len(setups),
        "rows": len(scored),
        "coverage": round(float(np.mean([ok for _, ok, _ in scored])), 3),
        "coverage_setup_weighted": round(
            float(np.mean([np.mean(v) for v in per_setup.values()])), 3
        ),
        "by_set": {k: round(float(np.mean(v)), 3) for k, v in sorted(by_set.items())},
        "rows_by_set": {k: len(v) for k, v in sorted(by_set.items())},
        "median_width_pct": round(float(np.median([wd for _, _, wd in scored])), 1),
    }
    return figures, scored


def h200_check(d: interval.IntervalsFile) -> list[tuple[str, float, float, float, float, bool]]:
    """The held-out vLLM 0.25 H200 run: (shape, measured ms, expected, low, high, inside)."""
    out = []
    measured = json.loads((H200 / "predict-vs-measured.json").read_text())
    for shape, conc, meas_ms, *_ in measured:
        pred = Prediction.model_validate_json(
            (H200 / "predicted-before-serving" / f"{shape}-b{conc}.json").read_text()
        )
        f = interval.features(pred)
        assert f is not None
        sg = interval.sigma(f, d)[0]
        lo, hi = interval.interval_of(pred.decode_ms_per_token, sg, d)
        out.append(
            (f"{shape} c={conc}", meas_ms, pred.decode_ms_per_token, lo, hi, lo <= meas_ms <= hi)
        )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"write {OUT.relative_to(ROOT)}")
    ap.add_argument("--no-records", action="store_true", help="published rows only (fast)")
    args = ap.parse_args(argv)
    rows = _csv_rows() + ([] if args.no_records else _batch_rows())
    figures, _ = loo(rows)
    print(f"rows {len(rows)} in {figures['setups']} setups")
    print(
        f"leave-one-setup-out coverage of the 80 % interval: {figures['coverage']:.1%} of rows, "
        f"{figures['coverage_setup_weighted']:.1%} setup-weighted; median width "
        f"{figures['median_width_pct']} % of expected"
    )
    for name, cov in figures["by_set"].items():  # type: ignore[attr-defined]
        print(f"  {name:32} {figures['rows_by_set'][name]:>5} rows  {cov:.1%}")  # type: ignore[index]
    final = fit(rows)
    data = final.data().model_dump()
    data["fitted_on"] = (
        f"{len(rows)} rows in {figures['setups']} setups: "
        + ", ".join(f"{k} {v}" for k, v in figures["rows_by_set"].items())  # type: ignore[attr-defined]
    )
    data["leave_one_setup_out"] = figures
    d = interval.IntervalsFile.model_validate(data)
    print("spreads (log sigma), fitted on all setups:")
    for k, v in {
        **d.levels,
        **{f"engine {k}": v for k, v in d.engines.items()},
        **d.factors,
    }.items():
        print(f"  {k:22} {v.sigma:.3f}  {v.how} (weight {v.rows})")
    print("check, never fitted: vLLM 0.25 on an H200 (2026-12-06), predictions made before serving")
    chk = h200_check(d)
    for name, meas, exp, lo, hi, ok in chk:
        print(
            f"  {name:22} measured {meas:6.2f} ms  expected {exp:6.2f} [{lo:6.2f}, {hi:6.2f}] "
            f"{'inside' if ok else 'OUTSIDE'}"
        )
    print(f"  inside: {sum(c[-1] for c in chk)} of {len(chk)}")
    if args.write:
        head = "# " + "\n# ".join(
            [
                "predict's 80 % interval spreads (ceiling.predict.interval, schema IntervalsFile).",
                "Written by experiments/validation/calibrate_intervals.py --write: fitted on the",
                "project's validation rows; leave_one_setup_out holds the coverage reached on",
                "setups left out of the fit. Do not edit by hand.",
            ]
        )
        OUT.write_text(head + "\n" + yaml.safe_dump(d.model_dump(), sort_keys=False))
        print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
