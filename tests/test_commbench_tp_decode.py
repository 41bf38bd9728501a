"""experiments/gpu/tp_decode.py (issue 7's TP decode step) runs end to end with gloo at TP=2 on the CPU,
dense and MoE, and its ranks agree on the hidden state after the allreduces."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from script_module import load_script

pytest.importorskip("torch")
SCRIPT = Path(__file__).parents[1] / "experiments" / "gpu" / "tp_decode.py"


@pytest.mark.parametrize("model", ["dense", "moe"])
def test_tiny_tp2_on_gloo(tmp_path, model):
    out = tmp_path / "r.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--tiny",
            "--model",
            model,
            "--tp",
            "2",
            "--backend",
            "gloo",
            "--variant",
            "default",
            "--iters",
            "3",
            "--timeout",
            "120",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (row,) = json.loads(out.read_text())["rows"]
    assert row["tp"] == 2 and row["backend"] == "gloo"
    assert row["finite"] and row["ranks_consistent"]
    assert row["eager_ms"] > 0 and row["graph_ms"] is None
    assert row["allreduces_per_step"] == 2 * row["layers"] + 1
    assert (row["moe_impl"] is not None) == (model == "moe")


def _tp_decode(*extra: str) -> list[str]:
    return [
        sys.executable,
        str(SCRIPT),
        "--tiny",
        "--model",
        "dense",
        "--backend",
        "gloo",
        "--iters",
        "3",
        *extra,
    ]


def test_a_hung_rank_leaves_its_configuration_stage_and_stack_and_earlier_rows(tmp_path):
    out = tmp_path / "r.json"
    # the limit covers the configuration's start-up too (two ranks importing torch, gloo's
    # rendezvous): 10 s let a rank time out before it reached the hang on a loaded box
    cmd = _tp_decode("--tp", "1,2", "--timeout", "20", "--debug-hang", "1:eager timing")
    proc = subprocess.run([*cmd, "--out", str(out)], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    ok, hung = doc["rows"]
    assert ok["tp"] == 1 and ok["eager_ms"] > 0 and "error" not in ok  # measured before: kept
    assert hung["tp"] == 2 and "timed out" in hung["error"]
    r0, r1 = hung["ranks"]["ranks"]
    assert r1["stage"] == "eager timing" and r1["stopped"]
    assert r0["stage"] == "eager timing" and any("all_reduce" in ln for ln in r0["last_words"])
    assert doc["running"] is None
    assert "rank1 last words" in proc.stdout


def test_numbers_measured_before_a_teardown_hang_are_kept(tmp_path):
    out = tmp_path / "r.json"
    cmd = _tp_decode("--tp", "2", "--timeout", "20", "--debug-hang", "1:destroy_process_group")
    subprocess.run([*cmd, "--out", str(out)], capture_output=True, text=True, timeout=180)
    (row,) = json.loads(out.read_text())["rows"]
    assert row["eager_ms"] > 0 and "error" not in row
    assert "destroy_process_group" in row["teardown_error"]


def test_sigterm_keeps_the_record_and_leaves_no_rank_running(tmp_path):
    import signal
    import time

    out = tmp_path / "r.json"
    cmd = _tp_decode("--tp", "2", "--timeout", "300", "--debug-hang", "1:eager timing")
    # a tag in the environment the ranks inherit: under pytest-xdist another test's tp_decode
    # ranks may run at the same time, and only this run's must be gone
    tag = f"CEILING_TEST_RUN={tmp_path.name}-{os.getpid()}"
    env = {**os.environ, "CEILING_TEST_RUN": tag.split("=", 1)[1]}
    proc = subprocess.Popen([*cmd, "--out", str(out)], stdout=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # wait until the ranks sit in the hang
        if out.is_file() and json.loads(out.read_text()).get("running"):
            time.sleep(8)
            break
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(timeout=30)
    assert rc == 130
    (row,) = json.loads(out.read_text())["rows"]
    assert row["error"].startswith("ranks failed (interrupted")
    # each rank's stage and last words are on record (on a loaded machine it may not have
    # reached the injected hang yet: where it stood is what matters)
    assert all(r["stage"] and r["last_words"] for r in row["ranks"]["ranks"])
    left = []
    for p in Path("/proc").glob("[0-9]*"):
        try:
            if tag.encode() in (p / "environ").read_bytes().split(b"\0"):
                left.append(p.name)
        except OSError:
            continue  # gone, or not ours to read
    assert left == [], f"ranks of this run still running: {left}"


REPORT = Path(__file__).parents[1] / "experiments" / "gpu" / "trace_report.py"


def test_traced_tp2_on_gloo_both_ranks_allreduces_counted_and_the_step_matches_its_clock(
    tmp_path,
):
    """--trace records every rank's steps; ceiling.trace reads them: each rank's allreduce
    class holds (2 x layers + 1) calls per step, and classes + idle (the trace's step) agree with
    the step timed independently on the rank's own clock (perf_counter on a CPU). The bound is
    the issue's 5 %: both clocks time the same host spans, so on this CPU they agree to ~0.01 %
    (measured: 49.924 vs 49.922 ms); the slack is for a loaded box's scheduling between the
    profiler's annotation and the clock's read."""
    from ceiling.trace import read_trace, split

    out, tr = tmp_path / "r.json", tmp_path / "traces"
    cmd = _tp_decode("--tp", "2", "--timeout", "150", "--trace", str(tr), "--trace-steps", "3")
    proc = subprocess.run([*cmd, "--out", str(out)], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (row,) = json.loads(out.read_text())["rows"]
    mode = tr / row["trace_dir"] / "eager"
    files = sorted(mode.glob("rank*.pt.trace.json.gz"))
    assert len(files) == 2
    s = split([read_trace(p) for p in files])
    assert sorted(r.rank for r in s.ranks) == [0, 1] and not s.missing_ranks
    per_step = row["allreduces_per_step"]
    assert per_step == 2 * row["layers"] + 1
    for r in s.ranks:
        alone = split([read_trace(mode / f"rank{r.rank}.pt.trace.json.gz")])
        ar = next(c for c in alone.classes if c.op_class == "allreduce")
        assert ar.ms > 0
        assert ar.calls * alone.steps == per_step * 3 and alone.steps == 3
        ag = next(c for c in alone.classes if c.op_class == "allgather")
        assert ag.calls == 1
        clock = json.loads((mode / f"steps_rank{r.rank}.json").read_text())
        assert clock["clock"] == "perf_counter" and len(clock["steps_ms"]) == 3
        measured = sum(clock["steps_ms"]) / 3
        assert abs(sum(r.classes.values()) + r.idle_ms - measured) <= 0.05 * measured
    assert s.collective_waits and s.collective_waits[0].op_class == "allreduce"

    # the report step on the same traces: the figures and the goals, per rank
    rep = tmp_path / "rep.json"
    proc = subprocess.run(
        [sys.executable, str(REPORT), str(tmp_path), "--json", str(rep)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (cfg,) = json.loads(rep.read_text())["configs"]
    (m,) = cfg["modes"]
    assert m["mode"] == "eager" and m["ranks_present"] == [0, 1]
    assert all(abs(r["step_vs_clock_pct"]) <= 5 for r in m["ranks"])
    ar = next(c for c in m["collectives"] if c["op_class"] == "allreduce")
    assert ar["calls_per_step"] == {"0": per_step, "1": per_step}  # JSON keys
    states = {g["goal"].split(" ")[0]: g["state"] for g in m["goals"]}
    assert states["allreduce"] == "not measured"  # no commbench.json in the folder
    assert "| idle |" in proc.stdout and "classes + idle" in proc.stdout


def test_traced_tp1_is_the_one_gpu_evidence_held_to_issue_23s_goals(tmp_path):
    """At TP=1 --trace is the one-GPU trace path (issue 23, once experiments/gpu/trace_decode.py):
    one rank's trace and clock, no collectives, the report's goals are issue 23's (coverage,
    classes + idle against the clock) and it sets the traced step against the untraced median
    (the profiler's cost). A batch other than 1 names its own folder, so batches side by side
    under one DIR stay apart."""
    out, tr = tmp_path / "r.json", tmp_path / "traces"
    cmd = _tp_decode("--tp", "1", "--batch", "2", "--timeout", "150", "--trace", str(tr))
    proc = subprocess.run(
        [*cmd, "--trace-steps", "3", "--out", str(out)], capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (row,) = json.loads(out.read_text())["rows"]
    assert row["trace_dir"] == "dense_tp1_tp_default_b2" and row["allreduces_per_step"] == 0
    mode = tr / row["trace_dir"] / "eager"
    assert [p.name for p in mode.glob("rank*.pt.trace.json.gz")] == ["rank0.pt.trace.json.gz"]
    rep = tmp_path / "rep.json"
    proc = subprocess.run(
        [sys.executable, str(REPORT), str(tr), "--json", str(rep)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (cfg,) = json.loads(rep.read_text())["configs"]
    (m,) = cfg["modes"]
    assert m["ranks_present"] == [0] and m["untraced_ms"] == row["eager_ms"]
    clock = m["ranks"][0]["clock_step_ms"]
    assert m["profiler_cost_pct"] == pytest.approx(
        (clock - row["eager_ms"]) / row["eager_ms"] * 100, abs=0.06
    )
    goals = {g["goal"].split(" ")[0]: g for g in m["goals"]}
    assert {g["issue"] for g in goals.values()} == {23}
    assert set(goals) == {">=", "classes"}  # no collective goal without collectives
    assert goals["classes"]["state"] == "met", goals["classes"]
    assert "the profiler costs the step" in proc.stdout


def test_trace_report_compares_the_allreduce_class_with_commbench_x_count():
    """commbench's latency at the step's message size (log-log between measured sizes) x the
    step's allreduce count is what the allreduce class is held against."""
    mod = load_script(REPORT)
    doc = {
        "runs": [
            {
                "world_size": 2,
                "variant": "default",
                "rows": [
                    {"size_bytes": 4096, "time_us": 20.0, "graph_time_us": 8.0, "correct": True},
                    {"size_bytes": 16384, "time_us": 40.0, "graph_time_us": 16.0, "correct": True},
                ],
            }
        ]
    }
    us, _ = mod.commbench_us(doc, 2, "default", 8192, graph=True)
    assert us == pytest.approx(8.0 * 2**0.5)  # halfway in log size: the geometric mean
    assert mod.commbench_us(doc, 2, "default", 4096, graph=False)[0] == 20.0
    assert mod.commbench_us(doc, 4, "default", 4096, graph=False)[0] is None
    assert mod.commbench_us(doc, 2, "p2p-off", 4096, graph=False)[0] is None
    assert mod.commbench_us(doc, 2, "default", 1 << 20, graph=False)[0] is None


def test_trace_report_goals_of_issue_29_at_tp4():
    """TP >= 4 rows are held to issue 29's goals: skew reported, graph row within 10 % of
    predict (15 % for EP), the allreduce class against commbench x count."""
    mod = load_script(REPORT)
    ranks = [{"rank": r, "coverage": 1.0} for r in range(4)]
    m = {
        "mode": "graph",
        "ranks": ranks,
        "missing_ranks": [],
        "collective_waits": [{"op_class": "allreduce"}],
        "rank_spread_pct": 1.0,
        "slowest_rank": 2,
        "measured_graph_ms": 10.0,
        "predicted_graph_ms": 11.2,
        "collectives": [
            {
                "op_class": "allreduce",
                "count_expected": 161,
                "vs_commbench_pct": 4.0,
                "ms": 1.04,
                "commbench_x_count_ms": 1.0,
                "commbench_how": "",
            }
        ],
    }
    tp = {g["goal"].split(" ")[0]: g for g in mod.goals({"tp": 4, "parallel": "tp"}, m)}
    assert {g["issue"] for g in tp.values()} == {29}
    assert tp["allreduce"]["state"] == "met" and tp["skew"]["state"] == "met"
    assert tp["graph"]["state"] == "not met"  # +12 % against a 10 % goal
    ep = {g["goal"].split(" ")[0]: g for g in mod.goals({"tp": 4, "parallel": "ep"}, m)}
    assert ep["graph"]["state"] == "met"  # EP rows: within 15 %
    m["missing_ranks"] = [3]
    assert mod.goals({"tp": 4}, m)[1]["state"] == "not met"  # a rank's trace is missing
