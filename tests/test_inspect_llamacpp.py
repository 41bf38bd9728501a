"""llama.cpp's start-up log grammar on REAL logs of both flavours serving the tiny GGUF:
llama-cpp-python 0.3.36 (``LlamaCppEngine``, tests/fixtures/logs/llamacpp_0.3.36_tiny_real.log)
and llama-server built from the same llama.cpp (``LlamaServerEngine``,
llama-server_b1-0c1e570_tiny_*_real.log); and llama-server's flag table read from its real
``--help`` (tests/fixtures/engines/). Captured on the 2-core test machine; paths redacted."""

from __future__ import annotations

from pathlib import Path

from ceiling.diagnose.findings import context_for
from ceiling.diagnose.logs import detect_engine, inspect_log
from ceiling.engines import get_engine

LOGS = Path(__file__).parent / "fixtures" / "logs"
REAL = LOGS / "llamacpp_0.3.36_tiny_real.log"
SERVER = LOGS / "llama-server_b1-0c1e570_tiny_lv4_real.log"
SERVER_DEFAULT = LOGS / "llama-server_b1-0c1e570_tiny_default_real.log"
HELP = Path(__file__).parent / "fixtures" / "engines" / "llama-server_b1-0c1e570_help.txt"


def test_real_llamacpp_log_facts() -> None:
    f = inspect_log(REAL)
    assert f.engine == "llamacpp-python" and f.device == "cpu" and f.ready is True
    assert f.model == "<repo>/.cache/tiny-gguf/tiny.gguf"
    assert f.architecture == "llama" and f.dtype == "float32" and f.quantization is None
    assert f.max_model_len == 512 and f.max_concurrency_tokens_per_request == 512
    assert f.max_concurrency == 1  # n_seq_max: one request at a time
    assert f.kv_cache_tokens == 512 and f.kv_cache_dtype == "f16"
    assert f.kv_cache_memory_gib is not None and abs(f.kv_cache_memory_gib * 1024 - 0.5) < 1e-9
    assert f.model_memory_gib is not None and 1.5 < f.model_memory_gib * 1024 < 1.8
    assert f.attention_backend == "llama.cpp (flash_attn disabled)"
    assert f.errors == [] and f.startup_s is None  # the log has no timestamps
    assert "n_seq_max" in f.evidence and "kv_size" in f.evidence


def test_detection_does_not_mix_engines() -> None:
    lines = REAL.read_text().splitlines()
    assert detect_engine(lines) == "llamacpp-python"
    assert detect_engine(SERVER.read_text().splitlines()) == "llamacpp"
    assert detect_engine(SERVER_DEFAULT.read_text().splitlines()) == "llamacpp"
    for other in ("vllm_cpu_0.32_eager_real.log", "sglang_dsv3_tp8.log"):
        for name in ("llamacpp", "llamacpp-python"):
            assert not get_engine(name).claims_log((LOGS / other).read_text().splitlines())
    # the binding's log has no llama-server line
    assert not get_engine("llamacpp").claims_log(lines)


def test_phases_follow_the_real_log() -> None:
    engine = get_engine("llamacpp-python")
    phases = [p for ln in REAL.read_text().splitlines() if (p := engine.phase_of(ln))]
    order = [p for i, p in enumerate(phases) if i == 0 or phases[i - 1] != p]
    assert order[0] == "reading the GGUF file" and order[-1] == "ready"
    for phase in ("loading weights", "allocating KV cache", "starting API server"):
        assert phase in order


def test_real_llama_server_log_facts() -> None:
    f = inspect_log(SERVER)
    assert f.engine == "llamacpp" and f.device == "cpu" and f.ready is True
    assert f.version == "b1.0c1e570"
    assert f.model == ".cache/tiny-gguf/tiny.gguf"
    assert f.architecture == "llama" and f.dtype == "float32"
    # 4 slots (the running cap) over ONE unified pool of 512 cells: each request may use all
    # 512, so the cache holds one full-length request, not four
    assert f.kv_unified is True and f.non_default_args["n_slots"] == 4
    assert f.max_concurrency == 1
    assert f.max_model_len == 512 and f.kv_cache_tokens == 512 and f.kv_cache_dtype == "f16"
    assert f.attention_backend == "llama.cpp (flash_attn auto)"
    assert f.errors == []
    # at the default verbosity the loader lines are not logged: only the server's own facts
    d = inspect_log(SERVER_DEFAULT)
    assert d.ready is True and d.max_concurrency == 1 and d.max_model_len == 512
    assert d.kv_unified is True and d.non_default_args["n_slots"] == 4
    assert d.architecture is None
    assert d.kv_cache_tokens == 512  # from the server's own line: unified, n_ctx_slot = n_ctx


