"""preflight's checks against a flag table (offline: the table is built here, as vLLM dumps it).

The real-engine test (tests/engine/) checks the same against the installed vLLM's own parser.
"""

from __future__ import annotations

import sys

import pytest

from ceiling.engines import get_engine
from ceiling.engines.flags import FlagSpec, FlagTable
from ceiling.engines.preflight import check_args, check_env
from ceiling.engines.variant import parse_arg_list, parse_arg_mapping
from ceiling.errors import CeilingError


def spec(*options, kind="value", **kw) -> FlagSpec:
    dest = options[0].lstrip("-").replace("-", "_")
    return FlagSpec(options=list(options), dest=dest, kind=kind, **kw)


TABLE = FlagTable(
    engine="vllm",
    version="0.32.0",
    source="parser",
    actions=[
        spec("--max-model-len", type="human_readable_int"),
        spec("--tensor-parallel-size", "-tp", type="int"),
        spec("--gpu-memory-utilization", type="float"),
        spec("--dtype", choices=["auto", "bfloat16", "float16", "float32"], type="str"),
        spec("--enforce-eager", "--no-enforce-eager", kind="bool_optional", nargs=0),
        spec("--trust-remote-code", "--no-trust-remote-code", kind="bool_optional", nargs=0),
        spec("--headless", kind="flag", nargs=0),
        spec("--compilation-config", "-cc", type="parse_dataclass"),
        spec("--optimization-level", type="str"),
        spec("--async-scheduling", "--no-async-scheduling", kind="bool_optional", nargs=0),
        spec("--lora-modules", nargs="+"),
        spec("--old-thing", deprecated=True),
    ],
    env=["VLLM_CPU_KVCACHE_SPACE", "VLLM_ATTENTION_BACKEND", "VLLM_NO_USAGE_STATS"],
)
VLLM = get_engine("vllm")


def problems(tokens):
    return check_args(parse_arg_list(tokens, "t"), TABLE, VLLM)


def test_valid_args_pass():
    tokens = ["--max-model-len", "4k", "-tp", "8", "--dtype", "float32", "--no-enforce-eager"]
    tokens += ["-cc.mode=VLLM_COMPILE", "--lora-modules", "a=x", "b=y"]
    assert problems(tokens) == []


def test_o_level_meaning_changed_is_a_warning():
    [p] = problems(["-O3"])
    assert p.level == "warning" and p.kind == "semantics_changed"
    assert "optimization level" in p.message and "-cc.mode" in (p.fix or "")
    old = TABLE.model_copy(update={"version": "0.11.0"})
    assert check_args(parse_arg_list(["-O", "3"], "t"), old, VLLM) == []


def test_duplicate_flag_across_spellings_is_a_warning():
    [p] = problems(["--max-model-len", "4k", "--max_model_len=512"])
    assert p.level == "warning" and p.kind == "duplicate_flag"


def test_removed_flag_says_why_and_when():
    [p] = problems(["--num-scheduler-steps", "10"])
    assert p.level == "error" and p.kind == "removed_flag"
    assert "0.10.2" in p.message and "V0" in p.message
    assert "vllm#22779" in (p.fix or "")


def test_swap_space_removed_in_0_18():
    [p] = problems(["--swap-space", "4"])
    assert p.kind == "removed_flag" and "0.18.0" in p.message


def test_unknown_flag_suggests_closest():
    [p] = problems(["--max-modle-len", "512"])
    assert p.kind == "unknown_flag" and p.suggestion == "--max-model-len"
    assert "did you mean --max-model-len" in p.message


@pytest.mark.parametrize(
    "tokens, kind",
    [
        (["--dtype", "fp32"], "bad_value"),
        (["-tp", "eight"], "bad_value"),
        (["--gpu-memory-utilization", "high"], "bad_value"),
        (["--max-model-len", "lots"], "bad_value"),
        (["--enforce-eager", "true"], "unexpected_value"),
        (["--tensor-parallel-size"], "missing_value"),
        (["--no-headless"], "bad_flag_form"),
        (["--compilation-config", "{'mode': 3}"], "bad_value"),  # not JSON
        (["--compilation-config", '{"level": 3}'], "renamed_config_key"),
        (["-cc.level=3"], "renamed_config_key"),
        (
            ["--compilation-config", '{"pass_config": {"enable_fusion": true}}'],
            "renamed_config_key",
        ),
    ],
)
def test_bad_values(tokens, kind):
    found = problems(tokens)
    assert [p.kind for p in found] == [kind], found
    assert all(p.level == "error" for p in found)


def test_deprecated_flag_is_a_warning():
    [p] = problems(["--old-thing", "x"])
    assert p.level == "warning" and p.kind == "deprecated_flag"


