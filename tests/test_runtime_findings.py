"""Findings from what a run measured, on bench results recorded from a real vLLM (CPU).

tests/fixtures/runtime/*.json are `ceiling bench` results of the tiny model served as is and
with one change whose effect is known (README there): each change must produce the finding that
names its component, with the direction "slower", and the unchanged server must produce none.
The real-server runs of the same changes through `doctor` are in
tests/engine/test_doctor_truth_vllm.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ceiling.bench.results import RunResult
from ceiling.diagnose.findings import FindingContext
from ceiling.diagnose.logs import EngineFacts, parse_lines
from ceiling.diagnose.runtime import batch_width, runtime_findings
from ceiling.engines import get_engine

RUNS = Path(__file__).parent / "fixtures" / "runtime"
VLLM = get_engine("vllm").finding_fixes
STREAMING = get_engine("vllm").streaming  # how vLLM streams: its adapter says
LOGS = Path(__file__).parent / "fixtures" / "logs"


def _run(name: str) -> RunResult:
    return RunResult.model_validate_json((RUNS / name).read_text())


def _facts(**args) -> EngineFacts:
    """The real CPU start-up log, with the non-default arguments of the change."""
    facts = parse_lines((LOGS / "vllm_cpu_0.32_eager_real.log").read_text().splitlines())
    facts.non_default_args.update(args)
    return facts


def _ids(found):
    return {f.id: f for f in found}


def test_unchanged_server_gives_no_runtime_finding():
    found = runtime_findings(
        _facts(),
        {"single": _run("default_single.json"), "concurrency": _run("default_conc.json")},
        FindingContext(concurrency=4, fixes=VLLM, streaming=STREAMING),
    )
    assert found == []


def test_max_num_seqs_1_is_named_as_the_scheduler_cap():
    facts = _facts(max_num_seqs=1)
    found = _ids(
        runtime_findings(
            facts,
            {"concurrency": _run("max_num_seqs_1_conc.json")},
            FindingContext(concurrency=4, fixes=VLLM, streaming=STREAMING),
        )
    )
    f = found["queueing"]
    assert f.component == "scheduler (running-sequence cap)" and f.direction == "slower"
    assert "(running-sequence cap 1)" in f.title
    assert f.figures["queue_ms"] / f.figures["request_ms"] == pytest.approx(0.70, abs=0.01)
    assert "waited 70 % of their time in the engine's queue" in f.title  # 1288 of 1835 ms
    assert f.fix == "raise --max-num-seqs"


def test_a_tiny_kv_cache_is_named_by_its_preemptions():
    facts = _facts()
    facts.max_concurrency, facts.kv_cache_tokens = 1.75, 896
    found = _ids(
        runtime_findings(
            facts,
            {"concurrency": _run("tiny_kv_conc.json")},
            FindingContext(concurrency=4, fixes=VLLM, streaming=STREAMING),
        )
    )
    f = found["kv-preemption"]
    assert f.component == "KV cache" and f.direction == "slower"
    assert f.figures == {"preemptions": 10}
    assert f.evidence == ["10 preemptions at concurrency 4 (vllm:num_preemptions_total)"]
    # the CPU build's knob, and the env variable that overrides it; no FP8 KV on CPU
    assert "--kv-cache-memory-bytes" in f.fix and "fp8" not in f.fix.lower()
    assert "queueing" not in found  # 21 % queue share: below the threshold


def test_a_starved_api_server_is_named_from_the_chunks():
    facts = _facts()
    found = _ids(
        runtime_findings(
            facts,
            {"single": _run("api_server_starved_single.json")},
            FindingContext(fixes=VLLM, streaming=STREAMING),
        )
    )
    f = found["frontend-bound"]
    assert f.component == "API server / detokenizer / client" and f.direction == "slower"
    assert f.title.startswith("The API server fell behind the engine")
    assert f.figures["tokens_per_chunk"] == pytest.approx(6.04, abs=0.005)
    assert f.evidence[0] == "mean 6.04 tokens per streamed chunk in the single-stream bench"
    assert "--api-server-count" in f.fix
    # a larger stream interval sends several tokens per chunk by design: no finding
    facts2 = _facts(stream_interval=4)
    assert (
        runtime_findings(
            facts2,
            {"single": _run("api_server_starved_single.json")},
            FindingContext(fixes=VLLM, streaming=STREAMING),
        )
        == []
    )


def test_a_starved_api_server_is_named_from_bursts_when_vllm_did_not_merge():
    """One token per chunk and 3 % late (neither signal fires), but 99.7 % of the chunks came in
    bursts by the kernel's receive times while the engine spaced its tokens ~2 ms apart."""
    run = _run("api_server_starved_bursts_single.json")
    assert (run.model_extra or {})["tokens_per_chunk"] == pytest.approx(1.0)
    found = _ids(
        runtime_findings(_facts(), {"single": run}, FindingContext(fixes=VLLM, streaming=STREAMING))
    )
    f = found["frontend-bound"]
    assert f.title.endswith("% of streamed chunks reached the client in bursts")
    assert f.figures["burst_chunk_share_pct"] == pytest.approx(99.7, abs=0.05)
    assert any("kernel's receive timestamps" in e for e in f.evidence)
    # user-space receive times: a slow client bunches chunks of its own, so bursts say nothing
    socket = run.model_copy(update={"timestamp_source": "socket"})
    ctx = FindingContext(fixes=VLLM, streaming=STREAMING)
    assert runtime_findings(_facts(), {"single": socket}, ctx) == []
    # the unstarved server's single stream has none
    assert runtime_findings(_facts(), {"single": _run("default_single.json")}, ctx) == []


