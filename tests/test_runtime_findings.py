"""Findings from what a run measured, on bench results recorded from a real vLLM (CPU).

tests/fixtures/runtime/*.json are `ceiling bench` results of the tiny model served as is and
with one change whose effect is known (README there): each change must produce the finding that
names its component, with the direction "slower", and the unchanged server must produce none.
The real-server runs of the same changes through `doctor` are in
tests/engine/test_doctor_truth_vllm.py.
"""

from __future__ import annotations

import json
from pathlib import Path

from ceiling.diagnose.findings import FindingContext
from ceiling.diagnose.logs import EngineFacts, parse_lines
from ceiling.diagnose.runtime import runtime_findings
from ceiling.engines import get_engine

RUNS = Path(__file__).parent / "fixtures" / "runtime"
VLLM = get_engine("vllm").finding_fixes
LOGS = Path(__file__).parent / "fixtures" / "logs"


def _run(name: str) -> dict:
    return json.loads((RUNS / name).read_text())


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
        FindingContext(concurrency=4, fixes=VLLM),
    )
    assert found == []


def test_max_num_seqs_1_is_named_as_the_scheduler_cap():
    facts = _facts(max_num_seqs=1)
    found = _ids(
        runtime_findings(
            facts,
            {"concurrency": _run("max_num_seqs_1_conc.json")},
            FindingContext(concurrency=4, fixes=VLLM),
        )
    )
    f = found["queueing"]
    assert f.component == "scheduler (running-sequence cap)" and f.direction == "slower"
    assert "(running-sequence cap 1)" in f.title
    assert "waited 70 % of their time in the engine's queue" in f.title  # 1288 of 1835 ms
    assert f.fix == "raise --max-num-seqs"


def test_a_tiny_kv_cache_is_named_by_its_preemptions():
    facts = _facts()
    facts.max_concurrency, facts.kv_cache_tokens = 1.75, 896
    found = _ids(
        runtime_findings(
            facts,
            {"concurrency": _run("tiny_kv_conc.json")},
            FindingContext(concurrency=4, fixes=VLLM),
        )
    )
    f = found["kv-preemption"]
    assert f.component == "KV cache" and f.direction == "slower"
    assert f.evidence == ["10 preemptions at concurrency 4 (vllm:num_preemptions_total)"]
    # the CPU build's knob, and the env variable that overrides it; no FP8 KV on CPU
    assert "--kv-cache-memory-bytes" in f.fix and "fp8" not in f.fix.lower()
    assert "queueing" not in found  # 21 % queue share: below the threshold


def test_a_starved_api_server_is_named_from_the_chunks():
    facts = _facts()
    found = _ids(
        runtime_findings(
            facts, {"single": _run("api_server_starved_single.json")}, FindingContext(fixes=VLLM)
        )
    )
    f = found["frontend-bound"]
    assert f.component == "API server / detokenizer / client" and f.direction == "slower"
    assert f.title.startswith("The API server fell behind the engine")
    assert f.evidence[0] == "mean 6.04 tokens per streamed chunk in the single-stream bench"
    assert "--api-server-count" in f.fix
    # a larger stream interval sends several tokens per chunk by design: no finding
    facts2 = _facts(stream_interval=4)
    assert (
        runtime_findings(
            facts2, {"single": _run("api_server_starved_single.json")}, FindingContext(fixes=VLLM)
        )
        == []
    )
