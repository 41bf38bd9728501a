"""Checks of ``bench`` and ``compare``: conflicting options, top-level figures of multi-level
runs, unlike workloads."""

from __future__ import annotations

from pathlib import Path

import pytest

from ceiling.bench.compare import FASTER, UNLIKE, compare
from ceiling.bench.config import BenchConfig
from ceiling.bench.results import LevelResult, RunResult, Summary
from ceiling.bench.runner import run_bench
from ceiling.cli import main
from ceiling.errors import CeilingError
from sse_server import Plan, SSEServer

pytestmark = pytest.mark.timeout(120)
URL = "http://127.0.0.1:8000"


@pytest.mark.parametrize(
    ("options", "problem", "fix"),
    [
        ({"mode": "single", "concurrency": [1, 4]}, "--concurrency 1,4 conflicts with --mode single",
         "--mode concurrency --concurrency 1,4"),
        ({"mode": "rate", "rate": 2.0, "concurrency": [4]}, "--concurrency 4 conflicts",
         "drop --concurrency"),
        ({"mode": "single", "rate": 4.0}, "--rate 4 conflicts with --mode single",
         "--mode rate --rate 4"),
        ({"mode": "concurrency", "burstiness": 0.5}, "--burstiness 0.5 conflicts",
         "drop --burstiness"),
    ],
)  # fmt: skip
def test_options_the_mode_would_ignore_are_refused(
    options: dict[str, object], problem: str, fix: str
) -> None:
    with pytest.raises(CeilingError) as err:
        BenchConfig(url=URL, **options)  # type: ignore[arg-type]
    assert problem in err.value.message and fix in (err.value.fix or "")


def test_the_modes_own_options_still_pass() -> None:
    assert BenchConfig(url=URL, mode="concurrency").levels() == [1, 2, 4, 8]
    assert BenchConfig(url=URL, mode="concurrency", concurrency=[3]).levels() == [3]
    assert BenchConfig(url=URL, mode="rate", rate=2.0, burstiness=0.5).levels() == [None]


def test_cli_refuses_levels_in_single_mode_before_any_request(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with SSEServer(Plan()) as srv:
        rc = main(["bench", "--url", srv.url, "--mode", "single", "--concurrency", "1,4"])
        assert srv.n_requests == 0
    assert rc == 2
    err = capsys.readouterr().err
    assert "conflicts with --mode single" in err and "fix:" in err


def test_a_multi_level_run_has_no_first_level_stand_in_at_the_top(tmp_path: Path) -> None:
    cfg = BenchConfig(
        url=URL, mode="concurrency", concurrency=[1, 2], max_tokens=4, requests=2, warmup=0
    )
    with SSEServer(Plan(itl_s=0.001)) as srv:
        res = run_bench(cfg.model_copy(update={"url": srv.url}), progress=False)
    assert [lv.concurrency for lv in res.levels] == [1, 2]
    assert res.completed == 4 and res.total_output_tokens == 16
    assert res.duration == pytest.approx(sum(lv.duration for lv in res.levels))
    # no figure of level c=1 passes for the run's
    assert res.mean_tpot_ms is None and res.request_throughput is None
    assert res.concurrency is None and res.per_request.tpot_ms == []
    assert all(lv.mean_tpot_ms is not None for lv in res.levels)


def test_a_single_level_run_keeps_its_level_at_the_top() -> None:
    cfg = BenchConfig(url=URL, max_tokens=4, requests=2, warmup=0)
    with SSEServer(Plan(itl_s=0.001)) as srv:
        res = run_bench(cfg.model_copy(update={"url": srv.url}), progress=False)
    assert res.mean_tpot_ms == res.levels[0].mean_tpot_ms is not None
    assert res.request_throughput == res.levels[0].request_throughput


def _run(tok_s: list[float], input_len: int = 128, out_tokens: int = 256) -> RunResult:
    repeats = [Summary(decode_tok_s_per_stream=v, completed=4) for v in tok_s]
    level = LevelResult(
        concurrency=1,
        completed=4 * len(tok_s),
        total_input_tokens=input_len * 4 * len(tok_s),
        total_output_tokens=out_tokens * 4 * len(tok_s),
        decode_tok_s_per_stream=sum(tok_s) / len(tok_s),
        repeats=repeats,
    )
    config = {"input_len": input_len, "max_tokens": 256, "dataset": None}
    return RunResult(
        **level.model_dump(), mode="single", config=config, endpoint="/v1/completions",
        levels=[level],
    )  # fmt: skip


def test_compare_calls_no_winner_across_unlike_workloads() -> None:
    fast, slow = [85.0, 85.2, 84.9], [81.4, 81.5, 81.3]
    like = compare([_run(slow), _run(fast)], labels=["a.json", "b.json"])
    assert like.verdict == FASTER and like.like_workloads and not like.warnings

    other_prompt = compare([_run(slow), _run(fast, input_len=2048)], labels=["a.json", "b.json"])
    assert other_prompt.verdict == UNLIKE and not other_prompt.like_workloads
    (warning,) = other_prompt.warnings
    assert "input length: a.json 128, b.json 2048" in warning and "no winner" in warning
    assert other_prompt.rows[0].delta_pct is not None  # the numbers stay, the verdict goes

    # same options, but B's requests ended early (EOS): measured output lengths differ
    early = compare([_run(slow), _run(fast, out_tokens=100)], labels=["a.json", "b.json"])
    assert early.verdict == UNLIKE
    assert (
        "measured output tokens per request at c=1: a.json 256.0, b.json 100.0"
        in (early.warnings[0])
    )


@pytest.mark.parametrize(
    ("key", "value", "said"),
    [
        ("prefix_len", 96, "shared prefix: a.json 0, b.json 96"),
        ("turns", 3, "turns: a.json 1, b.json 3"),
        ("input_range", 0.5, "input range: a.json 0.0, b.json 0.5"),
        ("output_range", 0.5, "output range: a.json 0.0, b.json 0.5"),
    ],
)
def test_compare_calls_no_winner_across_unlike_synthetic_workloads(
    key: str, value: object, said: str
) -> None:
    # the same lengths per request, another workload: a cached prefix, a resent history
    fast, slow = _run([85.0, 85.2, 84.9]), _run([81.4, 81.5, 81.3])
    fast.config[key] = value
    comp = compare([slow, fast], labels=["a.json", "b.json"])
    assert comp.verdict == UNLIKE and said in comp.warnings[0]


def test_compare_cli_prints_the_unlike_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(_run([81.4, 81.5, 81.3]).model_dump_json())
    b.write_text(_run([85.0, 85.2, 84.9], input_len=512).model_dump_json())
    assert main(["compare", str(a), str(b)]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "no winner is called" in text and "input length: a.json 128" in text
