"""Sweep: ledger durability across a hard kill, resume, early stop, plan validation."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ceiling.errors import CeilingError
from ceiling.flows.sweep import run as run_sweep
from ceiling.sweep.early_stop import decide
from ceiling.sweep.ledger import Ledger
from ceiling.sweep.plan import EarlyStop, load_plan
from sweep_helpers import synthetic_trial, write_plan

TESTS = Path(__file__).parent


def _run(plan: Path, out: Path, resume: bool = False):
    return run_sweep(plan, out, resume=resume, trial_fn=synthetic_trial, preflight_fn=None)


def test_sweep_records_every_repeat_and_stops_early(tmp_path):
    plan = write_plan(tmp_path, ["base", "same", "fast", "slow"])
    res = _run(plan, tmp_path / "out")
    by = {v.name: v for v in res.variants}
    assert by["base"].repeats == 5 and by["base"].status == "done"
    # "same" and "slow" cannot beat the baseline: stopped after min_repeats.
    assert by["same"].status == "stopped_early" and by["same"].repeats == 3
    assert by["slow"].status == "stopped_early" and by["slow"].verdict == "slower than baseline"
    # "fast" might win, so it runs all repeats, and is found faster.
    assert by["fast"].status == "done" and by["fast"].repeats == 5
    assert by["fast"].verdict == "faster than baseline"
    assert by["fast"].delta_pct == pytest.approx(20.0, abs=0.5)
    assert "fast beats the baseline" in res.verdict.headline
    assert res.verdict.measured_tok_s is not None  # the baseline's rate, as a number
    assert (tmp_path / "out" / "sweep.json").is_file()
    html = (tmp_path / "out" / "report.html").read_text()
    assert "<svg" in html and "Variant comparison" in html


def test_second_run_without_resume_refuses(tmp_path):
    plan = write_plan(tmp_path, ["base"], repeats=2)
    _run(plan, tmp_path / "out")
    with pytest.raises(CeilingError, match="--resume"):
        _run(plan, tmp_path / "out")


def test_kill_mid_sweep_loses_nothing_and_resume_continues(tmp_path):
    plan = write_plan(tmp_path, ["base", "fast"], repeats=5)
    out = tmp_path / "out"
    calls = tmp_path / "calls.txt"
    script = (
        "import sys; from sweep_helpers import synthetic_trial;"
        "from ceiling.flows.sweep import run as run_sweep;"
        f"run_sweep({str(plan)!r}, {str(out)!r}, trial_fn=synthetic_trial, preflight_fn=None)"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "SWEEP_DELAY_S": "0.3",
        "SWEEP_CALLS": str(calls),
    }
    proc = subprocess.Popen([sys.executable, "-c", script], env=env)
    ledger = out / "ledger.sqlite"
    deadline = time.monotonic() + 60
    recorded = 0
    while time.monotonic() < deadline and recorded < 7:
        time.sleep(0.1)
        if ledger.exists():
            with sqlite3.connect(ledger) as db:
                try:
                    recorded = db.execute("SELECT COUNT(*) FROM repeats").fetchone()[0]
                except sqlite3.OperationalError:
                    recorded = 0
    proc.send_signal(signal.SIGKILL)  # a crash: no clean-up code runs
    proc.wait(timeout=10)
    assert recorded >= 7, "the sweep did not get far enough before the kill"
    with Ledger(ledger) as led:
        kept = {(v.name): led.repeat_count(v.fingerprint) for v in led.variants()}
        status = {v.name: v.status for v in led.variants()}
    assert kept["base"] == 5
    assert 2 <= kept["fast"] < 5
    assert status["fast"] == "running"  # died mid-trial: the ledger shows it
    before = calls.read_text().splitlines()

    os.environ["SWEEP_CALLS"] = str(calls)
    try:
        res = _run(plan, out, resume=True)
    finally:
        del os.environ["SWEEP_CALLS"]
    after = calls.read_text().splitlines()[len(before) :]
    # Only the missing repeats of "fast" ran again; the baseline was not touched.
    assert all(line.startswith("fast ") for line in after)
    assert [int(line.split()[1]) for line in after] == list(range(kept["fast"], 5))
    by = {v.name: v for v in res.variants}
    assert by["fast"].repeats == 5 and by["fast"].status == "done"
    assert by["base"].repeats == 5


def test_changed_variant_runs_again(tmp_path):
    plan = write_plan(tmp_path, ["base", "same"], repeats=3)
    out = tmp_path / "out"
    _run(plan, out)
    text = plan.read_text().replace("SYNTH_ID: '1'", "SYNTH_ID: 'changed'")
    plan.write_text(text)
    res = _run(plan, out, resume=True)
    with Ledger(out / "ledger.sqlite") as led:
        names = [v.name for v in led.variants()]
    assert names.count("same") == 2  # old fingerprint kept, new one run
    assert {v.name: v.repeats for v in res.variants}["same"] == 3


def test_early_stop_decision():
    pol = EarlyStop(min_repeats=3, min_gain_pct=1.0)
    base = [100.0, 100.3, 99.7, 100.0]
    assert not decide(base, [100.0, 99.0], pol).stop  # too few repeats
    d = decide(base, [100.0, 99.8, 100.2], pol)
    assert d.stop and "cannot significantly beat" in d.reason
    assert d.gain_high_pct is not None and d.gain_high_pct < 1.0
    assert not decide(base, [110.0, 111.0, 109.0], pol).stop  # clearly better: keep going
    noisy = [80.0, 130.0, 95.0]
    assert not decide(base, noisy, pol).stop  # wide CI may still reach +1 %
    assert not decide(base, [90.0, 90.0, 90.0], EarlyStop(enabled=False)).stop


def test_plan_validation(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text("variants:\n  - name: a\n    variant: x.yaml\n  - name: a\n    variant: y.yaml\n")
    with pytest.raises(CeilingError, match="duplicate"):
        load_plan(p)
    p.write_text("baseline: zz\nvariants:\n  - name: a\n    variant: x.yaml\n")
    with pytest.raises(CeilingError, match="baseline"):
        load_plan(p)
    p.write_text("variants:\n  - name: a\n")
    with pytest.raises(CeilingError, match="neither"):
        load_plan(p)
    with pytest.raises(CeilingError, match="not found"):
        load_plan(tmp_path / "missing.yaml")


def test_ctrl_c_marks_interrupted_and_resume_runs_only_the_rest(tmp_path):
    plan = write_plan(tmp_path, ["base", "fast"], repeats=4)
    out = tmp_path / "out"

    def interrupted(spec):
        for ev in synthetic_trial(spec):
            if spec.name == "fast" and ev.get("type") == "repeat" and ev["idx"] == 2:
                raise KeyboardInterrupt
            yield ev

    with pytest.raises(KeyboardInterrupt):
        run_sweep(plan, out, trial_fn=interrupted, preflight_fn=None)
    with Ledger(out / "ledger.sqlite") as led:
        rows = {v.name: v for v in led.variants()}
        assert rows["fast"].status == "interrupted"
        assert led.repeat_count(rows["fast"].fingerprint) == 2
    res = _run(plan, out, resume=True)
    assert {v.name: (v.status, v.repeats) for v in res.variants}["fast"] == ("done", 4)


def test_preflight_failures_are_recorded_not_launched(tmp_path):
    plan = write_plan(tmp_path, ["base", "same", "fast"], repeats=2)
    launched: list[str] = []

    def trial(spec):
        launched.append(spec.name)
        yield from synthetic_trial(spec)

    res = run_sweep(
        plan,
        tmp_path / "out",
        trial_fn=trial,
        preflight_fn=lambda paths: {"same": "unknown flag --bogus"},
    )
    by = {v.name: v for v in res.variants}
    assert by["same"].status == "failed" and "preflight: unknown flag --bogus" in by["same"].error
    assert "same" not in launched and launched == ["base", "fast"]
    with pytest.raises(CeilingError, match="baseline base fails preflight"):
        run_sweep(
            plan,
            tmp_path / "out2",
            trial_fn=trial,
            preflight_fn=lambda paths: {"base": "model path not found"},
        )


def test_inline_variant_keeps_the_parents_model_wherever_it_is_written(tmp_path):
    from ceiling.engines.variant import load_variant
    from ceiling.sweep.plan import fingerprint, materialize

    vdir = tmp_path / "variants"
    vdir.mkdir()
    (tmp_path / "model").mkdir()
    (vdir / "parent.yaml").write_text("engine: vllm\nmodel: ../model\nargs: {dtype: float32}\n")
    pdir = tmp_path / "plans"
    pdir.mkdir()
    (pdir / "p.yaml").write_text(
        "variants:\n"
        "  - name: base\n    variant: ../variants/parent.yaml\n"
        "  - name: eager\n    extends: ../variants/parent.yaml\n    args: {enforce-eager: true}\n"
    )
    plan = load_plan(pdir / "p.yaml")
    paths = materialize(plan, tmp_path / "elsewhere" / "out")
    base, eager = load_variant(paths["base"]), load_variant(paths["eager"])
    assert eager.model == base.model == str((tmp_path / "model").resolve())
    assert "--enforce-eager" in eager.argv() and "--dtype" in eager.argv()
    assert fingerprint(base, plan.bench) != fingerprint(eager, plan.bench)


def test_cli_sweep_bad_plan_is_one_line_error(tmp_path, capsys):
    from ceiling.cli import main

    assert main(["sweep", str(tmp_path / "missing.yaml"), "--out-dir", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: plan file not found") and "fix:" in err


def test_a_broken_variant_is_reported_broken_not_slow(tmp_path):
    """The sanity gate's ``broken`` event: no repeats, status broken, said in the verdict."""

    def trial(spec):
        if spec.name == "fast":
            yield {"type": "launched", "log_path": "/logs/fast.log"}
            yield {"type": "broken", "error": "broken output: known answers: 1 of 5 right"}
            return
        yield from synthetic_trial(spec)

    plan = write_plan(tmp_path, ["base", "fast"], repeats=3)
    res = run_sweep(plan, tmp_path / "out", trial_fn=trial, preflight_fn=None)
    by = {v.name: v for v in res.variants}
    assert by["fast"].status == "broken" and by["fast"].repeats == 0
    assert by["fast"].verdict == "broken output (not benchmarked)"
    assert by["fast"].error == "broken output: known answers: 1 of 5 right"
    assert "broken output, not benchmarked (sanity gate): fast" in res.verdict.notes
    assert by["base"].status == "done"
    # a finished state: resuming does not run it again
    again = run_sweep(plan, tmp_path / "out", resume=True, trial_fn=trial, preflight_fn=None)
    assert {v.name: v.status for v in again.variants}["fast"] == "broken"


