"""llama.cpp's start-up log grammar (``LlamaCppEngine.parse_log``) on a REAL log of
llama-cpp-python 0.3.36 serving the tiny GGUF (tests/fixtures/logs/llamacpp_0.3.36_tiny_real.log,
captured by ceiling's launcher on the 2-core test machine; the checkout path is redacted)."""

from __future__ import annotations

from pathlib import Path

from ceiling.diagnose.logs import detect_engine, inspect_log
from ceiling.engines import get_engine

LOGS = Path(__file__).parent / "fixtures" / "logs"
REAL = LOGS / "llamacpp_0.3.36_tiny_real.log"


def test_real_llamacpp_log_facts() -> None:
    f = inspect_log(REAL)
    assert f.engine == "llamacpp" and f.device == "cpu" and f.ready is True
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
    assert detect_engine(lines) == "llamacpp"
    for other in ("vllm_cpu_0.32_eager_real.log", "sglang_dsv3_tp8.log"):
        assert not get_engine("llamacpp").claims_log((LOGS / other).read_text().splitlines())


def test_phases_follow_the_real_log() -> None:
    engine = get_engine("llamacpp")
    phases = [p for ln in REAL.read_text().splitlines() if (p := engine.phase_of(ln))]
    order = [p for i, p in enumerate(phases) if i == 0 or phases[i - 1] != p]
    assert order[0] == "reading the GGUF file" and order[-1] == "ready"
    for phase in ("loading weights", "allocating KV cache", "starting API server"):
        assert phase in order
