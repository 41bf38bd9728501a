"""``compare``: the verdict follows the intervals; the founding example reads as noise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ceiling.bench.compare import FASTER, SAME, SLOWER, compare
from ceiling.bench.results import LevelResult, PerRequest, RunResult, Summary, load_result
from ceiling.cli import main
from ceiling.errors import CeilingError


def _run(
    tok_s: list[float], tpot_per_request: list[float] | None = None, concurrency: int = 1
) -> RunResult:
    per = PerRequest(tpot_ms=tpot_per_request or [1000.0 / v for v in tok_s])
    done = len(per.tpot_ms) // len(tok_s)  # requests completed per repeat
    repeats = [
        Summary(decode_tok_s_per_stream=v, mean_tpot_ms=1000.0 / v, completed=done) for v in tok_s
    ]
    mean = sum(tok_s) / len(tok_s)
    level = LevelResult(
        concurrency=concurrency,
        completed=len(per.tpot_ms),
        decode_tok_s_per_stream=mean,
        repeats=repeats,
        per_request=per,
    )
    return RunResult(**level.model_dump(), mode="single", levels=[level])


def test_founding_example_is_noise_when_spread_covers_it() -> None:
    # 81.4 vs 81.9 tok/s means, with about 1 tok/s run-to-run spread (relaunches).
    a = _run([81.4, 80.5, 82.3])
    b = _run([81.9, 81.0, 82.8])
    comp = compare([a, b])
    assert comp.verdict == SAME
    row = comp.rows[0]
    assert row.basis == "repeats"
    assert row.delta_pct == pytest.approx((81.9 / 81.4 - 1) * 100, abs=0.01)
    assert row.ci_pct is not None and row.ci_pct[0] < 0 < row.ci_pct[1]


def test_a_real_difference_is_called_either_way() -> None:
    a = _run([81.4, 81.5, 81.3])
    b = _run([85.0, 85.2, 84.9])
    assert compare([a, b]).verdict == FASTER
    assert compare([b, a]).verdict == SLOWER
    # On a lower-is-better metric the direction flips correctly.
    assert compare([a, b], metric="mean_tpot_ms").verdict == FASTER


def test_single_runs_fall_back_to_the_bootstrap_and_say_so() -> None:
    a = _run([81.4], tpot_per_request=[1000 / 81.4 + 0.01 * (i % 5) for i in range(40)])
    b = _run([90.0], tpot_per_request=[1000 / 90.0 + 0.01 * (i % 5) for i in range(40)])
    row = compare([a, b]).rows[0]
    assert row.basis == "requests" and "run-to-run" in row.note
    assert row.verdict == FASTER
    none = compare([_run([81.4]), _run([81.9])]).rows[0]
    assert none.verdict == SAME and none.ci_pct is None


def test_levels_are_matched_and_mismatch_is_an_error() -> None:
    with pytest.raises(CeilingError, match="no level in common"):
        compare([_run([1.0, 2.0], concurrency=1), _run([1.0, 2.0], concurrency=8)])
    with pytest.raises(CeilingError):
        compare([_run([1.0])])


def test_cli_compare_and_bad_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(_run([81.4, 80.5, 82.3]).model_dump_json())
    pb.write_text(_run([81.9, 81.0, 82.8]).model_dump_json())
    assert main(["compare", str(pa), str(pb), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"] == SAME and out["kind"] == "ceiling.compare"
    bad = tmp_path / "bad.json"
    bad.write_text('{"hello": 1}')
    assert main(["compare", str(pa), str(bad)]) == 2
    err = capsys.readouterr().err
    assert "not a ceiling bench result" in err and "Traceback" not in err
    with pytest.raises(CeilingError, match="not found"):
        load_result(tmp_path / "missing.json")


def _itl_run(itl_per_request: list[list[float]], tpot_per_request: list[float]) -> RunResult:
    """One run whose requests have these ITL samples (chunk gaps) and these TPOTs."""
    per = PerRequest(
        tpot_ms=tpot_per_request,
        itl_sum_ms=[sum(x) for x in itl_per_request],
        itl_count=[len(x) for x in itl_per_request],
    )
    samples = [x for r in itl_per_request for x in r]
    level = LevelResult(
        concurrency=1,
        completed=len(itl_per_request),
        mean_itl_ms=sum(samples) / len(samples),
        repeats=[Summary(mean_itl_ms=sum(samples) / len(samples))],
        per_request=per,
    )
    return RunResult(**level.model_dump(), mode="single", levels=[level])


def test_itl_interval_is_over_itl_samples_not_tpot() -> None:
    """B streams 2 tokens per chunk: its ITL doubles while its TPOT is A's. The interval
    must follow the ITL samples (B slower), not TPOT (which says no difference)."""
    jitter = [0.01 * (i % 5) for i in range(30)]
    a = _itl_run([[10.0 + j] * 20 for j in jitter], [10.0 + j for j in jitter])
    b = _itl_run([[20.0 + 2 * j] * 10 for j in jitter], [10.0 + j for j in jitter])
    row = compare([a, b], metric="mean_itl_ms").rows[0]
    assert row.basis == "requests"
    assert row.delta_pct == pytest.approx(100.0, abs=1.0)
    assert row.ci_pct is not None and row.ci_pct[0] > 90.0  # about +100 %, not about 0
    assert row.verdict == SLOWER


def test_a_side_with_no_completed_request_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every request of B failed: its throughputs read 0.0, which is no measurement. A delta of
    -100 % and "B slower" would be a verdict from nothing: refused, naming the side and why."""
    a = _run([81.4, 80.5, 82.3])
    for holder in [a, *a.levels, *a.levels[0].repeats]:
        holder.output_throughput = 100.0
    dead = LevelResult(
        concurrency=1,
        failed=6,
        errors={"http_5xx": 6},
        output_throughput=0.0,
        repeats=[Summary(failed=3, output_throughput=0.0) for _ in range(3)],
    )
    b = RunResult(**dead.model_dump(), mode="single", levels=[dead])
    with pytest.raises(CeilingError, match=r"B.*no request completed.*http_5xx") as exc:
        compare([a, b], metric="output_throughput", labels=["A", "B"])
    assert exc.value.fix and "re-run" in exc.value.fix
    with pytest.raises(CeilingError, match=r"A.*no request completed"):
        compare([b, a], metric="output_throughput", labels=["A", "B"])
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(a.model_dump_json())
    pb.write_text(b.model_dump_json())
    assert main(["compare", str(pa), str(pb), "--metric", "output_throughput", "--json"]) == 2
    out = json.loads(capsys.readouterr().out)
    assert "verdict" not in out and out["exit_code"] == 2
