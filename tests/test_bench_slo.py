"""SLOs, goodput and the chosen percentiles of ``ceiling bench`` (ceiling.bench.slo)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ceiling.bench.config import BenchConfig
from ceiling.bench.metrics import RequestRecord
from ceiling.bench.runner import run_bench
from ceiling.bench.slo import Slo, goodput, parse_percentiles, parse_slos
from ceiling.cli import main
from ceiling.errors import CeilingError
from sse_server import Plan, SSEServer

pytestmark = pytest.mark.timeout(120)


def test_slos_parse_into_typed_objectives() -> None:
    slos = parse_slos("ttft:P99<=500ms, itl:p90<=50ms,e2el:mean<=2s,tpot:p99.9<=800us")
    assert [(s.metric, s.stat, s.threshold_ms) for s in slos] == [
        ("ttft", "p99", 500.0),
        ("itl", "p90", 50.0),
        ("e2el", "mean", 2000.0),
        ("tpot", "p99.9", 0.8),
    ]
    assert [s.key for s in slos] == ["p99_ttft_ms", "p90_itl_ms", "mean_e2el_ms", "p99.9_tpot_ms"]
    assert parse_slos("ttfct:median<=1s")[0].key == "median_ttfct_ms"
    assert parse_slos(None) == []


@pytest.mark.parametrize(
    ("text", "problem", "fix"),
    [
        ("ttft:p99<=500", "has no unit", "500ms"),
        ("ttft<=500ms", "METRIC:STAT<=VALUE", "ttft:p99<=500ms"),
        ("latency:p99<=5ms", "no metric 'latency'", "ttft, ttfct, tpot, itl, e2el"),
        ("ttft:p99>=5ms", "'>='", "write <="),
        ("ttft:p0<=5ms", "bad percentile '0'", "p99.9"),
        ("ttft:p101<=5ms", "bad percentile '101'", "p99.9"),
        ("ttft:max<=5ms", "no statistic 'max'", "mean or median"),
        ("ttft:p99<=5min", "unknown unit 'min'", "ms, s or us"),
        ("ttft:p99<=fast", "is not a time", "500ms"),
        ("ttft:p99<=0ms", "above 0", "--slo"),
        ("ttft:p99<=5ms,,itl:p90<=1ms", "an empty item", "--slo"),
        ("ttft:p99<=5ms,ttft:P99<=6ms", "two objectives for ttft:p99", "once"),
    ],
)
def test_a_bad_slo_names_the_problem_and_the_fix(text: str, problem: str, fix: str) -> None:
    with pytest.raises(CeilingError) as err:
        parse_slos(text)
    assert problem in err.value.message and fix in (err.value.fix or "")


def test_percentiles_parse_strictly() -> None:
    assert parse_percentiles("99,50, p90,99.9") == [50.0, 90.0, 99.0, 99.9]
    for bad in ("", "50,,99", "0", "100.5", "x"):
        with pytest.raises(CeilingError) as err:
            parse_percentiles(bad)
        assert "--percentiles" in err.value.message or "--percentiles" in (err.value.fix or "")


def _rec(ttft: float | None, itl: list[float], tokens: int, ok: bool = True) -> RequestRecord:
    e2el = None if ttft is None else ttft + sum(itl)
    tpot = (e2el - ttft) / (tokens - 1) if ttft is not None and e2el and tokens > 1 else None
    return RequestRecord(
        index=0,
        t_send_s=0.0,
        ok=ok,
        ttft_ms=ttft,
        e2el_ms=e2el,
        tpot_ms=tpot,
        itl_ms=itl,
        output_tokens=tokens,
    )


def test_goodput_judges_each_request_on_its_own_values() -> None:
    slos = parse_slos("ttft:p99<=100ms,itl:p90<=10ms")
    records = [
        _rec(50, [5, 5, 5], 4),  # good
        _rec(150, [5, 5], 3),  # TTFT misses
        _rec(50, [5, 30], 3),  # its mean ITL 17.5 ms misses (one gap of 30 alone would not decide)
        _rec(50, [5, 14], 3),  # mean ITL 9.5 ms: meets, though one gap is over 10
        _rec(80, [], 1),  # one token: no ITL, meets (as vLLM's TPOT 0)
        _rec(10, [1], 2, ok=False),  # failed: never good
        _rec(None, [], 0),  # completed without a first token: misses TTFT
    ]
    good, rate = goodput(records, slos, duration_s=2.0)
    assert good == 3 and rate == 1.5


def _scenario(i: int, _body: dict[str, Any]) -> Plan:
    # every other request is slow to start: exactly half meet a 100 ms TTFT objective
    return Plan(ttft_s=0.25 if i % 2 else 0.005, itl_s=0.002)


def test_goodput_counts_exactly_the_requests_that_met_every_slo(tmp_path: Path) -> None:
    options: dict[str, Any] = dict(
        max_tokens=4,
        input_len=8,
        warmup=0,
        requests=10,
        slo=[Slo(metric="ttft", stat="p50", threshold_ms=100.0)],
        percentiles=[50, 99.9],
    )
    with SSEServer(_scenario) as srv:
        res = run_bench(BenchConfig(url=srv.url, **options), progress=False)
    assert res.completed == 10 and res.good_completed == 5
    assert res.request_goodput == pytest.approx(5 / res.duration)
    (check,) = res.slo
    assert check.missed_requests == 5 and check.value_ms == res.p50_ttft_ms  # type: ignore[attr-defined]
    assert check.met == (check.value_ms is not None and check.value_ms <= 100.0)
    extra = res.model_extra or {}
    assert "p99.9_ttft_ms" in extra and "p90_ttft_ms" not in extra and res.p99_ttft_ms is None
    assert res.repeats[0].good_completed == 5


def test_bench_cli_reports_slos_and_goodput_in_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with SSEServer(Plan(ttft_s=0.005, itl_s=0.002)) as srv:
        rc = main(
            [
                "bench", "--url", srv.url, "--max-tokens", "4", "--requests", "4",
                "--warmup", "0", "--quiet", "--json", "--out", str(tmp_path / "r.json"),
                "--slo", "ttft:p99<=2s,tpot:p90<=1s", "--percentiles", "50,99",
            ]
        )  # fmt: skip
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["good_completed"] == 4 and summary["slo_met"] is True
    assert [c["slo"] for c in summary["slo"]] == ["ttft:p99<=2000ms", "tpot:p90<=1000ms"]
    assert summary["config"]["slo"][0] == {"metric": "ttft", "stat": "p99", "threshold_ms": 2000.0}
    assert "p90_tpot_ms" in summary and "p99_ttft_ms" in summary


def test_bench_cli_refuses_a_bad_slo_before_any_request(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with SSEServer(Plan()) as srv:
        rc = main(["bench", "--url", srv.url, "--slo", "ttft:p99<500ms", "--quiet"])
        assert srv.n_requests == 0
    assert rc == 2
    err = capsys.readouterr().err
    assert "'<'" in err and "fix:" in err


def test_bench_table_shows_goodput_per_level(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with SSEServer(Plan(ttft_s=0.005, itl_s=0.002)) as srv:
        rc = main(
            [
                "bench", "--url", srv.url, "--max-tokens", "4", "--requests", "3",
                "--warmup", "0", "--quiet", "--out", str(tmp_path / "r.json"),
                "--slo", "ttft:p99<=1ms",
            ]
        )  # fmt: skip
    assert rc == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "requests met every SLO" in text and "ttft:p99<=1ms" in text and "MISSED" in text
