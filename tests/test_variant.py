"""Variant files: YAML/TOML, list/mapping args, `extends` merge rules, bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from ceiling.engines.variant import load_variant, parse_arg_list
from ceiling.errors import CeilingError

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "variants"


def write(p: Path, text: str) -> Path:
    p.write_text(text)
    return p


def test_founding_story_chain_merges_env_and_args():
    v3 = load_variant(EXAMPLES / "v3.yaml")
    assert v3.engine == "vllm"
    assert v3.env["NCCL_PROTO"] == "LL" and v3.env["NCCL_P2P_LEVEL"] == "SYS"  # baseline
    assert v3.env["NCCL_ALGO"] == "Ring" and v3.env["NCCL_BUFFSIZE"] == "16777216"  # tuned
    assert v3.env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert v3.env["NCCL_NTHREADS"] == "512"  # v3
    argv = v3.argv()
    assert argv[:2] == ["--tensor-parallel-size", "8"]
    assert argv[-2:] == ["--num-scheduler-steps", "10"]
    assert [Path(p).name for p in v3.extends_chain] == ["baseline.yaml", "tuned.yaml"]
    tuned = load_variant(EXAMPLES / "tuned.yaml")
    assert "--num-scheduler-steps" not in tuned.argv()
    assert "NCCL_NTHREADS" not in tuned.env


def test_mapping_args_bool_false_and_null_removal(tmp_path):
    write(
        tmp_path / "base.yaml",
        "engine: vllm\nmodel: org/m\nargs:\n  max_model_len: 512\n  enforce-eager: true\n"
        "  dtype: float32\nenv:\n  A: '1'\n  B: '2'\n",
    )
    write(
        tmp_path / "child.yaml",
        "extends: base.yaml\nport: 9000\nargs:\n  max-model-len: 1024\n  enforce-eager: false\n"
        "  dtype: null\n  tp: 2\nenv:\n  B: null\n  C: 3\n",
    )
    v = load_variant(tmp_path / "child.yaml")
    # replaced in place (underscore == dash), negated form replaces, null removes, new appended
    assert v.argv() == ["--max-model-len", "1024", "--no-enforce-eager", "-tp", "2"]
    assert v.env == {"A": "1", "C": "3"}
    assert v.port == 9000 and v.host == "127.0.0.1"
    assert v.name == "child"


def test_toml_and_list_args_with_equals_and_negative_numbers(tmp_path):
    write(
        tmp_path / "v.toml",
        'engine = "vllm"\nmodel = "org/m"\nargs = ["--seed=-1", "--max-num-seqs", "8", '
        '"--enable-prefix-caching"]\n[env]\nNCCL_PROTO = "LL"\n',
    )
    v = load_variant(tmp_path / "v.toml")
    assert v.argv() == ["--seed", "-1", "--max-num-seqs", "8", "--enable-prefix-caching"]
    assert v.env == {"NCCL_PROTO": "LL"}


def test_relative_model_path_is_relative_to_the_file(tmp_path):
    (tmp_path / "models" / "tiny").mkdir(parents=True)
    sub = tmp_path / "variants"
    sub.mkdir()
    write(sub / "v.yaml", "engine: vllm\nmodel: ../models/tiny\n")
    v = load_variant(sub / "v.yaml")
    assert Path(v.model) == (tmp_path / "models" / "tiny").resolve()
    assert v.model_path() is not None and v.model_path().exists()


@pytest.mark.parametrize(
    "text, needle",
    [
        ("engine: vllm\nmodel: [unclosed\n", "malformed variant file"),
        ("- just\n- a list\n", "top level"),
        ("model: org/m\n", "no `engine`"),
        ("engine: vllm\n", "no `model`"),
        ("engine: vllm\nmodel: m\nflags: [--x]\n", "unknown key"),
        ("engine: vllm\nmodel: m\nargs: ['512', '--x']\n", "start with a value"),
        ("engine: vllm\nmodel: m\nport: eighty\n", "not a number"),
    ],
)
def test_bad_variants_raise_ceiling_error(tmp_path, text, needle):
    p = write(tmp_path / "bad.yaml", text)
    with pytest.raises(CeilingError) as err:
        load_variant(p)
    assert needle in err.value.message
    assert err.value.fix


def test_extends_cycle_and_missing_parent(tmp_path):
    write(tmp_path / "a.yaml", "extends: b.yaml\nengine: vllm\nmodel: m\n")
    write(tmp_path / "b.yaml", "extends: a.yaml\n")
    with pytest.raises(CeilingError, match="cycle"):
        load_variant(tmp_path / "a.yaml")
    write(tmp_path / "c.yaml", "extends: nowhere.yaml\nengine: vllm\nmodel: m\n")
    with pytest.raises(CeilingError, match="not found"):
        load_variant(tmp_path / "c.yaml")


def test_parse_arg_list_groups_values():
    args = parse_arg_list(["--lora-modules", "a=x", "b=y", "-O3"], "t")
    assert [(a.flag, a.values) for a in args] == [("--lora-modules", ["a=x", "b=y"]), ("-O3", [])]


def test_repeated_flags_in_one_file_are_kept_and_replace_the_parents(tmp_path):
    write(tmp_path / "p.yaml", "engine: vllm\nmodel: m\nargs: [--middleware, a, --middleware, b]\n")
    write(
        tmp_path / "same.yaml", "engine: vllm\nmodel: m\nargs: [--middleware, x, --middleware, y]\n"
    )
    assert load_variant(tmp_path / "same.yaml").argv() == ["--middleware", "x", "--middleware", "y"]
    write(tmp_path / "c.yaml", "extends: p.yaml\nargs: [--middleware, c, --middleware, d]\n")
    assert load_variant(tmp_path / "c.yaml").argv() == ["--middleware", "c", "--middleware", "d"]