def test_a_random_weights_variant_is_measured_past_the_gate(tmp_path, monkeypatch):
    """``--load-format dummy`` answers noise by design: the sweep measures it (the doctor's rule)
    and the sanity event says why; the same broken verdict without it stops the trial."""
    import contextlib
    from types import SimpleNamespace

    from ceiling.bench.results import RunResult
    from ceiling.flows import sweep_trial
    from ceiling.flows.sweep_trial import TrialSpec, execute_trial

    server = SimpleNamespace(url="http://127.0.0.1:1", model="m", log_path=tmp_path / "s.log",
                             api_key=None, alive=lambda: True)  # fmt: skip

    @contextlib.contextmanager
    def fake_launch(*a, **k):
        yield server

    broken = SimpleNamespace(verdict="broken", headline="broken: known answers: 0 of 5 right",
                             model_dump=lambda mode: {"verdict": "broken"})  # fmt: skip
    monkeypatch.setattr(sweep_trial, "launch", fake_launch)
    monkeypatch.setattr(sweep_trial, "doctor_gate", lambda *a, **k: broken)
    monkeypatch.setattr(
        sweep_trial, "run_bench",
        lambda cfg, progress: RunResult.model_validate({"decode_tok_s_per_stream": 200.0}),
    )  # fmt: skip

    def events(args: str) -> list:
        v = tmp_path / f"v{len(args)}.yaml"
        v.write_text(f"engine: vllm\nmodel: /m\nargs: {args}\n")
        spec = TrialSpec(name="x", variant_path=str(v), fingerprint="f", bench={"mode": "single"},
                         repeats_total=1, out_dir=str(tmp_path), log_dir=str(tmp_path))  # fmt: skip
        return list(execute_trial(spec))

    dummy = events("{load-format: dummy}")
    assert [type(e).__name__ for e in dummy] == ["Launched", "SanityPassed", "Repeat", "Done"]
    assert "random weights" in dummy[1].sanity["override"]
    plain = events("{dtype: bfloat16}")
    assert [type(e).__name__ for e in plain] == ["Launched", "Broken"]
