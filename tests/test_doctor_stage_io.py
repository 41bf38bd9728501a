"""The doctor's stage table declares what each step reads and writes (``Step.reads``/``writes``);
``ceiling.flows.doctor_watch`` checks it while the flow runs on the synthetic server (the stand-in
of tests/test_doctor.py): an undeclared read or write fails the run."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from ceiling.diagnose.schema import DoctorResult
from ceiling.flows import doctor
from ceiling.flows.doctor import STAGES, DoctorConfig
from ceiling.flows.doctor_watch import ENV, StageContractError
from gpu_box import gpu_box, use_gpu_box
from sse_server import Plan, SSEServer
from test_doctor import model_dir  # noqa: F401  (a fixture: the tiny Llama's shape)

LOG = Path(__file__).parent / "fixtures" / "logs" / "vllm_0.11_kimi_tp8_pcie.log"


@pytest.fixture(autouse=True)
def _check_stages(monkeypatch):
    monkeypatch.setenv(ENV, "1")


def _cfg(url: str, out: Path, **kw) -> DoctorConfig:
    base = dict(
        url=url,
        max_tokens=16,
        repeat=2,
        warmup=1,
        concurrency=[1, 2],
        concurrency_max_tokens=8,
        concurrency_requests=4,
        out_dir=str(out),
        progress=False,
        telemetry=False,
        sanity=False,
    )
    return DoctorConfig(**{**base, **kw})


def test_every_step_keeps_to_its_declaration_on_a_running_server(model_dir, tmp_path):  # noqa: F811
    with SSEServer(Plan(itl_s=0.004, ttft_s=0.01)) as srv:
        res = doctor.run(_cfg(srv.url, tmp_path / "out", model_path=str(model_dir)))
    assert res.verdict is not None and res.attribution is not None


def test_every_step_keeps_to_its_declaration_with_a_log_on_a_gpu_box(tmp_path, monkeypatch):
    """With the engine's log: the inspect stages, the facts that drive predict, the findings."""
    use_gpu_box(monkeypatch, gpu_box(8))
    with SSEServer(Plan(itl_s=0.012, ttft_s=0.01)) as srv:
        cfg = _cfg(
            srv.url,
            tmp_path,
            log=str(LOG),
            engine="vllm",
            model_path="kimi-k2.5",
            gpu="rtx-pro-6000",
            concurrency=[],
        )
        res = doctor.run(cfg)
    assert res.facts is not None and res.prediction is not None and res.verdict is not None


def _replace(monkeypatch, name: str, run) -> None:
    steps = tuple(dataclasses.replace(s, run=run(s.run)) if s.name == name else s for s in STAGES)
    monkeypatch.setattr(doctor, "STAGES", steps)


def test_a_step_that_writes_an_undeclared_field_fails(model_dir, tmp_path, monkeypatch):  # noqa: F811
    def also_writes(run):
        def step(ctx):
            run(ctx)
            ctx.res.prediction_note = "written where it is not declared"

        return step

    _replace(monkeypatch, "bench single", also_writes)
    with (
        SSEServer(Plan(itl_s=0.004, ttft_s=0.01)) as srv,
        pytest.raises(StageContractError, match=r"'bench single' writes res.prediction_note"),
    ):
        doctor.run(_cfg(srv.url, tmp_path / "out", model_path=str(model_dir)))


def test_a_step_that_mutates_or_reads_undeclared_fields_fails(model_dir, tmp_path, monkeypatch):  # noqa: F811
    def appends(run):
        def step(ctx):
            run(ctx)
            ctx.res.assumptions.append("appended in place")  # no setattr: the fingerprint sees it

        return step

    _replace(monkeypatch, "sanity", appends)
    with (
        SSEServer(Plan(itl_s=0.004, ttft_s=0.01)) as srv,
        pytest.raises(StageContractError, match=r"'sanity' writes res.assumptions"),
    ):
        doctor.run(_cfg(srv.url, tmp_path / "a", model_path=str(model_dir)))

    def reads(run):
        def step(ctx):
            assert isinstance(ctx.res, DoctorResult)
            _ = ctx.res.verdict, ctx.log_path
            run(ctx)

        return step

    monkeypatch.setattr(doctor, "STAGES", STAGES)
    _replace(monkeypatch, "sanity", reads)
    with (
        SSEServer(Plan(itl_s=0.004, ttft_s=0.01)) as srv,
        pytest.raises(StageContractError, match=r"'sanity' reads log_path, res.verdict"),
    ):
        doctor.run(_cfg(srv.url, tmp_path / "b", model_path=str(model_dir)))
