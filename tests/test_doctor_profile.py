"""The doctor's one profile option (issue 40, part 3): ``--profile FILE`` takes the schema-2
profile (its hardware part for the prediction, its ``engine.llamacpp`` entry for llama-server's
bandwidth split); ``--llamacpp-profile`` is its old spelling, kept one release with a warning."""

from __future__ import annotations

from pathlib import Path

import pytest

from ceiling.cli import _register_all
from ceiling.diagnose.expect import request_for
from ceiling.diagnose.schema import DoctorConfig
from ceiling.errors import CeilingError
from ceiling.flows.calibrate_llamacpp import calibrate_cli
from ceiling.flows.doctor_checks import check_config
from ceiling.spec.profile import HardwareProfile, save_profile
from test_doctor_llamacpp_predict import H200
from test_doctor_setup import _parsed_doctor

SQL = Path(__file__).parent / "fixtures/llamacpp_h200/call2/perf-types.sql"


@pytest.fixture
def hw_only(tmp_path: Path) -> Path:
    """A profile with no engine section: calibrate's, as on a vLLM box."""
    return save_profile(HardwareProfile(gpu="h200", mem_bw_GBps=4200.0), tmp_path / "hw.json")


@pytest.fixture
def with_llamacpp(tmp_path: Path, hw_only: Path) -> Path:
    """The same profile with llama.cpp's kernels merged in (calibrate --engine llamacpp)."""
    out = tmp_path / "both.json"
    calibrate_cli(None, str(SQL), None, str(out), merge=str(hw_only))
    return out


def test_both_spellings_give_the_one_profile_and_the_old_one_warns(
    with_llamacpp: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _register_all()  # what main() does first: the commands are registered lazily
    base = ["doctor", "--url", "http://127.0.0.1:9", "--engine", "llamacpp"]
    new = _parsed_doctor([*base, "--profile", str(with_llamacpp)], monkeypatch)
    assert new.profile == str(with_llamacpp)
    assert "deprecated" not in capsys.readouterr().err
    old = _parsed_doctor([*base, "--llamacpp-profile", str(with_llamacpp)], monkeypatch)
    assert old == new
    err = capsys.readouterr().err
    assert "--llamacpp-profile is deprecated" in err and "use --profile" in err


def test_a_doctor_json_with_the_old_field_still_reads() -> None:
    cfg = DoctorConfig.model_validate({"url": "http://h:1", "llamacpp_profile": "p.json"})
    assert cfg.profile == "p.json" and "llamacpp_profile" not in cfg.model_dump()


def test_a_llamacpp_doctor_says_what_its_profile_lacks(hw_only: Path, with_llamacpp: Path) -> None:
    cfg = DoctorConfig(url="http://127.0.0.1:9", engine="llamacpp", profile=str(hw_only))
    with pytest.raises(CeilingError) as exc:
        check_config(cfg)
    assert "no engine.llamacpp entry" in str(exc.value)
    assert "calibrate --engine llamacpp --merge" in (exc.value.fix or "")
    # with llama.cpp's kernels in it, the same doctor starts
    check_config(cfg.model_copy(update={"profile": str(with_llamacpp)}))


def test_a_vllm_doctor_takes_a_profile_without_an_engine_section(hw_only: Path) -> None:
    """The hardware part is every engine's: it reaches the prediction as predict --profile."""
    cfg = DoctorConfig(url="http://127.0.0.1:9", engine="vllm", profile=str(hw_only))
    check_config(cfg)
    req = request_for(cfg, H200, "llama-3.1-8b", None, None)
    assert req.profile == str(hw_only)
