"""The real llama.cpp with the tiny GGUF model, in both flavours (every test runs twice: the
``llama-server`` binary, engine ``llamacpp``, and llama-cpp-python's server, engine
``llamacpp-python``): preflight, launch, stream, ``ceiling bench``, start-up log, deaths, teardown.

One shared server per flavour (``llamacpp_server``, tests/engine/conftest.py); llama.cpp starts
in a second or two, so the death and teardown tests launch their own. What differs between the
flavours is written down in ``FLAVOUR`` (each value observed on the real servers).
"""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path

import pytest

from ceiling.diagnose.logs import detect_engine, inspect_log
from ceiling.engines.variant import Arg
from ceiling.flows.preflight import run as preflight
from ceiling.run.launcher import EngineDied, _group_members, port_in_use, start

pytestmark = [pytest.mark.engine, pytest.mark.timeout(600)]

# the tiny GGUF's special tokens <s>, </s>, <pad> (src/ceiling/demo/tiny_gguf.py): banned with
# logit_bias, since llama.cpp has no ignore_eos, to get exactly max_tokens. Not together with
# min_tokens: llama-cpp-python 0.3.36 then drops both (hence bench's --no-ignore-eos below)
BAN_SPECIALS = {"0": -100.0, "1": -100.0, "2": -100.0}


FLAVOUR = {
    "llamacpp": {
        "version": "b1.0c1e570",
        "flag_source": "help",
        "flags": 2,  # --ctx-size, --log-verbosity
        # llama.cpp's own parser: a typo, a bad choice, a non-integer; `_` spellings are fine
        "bad_args": ["--n-gpu-layer", "0", "--flash-attn", "maybe", "--threads", "two",
                     "--ctx_size", "512"],
        "bad": {"--n-gpu-layer": ("unknown_flag", "--n-gpu-layers"),
                "--flash-attn": ("bad_value", None),
                "--threads": ("bad_value", None)},
        "usage_chunk": True,
        "tokens_source": "usage",
        # full-length requests the KV cache holds: 4 slots share one unified 512-cell cache
        "concurrency": 1,
        "unknown_flag_death": ("unrecognized arguments", 1, "--no-such-flag"),
        "bad_value": ["--ctx-size", "abc"],
        "bad_value_death": ("invalid flag value", 1, "--ctx-size"),
    },
    "llamacpp-python": {
        "version": "0.3.36",
        "flag_source": "parser",
        "flags": 1,  # --n_ctx
        "bad_args": ["--n_gpu_layer", "0", "--n-batch", "64", "--verbose", "maybe",
                     "--n_threads", "two"],
        "bad": {"--n_gpu_layer": ("unknown_flag", "--n_gpu_layers"),
                # llama-cpp-python's argparse knows only --n_batch
                "--n-batch": ("bad_flag_form", "--n_batch"),
                "--verbose": ("bad_value", None),  # booleans take true/false words
                "--n_threads": ("bad_value", None)},
        "usage_chunk": False,  # stream_options.include_usage is ignored
        "tokens_source": "chunks",
        "concurrency": 1,  # one n_seq_max = 1 context behind a lock
        "unknown_flag_death": ("argparse unrecognized arguments", 2, "--no_such_flag"),
        # argparse takes -1 as an int; the pydantic settings refuse it (n_ctx >= 0)
        "bad_value": ["--n_ctx", "-1"],
        "bad_value_death": ("invalid setting value", 1, "n_ctx"),
    },
}  # fmt: skip


def _with_args(variant, *tokens: str, log_dir: Path):
    """A copy of ``variant`` with extra flags (``--flag value`` pairs or bare flags)."""
    v = variant.with_overrides(log_dir=str(log_dir))
    for tok in tokens:
        if tok.startswith("--"):
            v.args.append(Arg(flag=tok))
        else:
            v.args[-1].values.append(tok)
    return v


def test_variant_passes_preflight_with_the_real_parser(cpu_tiny_llamacpp_variant):
    want = FLAVOUR[cpu_tiny_llamacpp_variant.engine]
    report = preflight(cpu_tiny_llamacpp_variant, refresh=True)
    assert report.ok, report.problems
    assert report.engine == cpu_tiny_llamacpp_variant.engine
    assert report.engine_version == want["version"]
    assert report.flag_source == want["flag_source"] and report.flags_checked == want["flags"]
    again = preflight(cpu_tiny_llamacpp_variant)
    assert again.ok and again.cache_hit


def test_preflight_rejects_bad_flags_without_starting_a_server(cpu_tiny_llamacpp_variant, tmp_path):
    want = FLAVOUR[cpu_tiny_llamacpp_variant.engine]
    logs = tmp_path / "logs"
    variant = _with_args(cpu_tiny_llamacpp_variant, *want["bad_args"], log_dir=logs)
    report = preflight(variant)
    assert not report.ok
    by_flag = {p.subject: p for p in report.errors}
    for flag, (kind, suggestion) in want["bad"].items():
        assert by_flag[flag].kind == kind, by_flag[flag]
        if suggestion:
            assert by_flag[flag].suggestion == suggestion
    assert len(report.errors) == len(want["bad"])
    assert not logs.exists()  # nothing was launched


def test_server_runs_in_its_own_group_and_answers_models(llamacpp_server):
    assert llamacpp_server.alive()
    assert llamacpp_server.model == "tiny"
    assert os.getpgid(llamacpp_server.pid) != os.getpgid(0)
    assert llamacpp_server.pid in _group_members(llamacpp_server.pid)
    env = Path(f"/proc/{llamacpp_server.pid}/environ").read_bytes().split(b"\0")
    assert b"NO_COLOR=1" in env


