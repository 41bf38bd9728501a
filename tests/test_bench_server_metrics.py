"""Prometheus /metrics deltas: vLLM (new and old names) and SGLang, labels merged."""

from __future__ import annotations

import pytest

from ceiling.bench.server_metrics import add_deltas, compare_to_client, delta, parse_prometheus

VLLM_BEFORE = """# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.01",model_name="tiny"} 1.0
vllm:time_to_first_token_seconds_sum{model_name="tiny"} 0.5
vllm:time_to_first_token_seconds_count{model_name="tiny"} 10.0
vllm:time_per_output_token_seconds_sum{model_name="tiny"} 1.0
vllm:time_per_output_token_seconds_count{model_name="tiny"} 100.0
vllm:num_requests_running{model_name="tiny"} 0.0
"""
VLLM_AFTER = """vllm:time_to_first_token_seconds_sum{model_name="tiny"} 0.8
vllm:time_to_first_token_seconds_count{model_name="tiny"} 20.0
vllm:time_per_output_token_seconds_sum{model_name="tiny"} 1.5
vllm:time_per_output_token_seconds_count{model_name="tiny"} 200.0
vllm:request_queue_time_seconds_sum{model_name="tiny"} 0.01
vllm:request_queue_time_seconds_count{model_name="tiny"} 10.0
"""


def test_vllm_old_itl_name_and_client_overhead() -> None:
    d = delta(VLLM_BEFORE, VLLM_AFTER)
    out = compare_to_client(d, {"ttft": 40.0, "itl": 6.0, "e2el": None})
    assert out["available"] and out["engine"] == "vllm"
    q = out["quantities"]
    assert q["ttft"]["server_mean_ms"] == pytest.approx(30.0)  # 0.3 s over 10 requests
    assert q["ttft"]["overhead_ms"] == pytest.approx(10.0)
    assert q["itl"]["metric"] == "vllm:time_per_output_token_seconds"
    assert q["itl"]["server_mean_ms"] == pytest.approx(5.0)
    assert q["queue"]["server_mean_ms"] == pytest.approx(1.0)
    assert "client_mean_ms" not in q["queue"]


def test_sglang_names_and_label_sets_are_summed() -> None:
    text = (
        'sglang:time_to_first_token_seconds_sum{model_name="m",dp_rank="0"} 1.0\n'
        'sglang:time_to_first_token_seconds_sum{model_name="m",dp_rank="1"} 1.0\n'
        'sglang:time_to_first_token_seconds_count{model_name="m",dp_rank="0"} 10\n'
        'sglang:time_to_first_token_seconds_count{model_name="m",dp_rank="1"} 10\n'
        'sglang:inter_token_latency_seconds_sum{model_name="m"} 2.0\n'
        'sglang:inter_token_latency_seconds_count{model_name="m"} 400\n'
        "sglang:queue_time_seconds_sum 0.2\nsglang:queue_time_seconds_count 20\n"
    )
    assert parse_prometheus(text)["sglang:time_to_first_token_seconds_sum"] == 2.0
    out = compare_to_client(delta("", text), {"ttft": None, "itl": None, "e2el": None})
    assert out["engine"] == "sglang"
    assert out["quantities"]["ttft"]["server_mean_ms"] == pytest.approx(100.0)
    assert out["quantities"]["itl"]["server_mean_ms"] == pytest.approx(5.0)
    assert out["quantities"]["queue"]["server_mean_ms"] == pytest.approx(10.0)


def test_missing_scrapes_and_unknown_servers() -> None:
    assert delta(None, VLLM_AFTER) is None
    assert compare_to_client(None, {})["available"] is False
    assert add_deltas({"a": 1.0}, None) is None
    assert add_deltas({"a": 1.0}, {"a": 2.0, "b": 1.0}) == {"a": 3.0, "b": 1.0}
    unknown = compare_to_client(delta("x_total 1\n", "x_total 2\n"), {})
    assert unknown["available"] is False and "no known latency" in unknown["reason"]


def test_a_malformed_line_costs_only_itself() -> None:
    """A scrape with garbage glued on (a proxy's error page) keeps every well-formed sample."""
    text = VLLM_BEFORE + "<html>502 Bad Gateway</html>\n" + 'vllm:x_sum{a="1"} NaN\n'
    totals = parse_prometheus(text)
    assert totals["vllm:time_to_first_token_seconds_count"] == 10.0
    assert totals["vllm:time_to_first_token_seconds_bucket"] == 1.0
    assert "vllm:x_sum" not in totals  # NaN: nothing observed
    assert not any("html" in k for k in totals)
