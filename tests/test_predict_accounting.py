"""Honest accounting (issue 39, deliverable 3): every validation set and row says when it was
added and whether the model was changed with it in sight; the validation command prints the
held-out rows apart, as first scored and now, with median and p90 |error| of held-out and seen."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
from validation.accounting import first_scores, held_out_account, ledger
from validation.calibration import evaluate, is_held_out, validation_csvs

from script_module import load_script

ROOT = Path(__file__).resolve().parents[1]


def test_every_validation_set_says_when_added_and_whether_seen():
    sets = ledger().sets
    names = {s.name for s in sets}
    # the rows outside the shipped CSVs are accounted too
    assert {"batch-curve", "llamacpp-h200-held-out", "vllm-0.25-h200"} <= names
    for s in sets:
        date = s.added.split()[0]
        assert len(date) == 10 and date.startswith("2026-"), s.name
        if s.seen == "no":
            assert s.first is not None and s.first.n > 0, f"{s.name}: held out, no first score"
        if s.result:
            assert (ROOT / s.result.split(" (")[0]).exists(), s.result


def test_every_held_out_row_keeps_its_first_score():
    held = first_scores()
    assert held, "no held-out rows"
    for rid, row in held.items():
        date, commit = row["first_scored"].split()
        assert len(date) == 10 and len(commit) >= 7, rid
        float(row["first_err_tables"]), float(row["first_err_priors"])
    # seen rows carry a first score only where it was recomputed with their set (V036, V037)
    scored_seen = {
        row["id"]
        for p in validation_csvs()
        for row in csv.DictReader(p.open())
        if not is_held_out(row) and row.get("first_scored")
    }
    assert scored_seen == {"V036", "V037"}


def test_held_out_apart_from_seen_with_median_and_p90(priors_only):
    res = evaluate()
    acc = held_out_account(res, with_tables=False)
    assert acc.evidence == "priors"
    ids = {r.id for r in acc.rows}
    assert ids and ids <= set(res.held_out_ids)
    firsts = [abs(r.first_error_pct) for r in acc.rows if r.first_error_pct is not None]
    assert acc.held_out_first.n == len(firsts)
    assert acc.held_out_first.median_abs_error_pct == round(float(np.median(firsts)), 1)
    assert acc.held_out_first.p90_abs_error_pct == round(float(np.percentile(firsts, 90)), 1)
    seen = [m for m in res.modelled if m.use == "all" and not m.held_out]
    assert acc.seen_now.n == len(seen) and not ids & {m.id for m in seen}
    assert acc.held_out_now.p90_abs_error_pct is not None


def test_validation_command_prints_held_out_apart(priors_only, capsys):
    mod = load_script(ROOT / "experiments/validation/predict_accuracy.py")
    assert mod.main([]) == 0
    text = capsys.readouterr().out
    assert "HELD-OUT rows (seen: no), as first scored (priors) and now" in text
    for line in ("held-out, as first scored", "held-out, now", "seen (looked at), now"):
        assert line in text
    assert "validation sets (validation_sets.yaml)" in text
    assert mod.main(["--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["held_out_as_first_scored"]["held_out_first"]["n"] > 0
    assert {s["name"] for s in data["validation_sets"]} >= {"batch-curve", "calibration"}