def _stream(server, body: dict) -> tuple[list[dict], bool]:
    req = urllib.request.Request(
        server.url + "/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    chunks, done = [], False
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
            chunks.append(json.loads(payload))
    return chunks, done


def test_stream_one_completion_token_per_chunk(llamacpp_server):
    body = {
        "model": llamacpp_server.model,
        "prompt": "Hello, world!",
        "max_tokens": 16,
        "logit_bias": BAN_SPECIALS,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    chunks, done = _stream(llamacpp_server, body)
    assert done
    usage = [c["usage"] for c in chunks if c.get("usage")]
    if FLAVOUR[llamacpp_server.engine.name]["usage_chunk"]:
        # llama-server: usage (and its own timings) in the last chunk, beside finish_reason
        assert len(usage) == 1 and usage[0]["completion_tokens"] == 16
    else:
        assert usage == []
    texts = [ch.get("text", "") for c in chunks for ch in c.get("choices", [])]
    assert len([t for t in texts if t]) == 16  # one token per chunk (ASCII-only vocabulary)
    assert "".join(texts).isascii()
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_bench_single_stream_counts_64_tokens_from_chunks(llamacpp_server, tmp_path):
    from ceiling.bench.results import load_result
    from ceiling.cli import main

    out = tmp_path / "single.json"
    rc = main(
        [
            "bench", "--url", llamacpp_server.url, "--mode", "single", "--max-tokens", "64",
            "--input-len", "32", "--requests", "3", "--warmup", "1",
            "--no-ignore-eos", "--logit-bias", json.dumps(BAN_SPECIALS),
            "--save-detailed", "--quiet",
            "--out", str(out),
        ]
    )  # fmt: skip
    assert rc == 0
    res = load_result(out)
    assert not res.partial and res.failed == 0 and res.completed == 3
    assert res.model_id == "tiny"
    assert res.requests is not None
    source = FLAVOUR[llamacpp_server.engine.name]["tokens_source"]
    for rec in res.requests:
        assert rec.output_tokens == 64 and rec.output_tokens_source == source
        assert rec.chunks == 64  # one token per chunk (ASCII-only vocabulary)
        assert rec.usage_tokens == (64 if source == "usage" else None)
        assert rec.finish_reason == "length" and not rec.short
        assert rec.tpot_ms is not None
    # llama-server decodes the tiny model in ~0.2 ms a token: when the 2-core machine is busy the
    # client can read a whole 64-token stream at once (TPOT 0), but not every request of a run
    assert any(rec.tpot_ms > 0 for rec in res.requests)
    assert res.total_output_tokens == 3 * 64
    # without a usage chunk the count comes from chunks, and the result says so
    assert any("no usage chunk" in w for w in res.warnings) == (source == "chunks")
    assert res.decode_tok_s_per_stream is not None and res.decode_tok_s_per_stream > 0
    assert res.server_metrics is not None and res.server_metrics["available"] is False


def test_real_startup_log_parses(llamacpp_server):
    lines = Path(llamacpp_server.log_path).read_text().splitlines()
    assert detect_engine(lines) == llamacpp_server.engine.name
    facts = inspect_log(llamacpp_server.log_path)
    assert facts.engine == llamacpp_server.engine.name and facts.device == "cpu"
    assert facts.architecture == "llama" and facts.dtype == "float32"
    assert facts.model and facts.model.endswith("tiny.gguf")
    assert facts.max_model_len == 512 and facts.kv_cache_tokens == 512
    assert facts.max_concurrency == FLAVOUR[llamacpp_server.engine.name]["concurrency"]
    assert facts.kv_cache_memory_gib and facts.kv_cache_memory_gib > 0
    assert facts.ready is True


def test_unknown_flag_death_is_classified(cpu_tiny_llamacpp_variant, tmp_path):
    cause, code, quoted = FLAVOUR[cpu_tiny_llamacpp_variant.engine]["unknown_flag_death"]
    variant = _with_args(cpu_tiny_llamacpp_variant, "--no_such_flag", "1", log_dir=tmp_path)
    with pytest.raises(EngineDied) as err:
        start(variant, timeout_s=120, progress=False)
    died = err.value
    assert died.cause == cause
    assert died.death.exit_code == code
    assert any(quoted in ln for ln in died.evidence)
    server_pid = json.loads(next(tmp_path.glob("*.launch.json")).read_text())["pid"]
    assert _group_members(server_pid) == []


def test_invalid_value_death_is_classified(cpu_tiny_llamacpp_variant, tmp_path):
    want = FLAVOUR[cpu_tiny_llamacpp_variant.engine]
    cause, code, quoted = want["bad_value_death"]
    variant = cpu_tiny_llamacpp_variant.with_overrides(log_dir=str(tmp_path))
    flag, value = want["bad_value"]
    variant.args = [Arg(flag=flag, values=[value])]
    with pytest.raises(EngineDied) as err:
        start(variant, timeout_s=120, progress=False)
    died = err.value
    assert died.cause == cause
    assert died.death.exit_code == code
    assert any(quoted in ln for ln in died.evidence)


def test_teardown_leaves_no_process_and_frees_the_port(cpu_tiny_llamacpp_variant, tmp_path):
    server = start(cpu_tiny_llamacpp_variant.with_overrides(log_dir=str(tmp_path)), progress=False)
    pid, port = server.pid, server.port
    assert server.alive() and port_in_use("127.0.0.1", port)
    result = server.stop()
    assert result.leftover_pids == [] and result.port_free
    assert _group_members(pid) == [] and not port_in_use("127.0.0.1", port)
    assert not Path(f"/proc/{pid}").exists()  # reaped