def test_mapping_false_gives_no_form_checked():
    args = [a for a in parse_arg_mapping({"enforce-eager": False}, "t") if not isinstance(a, str)]
    assert check_args(args, TABLE, VLLM) == []


def test_env_nccl_and_vllm():
    env = {
        "NCCL_PROTO": "LL,LL128",
        "NCCL_ALGO": "Ring",
        "NCCL_P2P_LEVEL": "SYS",
        "NCCL_NTHREADS": "512",
        "NCCL_MAX_NCHANNEL": "16",  # typo: NCCL ignores it silently
        "NCCL_ALGO_X": "1",
        "VLLM_ATTENTON_BACKEND": "FLASHINFER",  # typo
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "CUDA_DEVICE_MAX_CONNECTIONS": "1",
    }
    found = {p.subject: p for p in check_env(env, TABLE, VLLM)}
    assert set(found) == {"NCCL_MAX_NCHANNEL", "NCCL_ALGO_X", "VLLM_ATTENTON_BACKEND"}
    assert all(p.level == "warning" for p in found.values())
    assert found["NCCL_MAX_NCHANNEL"].suggestion == "NCCL_MAX_NCHANNELS"
    assert found["VLLM_ATTENTON_BACKEND"].suggestion == "VLLM_ATTENTION_BACKEND"


def test_env_bad_nccl_value():
    [p] = check_env({"NCCL_PROTO": "LL,Fast"}, TABLE, VLLM)
    assert p.kind == "bad_env_value" and "Fast" in p.message
    [p] = check_env({"NCCL_NTHREADS": "1000"}, TABLE, VLLM)
    assert p.kind == "bad_env_value"


def test_unknown_engine_is_a_ceiling_error():
    with pytest.raises(CeilingError, match="unknown engine"):
        get_engine("tensorrt-llm-9000")


def test_cli_preflight_uses_the_cached_flag_table(tmp_path, monkeypatch, capsys):
    """The engine is asked once per version; later checks read the cache (no engine import)."""
    from ceiling.cli import main
    from ceiling.engines.vllm import VllmEngine

    calls = []

    def fake_dump(self, install):
        calls.append(install)
        return TABLE.model_copy(deep=True)

    monkeypatch.setenv("CEILING_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(VllmEngine, "dump_flags", fake_dump)
    good = tmp_path / "good.yaml"
    good.write_text(
        f"engine: vllm\nmodel: org/m\ncommand: [{sys.executable!r}]\n"
        "args: {max-model-len: 512, dtype: float32}\nenv: {NCCL_PROTO: LL}\n"
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text("extends: good.yaml\nargs: [--num-scheduler-steps, '10']\n")
    assert main(["preflight", str(good)]) == 0
    assert main(["preflight", str(good), str(bad)]) == 1
    out = capsys.readouterr().out
    assert "ok good" in out and "FAIL bad" in out
    assert "removed in 0.10.2" in out and "fix:" in out
    assert len(calls) == 1  # second and third checks came from the cache
    assert list((tmp_path / "cache" / "flags").glob("vllm-*.json"))


def test_a_parser_table_is_shared_by_wrapper_commands_a_help_table_is_not(tmp_path, monkeypatch):
    """The parser's table depends on the Python that imports it, not on the script a variant
    launches (fault-injection variants wrap vLLM in one of their own); a table parsed from a
    command's --help text belongs to that command."""
    from ceiling.engines.base import EngineInstall
    from ceiling.engines.vllm import VllmEngine

    monkeypatch.setenv("CEILING_CACHE_DIR", str(tmp_path / "cache"))
    source = {"now": "parser"}
    calls = []

    def fake_dump(self, install):
        calls.append(install.command)
        return TABLE.model_copy(update={"source": source["now"]}, deep=True)

    monkeypatch.setattr(VllmEngine, "dump_flags", fake_dump)
    engine = get_engine("vllm")

    def install(script: str) -> EngineInstall:
        return EngineInstall(
            python=sys.executable, command=[sys.executable, script], version="0.32.0"
        )

    assert not engine.flag_table(install("a.py")).cache_hit
    assert engine.flag_table(install("b.py")).cache_hit  # same Python: the parser's table
    assert calls == [[sys.executable, "a.py"]]
    source["now"] = "help"
    helpless = EngineInstall(python=None, command=["/opt/x/vllm"], version="0.32.0")
    assert not engine.flag_table(helpless).cache_hit
    other = EngineInstall(python=None, command=["/opt/y/vllm"], version="0.32.0")
    assert not engine.flag_table(other).cache_hit  # another command: its own --help
    assert engine.flag_table(helpless).cache_hit
    assert len(calls) == 3
