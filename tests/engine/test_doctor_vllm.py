"""Truth checks of the doctor on a real vLLM (CPU build) serving the tiny model.

The deployment is host-bound (a 1.7 MB model: the weight reads are ~0.1 ms of a ~4 ms step),
so the doctor must say so. A second concurrent stream must be accounted as what the engine ran:
its own counters give the batch, the predicted floors per token halve (the weights are read once
per step for both streams), and the step's time is shared among the batch the engine ran.
Whether the engine's step stays flat with the second stream is not asserted: on the 2-core test
machine the client, the API server and the engine core share two cores, and a second stream
doubles the first two's work — a CI run measured 2.13 ms steps at one stream and 4.47 ms at two
(1.97 sequences per step), so the per-token overhead *rose*. The doctor must then report that,
not the gain a dedicated host would show.
Runs are short (64 tokens, 2 repeats): each request is slow on the 2-core test machine.
"""

from __future__ import annotations

import pytest

from box_noise import RERUN_WHEN_SWAMPED
from ceiling.diagnose.runtime import batch_width
from ceiling.flows.doctor import DoctorConfig
from ceiling.flows.doctor import run as run_doctor
from ceiling.report import render

# Reruns only on BoxTooNoisy (tests/box_noise.py), never on a failed assertion: the box's
# effects this test can meet (streams passed on one at a time, a step that grew with a second
# stream) are handled in it as what the doctor must then report.
pytestmark = [pytest.mark.engine, RERUN_WHEN_SWAMPED]


def _doctor(server, out, concurrency):
    return run_doctor(
        DoctorConfig(
            url=server.url,
            log=str(server.log_path),
            model_path=str(server.variant.model),
            max_tokens=64,
            repeat=2,
            concurrency=concurrency,
            concurrency_max_tokens=64,
            concurrency_requests=4,
            telemetry=False,
            # the labelled assumed CPU rates: the same floors in both runs (measuring twice on
            # a busy 2-core box gives two different rates, and the floors would move with them)
            measure_cpu=False,
            out_dir=str(out),
            progress=False,
        ),
        report=render,
    )


def test_doctor_on_vllm_cpu_is_host_bound_and_moves_with_streams(vllm_server, tmp_path):
    # one doctor run with both levels: the same floors, sanity and verdict for both (two runs
    # measured the same single-stream verdict twice)
    res = _doctor(vllm_server, tmp_path / "c12", [1, 2])
    assert not res.server_died
    assert res.hardware is not None and res.hardware.kind == "cpu"
    a, v = res.attribution, res.verdict
    assert a is not None and v is not None
    assert a.bound_by == "kernel inefficiency / host overhead"
    assert a.unexplained_pct > 80
    assert v.bottleneck.case == "host-bound" and v.bottleneck.hardware_kind == "cpu"
    assert res.facts is not None and res.facts.device == "cpu"
    assert "removed" in (res.flag_checks.get("--num-scheduler-steps") or "")
    l1, l2 = res.levels
    assert (l1.concurrency, l2.concurrency) == (1, 2)
    html = (tmp_path / "c12" / "report.html").read_text()
    assert "plot-waterfall" in html and "Throughput vs concurrency" in html
    width = batch_width(res.bench["concurrency"].level(2))  # the engine's own count
    assert width is not None and l2.engine_batch == pytest.approx(width)
    assert width <= 2.05, width  # two streams: at most two sequences per step
    batch = min(max(width, 1.0), 2.0)
    # the step is shared among the sequences the engine ran together, not among the streams sent
    assert l2.decode_tok_s_total == pytest.approx(batch * 1000.0 / l2.measured_step_ms)
    assert l2.unexplained_per_token_ms == pytest.approx(
        (l2.measured_step_ms - l2.predicted_step_ms) / batch
    )
    assert l1.engine_batch is None or l1.engine_batch <= 1.05  # one stream: one per step
    if width < 1.5:
        # the box's starved API server passed the two streams on mostly one at a time (seen on
        # the 2-core CI box): the doctor claims no batching gain it did not measure
        assert l2.decode_tok_s_total == pytest.approx(width * 1000.0 / l2.measured_step_ms)
        return
    # the floors per token halve: the weights are read once per step for both streams
    assert l2.predicted_per_token_ms < l1.predicted_per_token_ms
    # a gain is reported exactly when the engine's step grew by less than its batch
    gained = l2.measured_step_ms < batch * l1.measured_step_ms
    assert (l2.decode_tok_s_total > l1.decode_tok_s_total) == gained
