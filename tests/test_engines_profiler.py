"""The engines' profiler settings: what a launch gets, how a window is asked for, where the files
land, and the sentence for a server ceiling did not launch (per engine and version)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from ceiling.engines import get_engine
from ceiling.engines.variant import Arg, Variant


def _config(setup) -> dict:
    i = setup.args.index("--profiler-config")
    return json.loads(setup.args[i + 1])


def test_vllm_032_gets_the_profiler_config_and_a_bounded_window(tmp_path: Path) -> None:
    setup = get_engine("vllm").profiler("0.32.0+cpu", tmp_path, steps=12, prefix="w1")
    assert setup.supported and setup.bounded_by_engine
    cfg = _config(setup)
    assert cfg["profiler"] == "torch"
    assert cfg["torch_profiler_dir"] == str(tmp_path.resolve())
    assert cfg["ignore_frontend"] is True  # the API server's CPU trace would span the session
    assert cfg["torch_profiler_with_stack"] is False
    assert cfg["max_iterations"] == 12
    assert setup.start_path == "/start_profile" and setup.stop_path == "/stop_profile"
    assert setup.start_body == {"profile_prefix": "w1", "max_iterations": 12}
    assert setup.env == {}
    assert "--profiler-config" in setup.enable_hint
    assert "VLLM_TORCH_PROFILER_DIR" not in setup.enable_hint  # removed in 0.16


@pytest.mark.parametrize(
    ("version", "flag", "env", "body"),
    [
        ("0.8.5", False, True, False),  # the variable era
        ("0.13.0", True, False, False),  # --profiler-config; no per-session body yet
        ("0.15.1", True, False, False),
        ("0.20.0", True, False, False),
        ("0.32.0", True, False, True),
    ],
)
def test_vllm_profiler_by_version(
    tmp_path: Path, version: str, flag: bool, env: bool, body: bool
) -> None:
    setup = get_engine("vllm").profiler(version, tmp_path, steps=8)
    assert setup.supported
    assert ("--profiler-config" in setup.args) is flag
    assert ("VLLM_TORCH_PROFILER_DIR" in setup.env) is env
    assert bool(setup.start_body) is body
    # the variable is named to users for as long as vLLM read it (until 0.16)
    named = "VLLM_TORCH_PROFILER_DIR" in setup.enable_hint
    assert named is (version in ("0.8.5", "0.13.0", "0.15.1"))


def test_vllm_before_the_profiler_says_so(tmp_path: Path) -> None:
    setup = get_engine("vllm").profiler("0.4.3", tmp_path, steps=8)
    assert not setup.supported and setup.start_path is None
    assert "0.5.5" in setup.enable_hint


def test_sglang_needs_no_flag_and_names_its_directory(tmp_path: Path) -> None:
    setup = get_engine("sglang").profiler("0.5.4", tmp_path, steps=6)
    assert setup.supported and setup.works_unlaunched and setup.args == []
    assert setup.env["SGLANG_TORCH_PROFILER_DIR"] == str(tmp_path.resolve())
    assert setup.start_body["output_dir"] == str(tmp_path.resolve())
    assert setup.start_body["num_steps"] == 6
    assert "SGLANG_TORCH_PROFILER_DIR" in setup.enable_hint


@pytest.mark.parametrize("name", ["llamacpp", "llamacpp-python"])
def test_llamacpp_has_no_profiler_and_says_what_instead(tmp_path: Path, name: str) -> None:
    setup = get_engine(name).profiler("b4589", tmp_path, steps=6)
    assert not setup.supported and not setup.args and not setup.env
    assert "no torch profiler" in setup.enable_hint
    assert setup.alternative and "timings" in setup.alternative and "nsys" in setup.alternative


def test_apply_adds_the_flag_and_keeps_a_users_own(tmp_path: Path) -> None:
    engine = get_engine("vllm")
    setup = engine.profiler("0.32.0", tmp_path, steps=4)
    plain = Variant(name="v", engine="vllm", model="m", args=[Arg(flag="--enforce-eager")])
    traced = setup.apply(plain)
    assert traced.argv()[:1] == ["--enforce-eager"]
    assert traced.argv()[1:] == setup.args
    own = Variant(
        name="v",
        engine="vllm",
        model="m",
        args=[Arg(flag="--profiler-config", values=['{"profiler":"torch"}'])],
    )
    assert setup.apply(own).argv() == own.argv()
    sg = get_engine("sglang").profiler("0.5.4", tmp_path, steps=4)
    kept = sg.apply(own.model_copy(update={"env": {"SGLANG_TORCH_PROFILER_DIR": "/mine"}}))
    assert kept.env["SGLANG_TORCH_PROFILER_DIR"] == "/mine"
    assert kept.env["SGLANG_PROFILE_WITH_STACK"] == "False"


def test_trace_files_are_the_workers_of_this_window(tmp_path: Path) -> None:
    setup = get_engine("vllm").profiler("0.32.0", tmp_path, steps=4)
    old = tmp_path / "w0_rank0.1.pt.trace.json.gz"
    old.write_bytes(b"x")
    os.utime(old, (time.time() - 100, time.time() - 100))
    since = time.time() - 1
    for name in (
        "w1_dp0_pp0_tp0_dcp0_ep0_rank0.2.pt.trace.json.gz",
        "w1_dp0_pp0_tp1_dcp0_ep0_rank1.2.pt.trace.json.gz",
        "w1_host_1.async_llm.2.pt.trace.json.gz",  # the frontend's, not a worker's
        "w1_rank0.profiler_out.txt",
    ):
        (tmp_path / name).write_bytes(b"x")
    found = [p.name for p in setup.trace_files(tmp_path, since=since)]
    assert found == [
        "w1_dp0_pp0_tp0_dcp0_ep0_rank0.2.pt.trace.json.gz",
        "w1_dp0_pp0_tp1_dcp0_ep0_rank1.2.pt.trace.json.gz",
    ]
    assert len(setup.trace_files(tmp_path)) == 3  # without `since`, the old window too


def _own(args: list[Arg] | None = None, env: dict[str, str] | None = None) -> Variant:
    return Variant(name="v", engine="vllm", model="m", args=args or [], env=env or {})


def test_a_variants_own_profiler_directory_is_where_the_files_are_read(tmp_path: Path) -> None:
    """The variant's own --profiler-config wins in apply: its directory, not ours, has the
    files (before, capture looked in ours and found nothing)."""
    mine = tmp_path / "mine"
    setup = get_engine("vllm").profiler("0.32.0", tmp_path / "ours", steps=4)
    conf = json.dumps({"profiler": "torch", "torch_profiler_dir": str(mine)})
    own = _own([Arg(flag="--profiler_config", values=[conf])])
    found = setup.for_variant(own)
    assert found.trace_dir == str(mine)
    assert setup.apply(own).argv() == own.argv()  # theirs is launched as it is
    (mine / "w").mkdir(parents=True)
    (mine / "w" / "doctor_rank0.1.pt.trace.json.gz").write_bytes(b"x")
    assert [p.name for p in found.trace_files(Path(found.trace_dir))] == [
        "doctor_rank0.1.pt.trace.json.gz"
    ]
    # a variant without its own keeps ours
    assert setup.for_variant(_own()).trace_dir == setup.trace_dir
    # older vLLM: the variable
    old = get_engine("vllm").profiler("0.8.5", tmp_path / "ours", steps=4)
    got = old.for_variant(_own(env={"VLLM_TORCH_PROFILER_DIR": str(mine)}))
    assert got.trace_dir == str(mine)
    assert old.apply(_own(env={"VLLM_TORCH_PROFILER_DIR": str(mine)})).env == {
        "VLLM_TORCH_PROFILER_DIR": str(mine)
    }


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ('{"profiler":"torch"}', "names no torch_profiler_dir"),
        ("not json", "is not JSON"),
        ('{"profiler":"cuda","torch_profiler_dir":"/x"}', "'cuda' profiler"),
        ('{"profiler":"torch","torch_profiler_dir":"rel/dir"}', "relative trace directory"),
    ],
)
def test_a_variants_own_profiler_setting_ceiling_cannot_read_is_refused(
    tmp_path: Path, value: str, says: str
) -> None:
    from ceiling.errors import CeilingError

    setup = get_engine("vllm").profiler("0.32.0", tmp_path, steps=4)
    with pytest.raises(CeilingError) as err:
        setup.for_variant(_own([Arg(flag="--profiler-config", values=[value])]))
    assert says in str(err.value) and err.value.fix


def test_doctor_reads_the_variants_own_directory(tmp_path: Path) -> None:
    from ceiling.diagnose.schema import DoctorConfig
    from ceiling.flows import doctor_trace

    conf = json.dumps({"profiler": "torch", "torch_profiler_dir": str(tmp_path / "mine")})
    own = _own([Arg(flag="--profiler-config", values=[conf])])
    cfg = DoctorConfig(url="http://x", trace=True, trace_steps=4)
    traced, setup = doctor_trace.traced_variant(own, cfg, tmp_path / "out")
    assert setup.trace_dir == str(tmp_path / "mine")
    assert traced.argv() == own.argv()
