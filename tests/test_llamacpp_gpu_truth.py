"""Doctor truth on a real GPU engine, kept without a GPU: llama-server (CUDA build, H200) runs
recorded by experiments/gpu/llamacpp_cuda.sh doctor (experiments/results/2026-12-02_h200-llamacpp/call2/).

Each known-answer change ran beside the unchanged variant (same GGUF, same bench settings). The
test asserts what the doctor said then (doctor.json) AND what today's log rules say about the
recorded start-up logs, so a rule change that loses a finding fails here. Repeat the live run
with ``bash experiments/gpu/llamacpp_cuda.sh doctor`` in one device call (see the script's header).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from ceiling.diagnose.findings import context_for
from ceiling.diagnose.logs import inspect_log

# copies of that run's files (tests/fixtures/llamacpp_h200/README.md)
RUNS = Path(__file__).parent / "fixtures/llamacpp_h200" / "call2"
BASE = "8b-q4km"
# the change -> (the finding the doctor must name, the variant's env as launched)
CHANGES = {
    "ngl28": ("partial-offload", {}),
    "fa-off": ("flash-attn-off", {}),
    "no-graphs": ("eager-mode", {"GGML_CUDA_DISABLE_GRAPHS": "1"}),
    "one-slot": ("concurrency-cap", {}),
}
CHANGE_IDS = {f for f, _ in CHANGES.values()}


def _doc(name: str) -> dict:
    return json.loads(gzip.decompress((RUNS / f"doctor-{name}" / "doctor.json.gz").read_bytes()))


def _step(doc: dict) -> float:
    return doc["measured"]["step_ms"]


def _level(doc: dict, concurrency: int) -> dict:
    return next(
        lv for lv in doc["bench"]["concurrency"]["levels"] if lv["concurrency"] == concurrency
    )


def _reinspect(name: str, env: dict[str, str], tmp_path: Path) -> set[str]:
    log = tmp_path / f"{name}.log"
    log.write_bytes(gzip.decompress((RUNS / f"doctor-{name}" / "server.log.gz").read_bytes()))
    ctx = context_for(None, concurrency=4, request_tokens=32 + 96)
    facts = inspect_log(log, engine="llamacpp", concurrency=4, context=ctx, env=env)
    return {f.id for f in facts.findings}


def test_baseline_is_a_real_cuda_run_measured_past_the_gate() -> None:
    doc = _doc(BASE)
    f = doc["facts"]
    assert (f["device"], f["gpu_layers"], f["gpu_layers_total"]) == ("cuda", 33, 33)
    assert f["flash_attention"] is True and f["cudagraph_mode"] == "llama.cpp"
    assert f["kv_cache_dtype"] == "f16" and f["max_concurrency"] == 4
    # random weights: the gate must call the output broken, and the override is on record
    assert doc["sanity"]["verdict"] == "broken"
    assert doc["sanity_override"].startswith("random weights")
    assert not CHANGE_IDS & {x["id"] for x in doc["findings"]}
    # the engine's own counters, read through the adapter: one sequence per step at one
    # stream, about four at four streams (4 slots)
    c1 = _level(doc, 1)["server_metrics"]["counters"]
    c4 = _level(doc, 4)["server_metrics"]["counters"]
    assert c1["engine_steps"]["delta"] == c1["generated_tokens"]["delta"]
    assert c4["generated_tokens"]["delta"] / c4["engine_steps"]["delta"] >= 3.5
    assert doc["telemetry"]["gpus"][0]["name"] == "NVIDIA H200"


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_each_change_is_named_in_the_right_direction(change: str, tmp_path: Path) -> None:
    finding, env = CHANGES[change]
    base, doc = _doc(BASE), _doc(f"{BASE}-{change}")
    said = {x["id"] for x in doc["findings"]}
    assert finding in said
    assert not (CHANGE_IDS - {finding}) & said  # nothing claimed that the run did not show
    # today's rules on the recorded logs say the same (and nothing of it for the baseline)
    assert finding in _reinspect(f"{BASE}-{change}", env, tmp_path)
    assert not CHANGE_IDS & _reinspect(BASE, {}, tmp_path)
    if change == "one-slot":
        # the cap shows in the engine's counters: 1.00 sequences per step at 4 streams
        c4 = _level(doc, 4)["server_metrics"]["counters"]
        assert c4["engine_steps"]["delta"] == c4["generated_tokens"]["delta"]
        assert (
            _level(doc, 4)["decode_tok_s_per_stream"]
            > 1.5 * _level(base, 4)["decode_tok_s_per_stream"]
        )  # one stream at a time, each at the single-stream rate: per-stream rate stays high
    else:
        assert _step(doc) > _step(base)  # each change makes the single-stream step slower


def test_partial_offload_is_host_bound() -> None:
    # 5 of 33 layers on the CPU cost more than the other 28 on the GPU
    assert _step(_doc(f"{BASE}-ngl28")) > 3 * _step(_doc(BASE))