def test_the_frontend_check_reads_the_adapters_streaming_traits():
    """The rule knows no engine: an adapter that does not state how it streams gets no
    frontend-bound finding from the same run, and each trait gates its own evidence."""
    from ceiling.engines.facts import StreamingTraits

    run = {"single": _run("api_server_starved_single.json")}
    facts = _facts()
    assert get_engine("sglang").streaming is None
    assert runtime_findings(facts, run, FindingContext(fixes=VLLM)) == []
    # chunks merged, but the engine does not merge waiting outputs: chunks say nothing
    no_merge = StreamingTraits(engine_side_times=False, merges_waiting_outputs=False)
    assert runtime_findings(facts, run, FindingContext(streaming=no_merge)) == []
    merges = StreamingTraits(merges_waiting_outputs=True)
    assert "frontend-bound" in _ids(runtime_findings(facts, run, FindingContext(streaming=merges)))


def test_a_cap_of_one_is_seen_in_the_engines_own_batch():
    """The scheduler's batch, from the engine's counters (generated tokens / steps), names the
    cap even where throughput ratios are noise: 1.00 sequences per step at 8 streams."""
    run = _run("max_num_seqs_1_conc_steps.json")
    found = _ids(
        runtime_findings(
            _facts(max_num_seqs=1),
            {"concurrency": run},
            FindingContext(concurrency=8, fixes=VLLM, streaming=STREAMING),
        )
    )
    f = found["narrow-batches"]
    assert f.component == "scheduler (running-sequence cap)" and f.direction == "slower"
    assert f.title == (
        "At 8 concurrent streams the engine ran 1.00 sequences per step (running-sequence cap 1)"
    )
    assert f.evidence[0].startswith("1.000 generated tokens per engine step at concurrency 8")
    assert f.fix == "raise --max-num-seqs"


def test_the_unchanged_server_batches_and_is_not_called_narrow():
    run = _run("default_conc_steps.json")
    assert batch_width(run.levels[1]) == 2048 / 867
    found = runtime_findings(
        _facts(),
        {"concurrency": run},
        FindingContext(concurrency=8, fixes=VLLM, streaming=STREAMING),
    )
    assert "narrow-batches" not in _ids(found)


def test_without_a_cap_a_batch_of_one_blames_the_api_server_only_when_the_log_says_so():
    run = _run("max_num_seqs_1_conc_steps.json")  # the batch of one, as if no cap were set
    facts = _facts()
    facts.max_concurrency = 120.0
    f = _ids(
        runtime_findings(
            facts, {"concurrency": run}, FindingContext(fixes=VLLM, streaming=STREAMING)
        )
    )["narrow-batches"]
    assert f.component == "API server / detokenizer / client" and f.fix
    # a cache with room for under two full-length requests holds the batch itself
    facts.max_concurrency = 1.5
    k = _ids(
        runtime_findings(
            facts, {"concurrency": run}, FindingContext(fixes=VLLM, streaming=STREAMING)
        )
    )
    assert k["narrow-batches"].component == "KV cache"
    # no start-up log read: the cause is unknown, so no advice, and the finding says why
    bare = EngineFacts()
    g = _ids(
        runtime_findings(
            bare, {"concurrency": run}, FindingContext(fixes=VLLM, streaming=STREAMING)
        )
    )["narrow-batches"]
    assert g.fix is None and "start-up log was not read" in (g.withheld or "")


def test_failed_streams_hide_a_cap_but_not_an_api_server_verdict():
    """Streams that a cap queued until the client gave up (a stall timeout) leave the engine's
    counters as they were: the cap is still named, with the failures as evidence. Without a cap
    or a small KV cache in the log, a narrow batch at a level with failures is no verdict on the
    API server (the failed streams never reached the engine together)."""
    run = _run("max_num_seqs_1_conc_steps.json")
    top = run.levels[-1]
    top.failed, top.completed = 3, top.completed - 3
    capped = _ids(
        runtime_findings(
            _facts(max_num_seqs=1),
            {"concurrency": run},
            FindingContext(concurrency=8, fixes=VLLM, streaming=STREAMING),
        )
    )["narrow-batches"]
    assert capped.component == "scheduler (running-sequence cap)"
    assert f"3 of {top.completed + 3} requests failed at concurrency 8" in capped.evidence
    facts = _facts()
    facts.max_concurrency = 120.0
    found = _ids(
        runtime_findings(
            facts, {"concurrency": run}, FindingContext(fixes=VLLM, streaming=STREAMING)
        )
    )
    assert "narrow-batches" not in found
