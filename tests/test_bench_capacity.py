"""``bench --mode capacity``: the bracketing search, and the knee of a server with a known
service rate (tests/sse_server.py with slots: a queue in front of K request slots)."""

from __future__ import annotations

import asyncio
import heapq
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from ceiling.bench.capacity import MAX_LEVELS, level_requests, search
from ceiling.bench.config import BenchConfig
from ceiling.bench.results import LevelResult, load_result
from ceiling.bench.slo import SloCheck, parse_slos
from ceiling.bench.workloads import arrival_offsets
from ceiling.cli import main
from ceiling.errors import CeilingError

pytestmark = pytest.mark.timeout(180)
URL = "http://127.0.0.1:8000"
HERE = Path(__file__).resolve().parent


def _level(good: int, sent: int, missed: dict[str, int] | None = None) -> LevelResult:
    checks = [
        SloCheck(slo=k, metric="ttft", stat="p99", threshold_ms=1, value_ms=1, met=v == 0,
                 missed_requests=v)
        for k, v in (missed or {}).items()
    ]  # fmt: skip
    return LevelResult(completed=sent, good_completed=good, slo=checks)


def _fake(knee: float, asked: list[tuple[float, int]]):  # type: ignore[no-untyped-def]
    async def measure(rate: float, n: int) -> LevelResult:
        asked.append((rate, n))
        if rate <= knee:
            return _level(100, 100, {"ttft:p99<=1ms": 0, "itl:p90<=1ms": 0})
        return _level(60, 100, {"ttft:p99<=1ms": 40, "itl:p90<=1ms": 3})

    return measure


@pytest.mark.parametrize(("start", "knee"), [(1.0, 37.3), (100.0, 3.7), (5.0, 5.0)])
def test_the_search_brackets_then_bisects_to_the_knee(start: float, knee: float) -> None:
    asked: list[tuple[float, int]] = []
    levels, res = asyncio.run(
        search(_fake(knee, asked), start=start, precision=0.02, min_requests=50, min_seconds=2.0)
    )
    assert res.knee_rate is not None and res.first_failing_rate is not None
    assert res.knee_rate <= knee < res.first_failing_rate <= res.knee_rate * 1.02
    assert res.binding_slo == "ttft:p99<=1ms" and res.stopped == "bracketed within 2%"
    assert [p.rate for p in res.curve] == sorted(r for r, _ in asked)  # the curve, by rate
    assert [lv.good_completed for lv in levels] == [p.good_completed for p in res.curve]
    assert all(n == level_requests(r, 50, 2.0) == max(50, int(np.ceil(r * 2.0))) for r, n in asked)
    assert "max(50, ceil(rate x 2 s))" in res.level_rule


def test_a_server_that_never_meets_the_slos_has_no_knee() -> None:
    asked: list[tuple[float, int]] = []
    _, res = asyncio.run(search(_fake(0.0, asked), start=1.0))
    assert res.knee_rate is None and "missed the SLOs" in res.stopped
    assert len(asked) == 11  # the start and ten halvings


def test_the_search_stops_at_its_level_budget() -> None:
    async def drifting(rate: float, n: int) -> LevelResult:
        return _level(100, 100)  # never fails: the bracket never closes

    _, res = asyncio.run(search(drifting, start=1.0))
    assert len(res.curve) == MAX_LEVELS and res.first_failing_rate is None
    assert str(MAX_LEVELS) in res.stopped


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"mode": "capacity"}, "--mode capacity needs --slo"),
        ({"mode": "rate", "rate": 1.0, "tolerance": 0.1}, "--tolerance conflicts"),
        ({"mode": "capacity", "slo": parse_slos("ttft:p99<=1s"), "repeat": 3}, "--repeat 3"),
    ],
)
def test_capacity_options_are_checked(options: dict[str, object], problem: str) -> None:
    with pytest.raises(CeilingError) as err:
        BenchConfig(url=URL, **options)  # type: ignore[arg-type]
    assert problem in err.value.message and err.value.fix


