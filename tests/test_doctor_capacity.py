"""``doctor --slo``: the verdict's capacity line from the closed-loop concurrency levels.

The stand-in server serves one request at a time (``slots=1``) and queues the rest, so its
latency curve is known: a request of 12 tokens takes S = 5 ms + 11 x 20 ms = 225 ms; at one
stream nothing waits (TTFT about 5 ms), at two streams every request but the first waits about
S for the other stream's (TTFT about 230 ms). A TTFT objective of 110 ms therefore holds at
concurrency 1 and binds at 2 and 4, with 105 ms of margin either way (55 ms was too little on
a loaded 2-core box: one stream's TTFT read over 60 ms there).
"""

from __future__ import annotations

import json

import pytest

from ceiling.bench.slo import parse_slos
from ceiling.cli import main
from ceiling.diagnose.closed_loop import closed_loop_capacity
from sse_server import Plan, SSEServer
from test_doctor import _cfg, model_dir, run_doctor  # noqa: F401  (model_dir: a fixture)

pytestmark = pytest.mark.timeout(180)

PLAN = Plan(ttft_s=0.005, itl_s=0.02)
SLO = "ttft:p99<=110ms,e2el:p99<=10s"


def test_the_verdict_gains_the_closed_loop_capacity_line(model_dir, tmp_path):  # noqa: F811
    with SSEServer(PLAN, slots=1) as srv:
        res = run_doctor(
            _cfg(srv.url, model_dir, tmp_path / "out", concurrency=[1, 2, 4], slo=parse_slos(SLO))
        )
    sweep = res.bench["concurrency"]
    # the SLOs reached the bench stage: each level has its goodput, counted per request
    for lv in sweep.levels:
        assert lv.requests is not None  # the doctor keeps per-request records
        good = sum(1 for r in lv.requests if r.ok and r.ttft_ms is not None and r.ttft_ms <= 110)
        assert lv.good_completed == good
    v = res.verdict
    assert v is not None and v.capacity is not None
    cap = v.capacity
    assert [lv.concurrency for lv in cap.levels] == [1, 2, 4]
    assert [lv.passed for lv in cap.levels] == [True, False, False]
    assert cap.highest_passing == 1 and cap.first_failing == 2
    assert cap.binding_slo == "ttft:p99<=110ms"  # the e2el objective never binds here
    assert cap.levels[0].good_completed == cap.levels[0].sent == 4
    line = cap.sentence
    assert line in v.notes
    assert "closed-loop concurrency levels 1, 2, 4 (not a Poisson capacity search)" in line
    assert "concurrency 1 is the highest level whose goodput met them" in line
    assert "at concurrency 2, ttft:p99<=110ms binds" in line
    assert "`ceiling bench --mode capacity --slo ttft:p99<=110ms,e2el:p99<=10000ms`" in line
    # the report and doctor.json carry it
    out = tmp_path / "out"
    assert f"- {line}" in (out / "report.md").read_text()
    saved = json.loads((out / "doctor.json").read_text())
    assert saved["verdict"]["capacity"]["highest_passing"] == 1
    assert saved["verdict"]["capacity"]["sentence"] == line
    assert saved["config"]["slo"][0] == {"metric": "ttft", "stat": "p99", "threshold_ms": 110.0}


def test_cli_doctor_slo_json_and_reproduce(model_dir, tmp_path, capsys):  # noqa: F811
    args = ["--model", str(model_dir), "--max-tokens", "8", "--repeat", "2"]
    args += ["--concurrency", "1,2", "--concurrency-max-tokens", "12", "--no-telemetry"]
    args += ["--no-sanity", "--out-dir", str(tmp_path / "o"), "--json", "--slo", SLO]
    with SSEServer(PLAN, slots=1) as srv:
        rc = main(["doctor", "--url", srv.url, *args])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    cap = doc["verdict"]["capacity"]
    assert cap["highest_passing"] == 1 and cap["binding_slo"] == "ttft:p99<=110ms"
    assert [lv["passed"] for lv in cap["levels"]] == [True, False]
    # the Reproduce lines rerun the same objectives: doctor's, and the sweep's bench
    doctor_line, *bench_lines = (c for c in doc["reproduce"] if "--slo" in c)
    assert doctor_line.startswith("ceiling doctor") and bench_lines
    assert "ttft:p99<=110ms,e2el:p99<=10000ms" in doctor_line
    assert "--mode concurrency" in bench_lines[0]


def test_without_slos_no_capacity_line_and_without_levels_it_says_so(model_dir, tmp_path):  # noqa: F811
    with SSEServer(PLAN) as srv:
        plain = run_doctor(_cfg(srv.url, model_dir, tmp_path / "a", concurrency=[1]))
        none = run_doctor(
            _cfg(srv.url, model_dir, tmp_path / "b", concurrency=[], slo=parse_slos(SLO))
        )
    assert plain.verdict is not None and plain.verdict.capacity is None
    assert not any("Capacity within" in n for n in plain.verdict.notes)
    cap = none.verdict.capacity if none.verdict else None
    assert cap is not None and cap.levels == [] and cap.highest_passing is None
    assert "no concurrency level was measured (--concurrency none)" in cap.sentence


def test_no_level_passing_names_the_slo_binding_at_the_first() -> None:
    from ceiling.bench.results import LevelResult

    def level(c: int, good: int, missed_ttft: int) -> LevelResult:
        check = {"slo": "ttft:p99<=110ms", "metric": "ttft", "stat": "p99", "threshold_ms": 110.0}
        check |= {"value_ms": 150.0, "met": False, "missed_requests": missed_ttft}
        return LevelResult.model_validate(
            {"concurrency": c, "completed": 8, "failed": 0, "good_completed": good, "slo": [check]}
        )

    cap = closed_loop_capacity([level(2, 2, 6), level(1, 7, 1)], ["ttft:p99<=110ms"])
    assert [lv.concurrency for lv in cap.levels] == [1, 2]  # by concurrency
    assert cap.highest_passing is None and cap.first_failing == 1
    assert cap.binding_slo == "ttft:p99<=110ms"
    assert "no level met them" in cap.sentence
    assert "at concurrency 1, ttft:p99<=110ms binds (1 of 8 requests outside the SLOs)" in (
        cap.sentence
    )
