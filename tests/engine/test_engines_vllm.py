"""The real vLLM (CPU build) with the tiny model: preflight, launch, stream, death, inspect.

One shared server (``vllm_server``, tests/engine/conftest.py) plus one deliberate bad-flag launch:
vLLM's start-up costs 35-100 s on the 2-core test machine.
"""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path

import pytest

from ceiling.diagnose.logs import inspect_log
from ceiling.engines.variant import load_variant
from ceiling.flows.preflight import run as preflight
from ceiling.run.launcher import EngineDied, _group_members, start

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "variants"


def test_preflight_rejects_num_scheduler_steps_without_a_server(vllm_python, tmp_path):
    variant = load_variant(EXAMPLES / "v3.yaml").with_overrides(log_dir=str(tmp_path / "logs"))
    report = preflight(variant)
    assert not report.ok
    [err] = report.errors
    assert err.kind == "removed_flag" and err.subject == "--num-scheduler-steps"
    assert "V0" in err.message and "0.10.2" in err.message
    assert report.flag_source == "parser" and report.engine_version
    assert not (tmp_path / "logs").exists()  # nothing was launched
    # the flag table is cached per engine version: the second check does not import vLLM
    again = preflight(load_variant(EXAMPLES / "tuned.yaml"))
    assert again.ok and again.cache_hit
    assert again.warnings == []  # every NCCL name of the story is a real NCCL variable


def test_cpu_tiny_variant_passes_preflight(cpu_tiny_variant):
    report = preflight(cpu_tiny_variant)
    assert report.ok, report.problems
    assert report.flags_checked == 3 and report.env_checked >= 3


def test_server_runs_in_its_own_group_with_no_color(vllm_server):
    assert vllm_server.alive()
    members = _group_members(vllm_server.pid)
    assert vllm_server.pid in members and len(members) >= 2  # API server + engine core
    assert os.getpgid(vllm_server.pid) != os.getpgid(0)
    env = Path(f"/proc/{vllm_server.pid}/environ").read_bytes().split(b"\0")
    assert b"NO_COLOR=1" in env and b"VLLM_CPU_KVCACHE_SPACE=1" in env


def test_stream_one_completion(vllm_server):
    body = {
        "model": vllm_server.model,
        "prompt": "Hello, world!",
        "max_tokens": 16,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    req = urllib.request.Request(
        vllm_server.url + "/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    text, usage, done = "", None, False
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: no proxy
    with opener.open(req, timeout=120) as resp:
        assert resp.status == 200
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            payload = line[len("data: ") :]
            if payload == "[DONE]":
                done = True
                break
            chunk = json.loads(payload)
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices", []):
                text += choice.get("text", "")
    assert done and usage is not None
    assert usage["completion_tokens"] == 16
    assert text and text.isascii()  # the tiny model's vocabulary is ASCII-only


def test_real_startup_log_parses(vllm_server):
    facts = inspect_log(vllm_server.log_path)
    assert facts.engine == "vllm" and facts.v1 is True and facts.device == "cpu"
    assert facts.version and facts.version[0].isdigit()
    assert facts.served_model_name == "tiny" and facts.max_model_len == 512
    assert facts.dtype == "float32" and facts.enforce_eager is True
    assert facts.tensor_parallel_size == 1
    assert facts.kv_cache_tokens and facts.kv_cache_tokens > 512
    assert facts.max_concurrency and facts.max_concurrency >= 1
    assert facts.weights_load_s is not None and facts.ready is True
    assert facts.non_default_args.get("max_model_len") == 512


def test_bad_flag_death_is_classified_as_argparse(cpu_tiny_variant, tmp_path):
    variant = load_variant(EXAMPLES / "cpu-tiny.yaml").with_overrides(
        model=cpu_tiny_variant.model, log_dir=str(tmp_path)
    )
    variant.env.update(cpu_tiny_variant.env)
    variant.args.append(type(variant.args[0])(flag="--num-scheduler-steps", values=["10"]))
    with pytest.raises(EngineDied) as err:
        start(variant, timeout_s=600, progress=False)
    died = err.value
    assert died.cause == "argparse unrecognized arguments"
    assert died.death.exit_code == 2
    assert any("--num-scheduler-steps" in ln for ln in died.evidence)
    server_pid = json.loads(next(tmp_path.glob("*.launch.json")).read_text())["pid"]
    assert _group_members(server_pid) == []


def test_cli_preflight_json_on_the_story(vllm_python, capsys):
    from ceiling.cli import main

    paths = [str(EXAMPLES / f"{n}.yaml") for n in ("baseline", "tuned", "v3")]
    assert main(["preflight", "--json", *paths]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is False
    assert [r["ok"] for r in data["reports"]] == [True, True, False]
    assert data["reports"][2]["problems"][0]["kind"] == "removed_flag"