def _split_context(log: Path, tmp_path: Path) -> Path:
    """The real -lv 4 log as llama-server prints it with ``--parallel 4 --ctx-size 512`` and no
    ``--kv-unified`` (src/llama-context.cpp: n_ctx_seq = n_ctx / n_seq_max; four streams of 128
    cells; tools/server/server-context.cpp: "initializing, n_slots = %d, n_ctx_slot = %d,
    kv_unified = '%s'")."""
    swaps = {
        "llama_context: n_ctx_seq             = 512": "llama_context: n_ctx_seq             = 128",
        "llama_context: kv_unified            = true": "llama_context: kv_unified            = false",
        "(   512 cells,   2 layers,  4/1 seqs)": "(   128 cells,   2 layers,  4/4 seqs)",
        "n_ctx_slot = 512, kv_unified = 'true'": "n_ctx_slot = 128, kv_unified = 'false'",
        "new slot, n_ctx = 512": "new slot, n_ctx = 128",
    }
    text = log.read_text()
    for old, new in swaps.items():
        assert old in text, old
        text = text.replace(old, new)
    out = tmp_path / "split.log"
    out.write_text(text)
    return out


def test_llama_server_without_unified_kv_gives_each_slot_its_share(tmp_path) -> None:
    f = inspect_log(_split_context(SERVER, tmp_path))
    assert f.kv_unified is False and f.non_default_args["n_slots"] == 4
    assert f.max_model_len == 128  # n_ctx / n_parallel: what one request can use
    assert f.kv_cache_tokens == 512  # 4 streams of 128 cells
    assert f.max_concurrency == 4  # four full-length (128-token) requests fit


def test_unified_kv_capacity_is_judged_by_the_shared_pool() -> None:
    # four streams of 128 tokens fit the shared 512 cells; four of 512 do not
    short = inspect_log(SERVER, context=context_for(None, concurrency=4, request_tokens=128))
    assert "kv-capacity" not in {x.id for x in short.findings}
    full = inspect_log(SERVER, context=context_for(None, concurrency=4, request_tokens=512))
    kv = next(x for x in full.findings if x.id == "kv-capacity")
    assert "holds 1.00 full-length requests; 4 requested" in kv.title


def test_llama_server_phases() -> None:
    engine = get_engine("llamacpp")
    phases = [p for ln in SERVER.read_text().splitlines() if (p := engine.phase_of(ln))]
    order = [p for i, p in enumerate(phases) if i == 0 or phases[i - 1] != p]
    assert order[0] == "reading the GGUF file" and order[-1] == "ready"
    assert "allocating KV cache" in order and "starting the HTTP server" in order


def test_llama_server_flags_from_its_real_help() -> None:
    from ceiling.engines.llamacpp_server import parse_server_help

    specs, env = parse_server_help(HELP.read_text())
    by = {o: s for s in specs for o in s.options}
    assert by["-c"] is by["--ctx-size"] and by["--ctx-size"].kind == "value"
    assert by["--ctx-size"].type == "int"
    assert by["--flash-attn"].choices == ["on", "off", "auto"]
    assert by["--rope-scaling"].choices == ["none", "linear", "yarn"]
    assert by["--cpu-strict"].choices == ["0", "1"]
    assert by["--poll"].choices is None  # <0...100> is a range, not a list
    assert by["--perf"] is by["--no-perf"] and by["--perf"].kind == "bool_optional"
    assert by["-cb"] is by["--no-cont-batching"]
    assert by["--help"].kind == "help" and by["--version"].kind == "flag"
    assert by["--cache-type-k-draft"] is by["-ctkd"]  # an option line longer than 40 columns
    assert "LLAMA_ARG_CTX_SIZE" in env and "LLAMA_ARG_LOG_VERBOSITY" in env
    assert len(specs) > 200