# -- the knee of a server with a known service rate ------------------------------------------
# Slow requests at a low rate: a few hundred chunks/s, so that a busy shared machine (the
# client and server share its cores) is not what saturates first.
SLOTS, TTFT_S, ITL_S, TOKENS = 8, 0.05, 0.05, 5
SERVICE_S = TTFT_S + (TOKENS - 1) * ITL_S  # 250 ms a request: capacity 32 req/s
TTFT_SLO_MS = 300.0  # a request may wait 250 ms (one service time) in the queue
MIN_REQUESTS, MIN_SECONDS, TOLERANCE, SEED = 80, 0.1, 0.05, 0


def _model_passes(rate: float, service_s: float, ttft_s: float) -> bool:
    """The level at ``rate`` on the queueing model of the server (K slots, deterministic
    service, FIFO), fed the very arrivals the bench sends (same seed, same generator)."""
    n = level_requests(rate, MIN_REQUESTS, MIN_SECONDS)
    sends = arrival_offsets(n, rate, 1.0, np.random.default_rng(SEED))
    free = [0.0] * SLOTS
    good = 0
    for t in sends:
        start = max(t, heapq.heappop(free))
        heapq.heappush(free, start + service_s)
        good += (start - t + ttft_s) * 1000.0 <= TTFT_SLO_MS
    return good >= (1.0 - TOLERANCE) * n


def _true_knee(service_s: float = SERVICE_S, ttft_s: float = TTFT_S) -> float:
    """The highest rate the model passes (a fine bisection: with a fixed request count the
    arrivals only scale with the rate, so passing is monotone in it)."""
    lo, hi = 1.0, 10.0 * SLOTS / service_s
    while hi / lo > 1.0005:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _model_passes(mid, service_s, ttft_s) else (lo, mid)
    return lo


@pytest.fixture
def queue_server() -> Iterator[str]:
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "sse_server.py"), "--slots", str(SLOTS),
         "--ttft", str(TTFT_S), "--itl", str(ITL_S)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert line.startswith("READY "), line
        yield line.split()[1]
    finally:
        proc.terminate()
        proc.wait(10)


def test_capacity_finds_the_knee_of_a_server_with_a_known_service_rate(
    queue_server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # on the schedule alone the model's knee is near the service rate (Poisson queueing moves it)
    assert 0.8 * SLOTS / SERVICE_S < _true_knee() < 1.2 * SLOTS / SERVICE_S
    out = tmp_path / "cap.json"
    rc = main(
        [
            "bench", "--url", queue_server, "--mode", "capacity",
            "--slo", f"ttft:p99<={TTFT_SLO_MS:g}ms", "--rate", "20",
            "--requests", str(MIN_REQUESTS), "--duration", str(MIN_SECONDS),
            "--tolerance", str(TOLERANCE), "--precision", "0.03",
            "--max-tokens", str(TOKENS), "--input-len", "4", "--warmup", "1",
            "--seed", str(SEED), "--quiet", "--json", "--out", str(out),
        ]
    )  # fmt: skip
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    res = load_result(out)
    cap = res.capacity
    assert cap is not None and cap.knee_rate is not None
    # The server keeps its schedule only as well as a shared machine lets it: the model takes
    # the service and first-token times it really gave at the lowest rate (20 req/s, where
    # requests rarely queue), so the truth is this server's, not the schedule's.
    low = res.levels[0]
    assert low.median_e2el_ms is not None and low.median_ttft_ms is not None
    true_knee = _true_knee(low.median_e2el_ms / 1000.0, low.median_ttft_ms / 1000.0)
    print(f"knee found {cap.knee_rate:.1f} req/s, true {true_knee:.1f} req/s "
          f"(schedule alone {_true_knee():.1f}; service {low.median_e2el_ms:.1f} ms)")  # fmt: skip
    assert cap.knee_rate == pytest.approx(true_knee, rel=0.05)
    assert cap.binding_slo == f"ttft:p99<={TTFT_SLO_MS:g}ms"
    assert cap.first_failing_rate is not None and cap.first_failing_rate > cap.knee_rate
    assert summary["capacity"]["knee_rate"] == cap.knee_rate
    assert [p.rate for p in cap.curve] == sorted(p.rate for p in cap.curve)
    assert all(p.passed == (p.rate <= cap.knee_rate) for p in cap.curve)
