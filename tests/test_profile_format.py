"""One ``--profile`` format for every engine (issue 40): schema 2 has an ``engine`` section whose
entries are the engines' own kernels (``calibrate --engine llamacpp``); ``spec.profile.load_profile``
reads every file written so far, both kinds of version 1 included, and each predictor takes its
part (predict's GPU model the box's fields, ``predict --engine llamacpp`` its entry)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ceiling.errors import CeilingError
from ceiling.predict.api import PredictRequest, predict
from ceiling.predict.llamacpp import as_profile, profile_from_sql
from ceiling.predict.llamacpp_files import load_kernels
from ceiling.spec.profile import SCHEMA_VERSION, HardwareProfile, load_profile, save_profile

# copies of that run's files (tests/fixtures/llamacpp_h200/README.md)
RES = Path(__file__).parent / "fixtures/llamacpp_h200"
GGUF = Path(__file__).parent / "fixtures" / "gguf" / "tiny-llama-f16.header.gguf"
KERNELS = profile_from_sql((RES / "call2/perf-types.sql").read_text(), gpu="h200")


def _write(path: Path, doc: dict) -> Path:
    path.write_text(json.dumps(doc))
    return path


def _llamacpp_ms(profile: Path | None) -> float:
    req = PredictRequest(engine="llamacpp", model=str(GGUF), gpu="h200",
                         profile=str(profile) if profile else None)  # fmt: skip
    return predict(req).decode_ms_per_token


def test_the_current_format_has_an_engine_section_and_one_loader_reads_it(tmp_path):
    box = HardwareProfile(gpu="h200", mem_bw_GBps=4300.0, gemv_bw_GBps={"bf16": 4000.0})
    both = box.merge(as_profile(KERNELS))  # calibrate and calibrate --engine llamacpp, merged
    path = save_profile(both, tmp_path / "p.json")
    doc = json.loads(path.read_text())
    assert SCHEMA_VERSION == 2 and doc["schema_version"] == 2
    assert set(doc["engine"]) == {"llamacpp"} and doc["mem_bw_GBps"] == 4300.0
    got = load_profile(path)
    assert got == both and load_kernels(path) == KERNELS
    # each predictor its part: the llama.cpp one its kernels, the GPU model the box's fields
    assert _llamacpp_ms(path) == _llamacpp_ms(save_profile(as_profile(KERNELS), tmp_path / "k"))
    assert _llamacpp_ms(path) != _llamacpp_ms(None)
    box_only = save_profile(box, tmp_path / "box.json")

    def gpu_model(p: Path):  # type: ignore[no-untyped-def]
        return predict(PredictRequest(model="llama-3.1-8b", gpu="h200", profile=str(p)))

    assert gpu_model(path).model_dump(exclude={"request", "assumptions"}) == gpu_model(
        box_only
    ).model_dump(exclude={"request", "assumptions"})


def test_a_version_1_llamacpp_kernel_file_still_loads(tmp_path):
    old = {"schema_version": 1, "kind": "llamacpp-kernels", **KERNELS.model_dump()}
    path = _write(tmp_path / "old.json", old)
    prof = load_profile(path)
    assert prof.schema_version == 2 and prof.gpu == "h200"
    assert set(prof.engine) == {"llamacpp"} and load_kernels(path) == KERNELS
    assert _llamacpp_ms(path) == _llamacpp_ms(save_profile(as_profile(KERNELS), tmp_path / "k"))


def test_a_version_1_hardware_profile_still_loads_and_has_no_llamacpp_kernels(tmp_path):
    path = _write(tmp_path / "hw.json", {"schema_version": 1, "gpu": "h200", "mem_bw_GBps": 4300.0})
    prof = load_profile(path)
    assert prof.mem_bw_GBps == 4300.0 and prof.engine == {}
    # predict --engine llamacpp given a profile with no entry of its own: refused, not ignored
    with pytest.raises(CeilingError) as e:
        load_kernels(path)
    assert "no llama.cpp kernel profile" in e.value.message
    assert "ceiling calibrate --engine llamacpp" in (e.value.fix or "")


@pytest.mark.parametrize(
    ("doc", "said"),
    [
        ({"schema_version": 3}, "schema_version 3"),
        ({"schema_version": 1, "kind": "bench"}, "'bench' file, not a hardware or kernel profile"),
        ({"schema_version": 2, "engine": {"llamacpp": {"matvec": 1}}}, "not a kernel profile"),
    ],
)
def test_other_files_are_refused_with_what_they_are(doc, said, tmp_path):
    path = _write(tmp_path / "x.json", doc)
    with pytest.raises(CeilingError, match=said):
        load_kernels(path)


def test_calibrate_engine_llamacpp_merges_into_a_box_profile(tmp_path):
    from ceiling.flows.calibrate_llamacpp import calibrate_cli

    box = save_profile(HardwareProfile(gpu="h200", mem_bw_GBps=4300.0), tmp_path / "box.json")
    out = tmp_path / "both.json"
    calibrate_cli(None, str(RES / "call2/perf-types.sql"), None, str(out), merge=str(box))
    got = load_profile(out)
    assert got.mem_bw_GBps == 4300.0 and got.gpu == "h200" and set(got.engine) == {"llamacpp"}
    assert load_kernels(out).matvec == KERNELS.matvec
