"""The doctor's nouns: its options (``DoctorConfig``) and its result document (``DoctorResult``).

Their own module so that the flow (``doctor.py``), the expectation (``expect.py``), the
judgement (``judge.py``) and the report (``ceiling.report``) name them without importing each
other. ``DoctorResult`` is built from the nouns of the stages it ran — predict's
``Prediction``, bench's ``RunResult``, the log's ``EngineFacts`` and ``Finding``s, the
``Attribution``, the ``Verdict``, the sanity gate's ``SanityReport`` — and is read back from
``doctor.json`` strictly: a key it does not know is an error, so a schema drift fails loudly.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_serializer, model_validator

from ceiling.bench.config import MAX_CONCURRENCY, MAX_COUNT, MAX_SECONDS, MAX_SEQ_TOKENS
from ceiling.bench.failures import MAX_FAILED_PCT
from ceiling.bench.results import RunResult
from ceiling.bench.slo import Slo
from ceiling.diagnose.attribute import Attribution, LevelAttribution
from ceiling.diagnose.facts import EngineFacts
from ceiling.diagnose.finding_types import Finding
from ceiling.diagnose.verdict_model import Verdict
from ceiling.engines.preflight_model import PreflightReport
from ceiling.predict.schema import Prediction
from ceiling.probe.telemetry_model import TelemetrySeries
from ceiling.result_model import ResultModel
from ceiling.sanity.report import SanityReport
from ceiling.spec.hardware import Hardware
from ceiling.trace.schema import TraceCapture

SCHEMA_VERSION = 1
FLAG_HYPOTHESES = ("--num-scheduler-steps",)


class DoctorConfig(BaseModel):
    """Options of one doctor run (see docs/doctor.md)."""

    model_config = ConfigDict(extra="forbid")

    url: str | None = None
    variant: str | None = None
    log: str | None = None
    model_path: str | None = Field(None, description="model dir / config.json / catalog name")
    served_model: str | None = Field(None, description="served model name (default: the first)")
    engine: str | None = None
    gpu: str | None = Field(None, description="catalog GPU name (default: probed)")
    tp: int | None = Field(None, ge=1)
    cuda_graphs: bool | None = Field(
        None, description="None: from the variant's flags or the engine log, else assumed on"
    )
    max_tokens: int = Field(512, ge=1, le=MAX_SEQ_TOKENS)
    input_len: int = Field(64, ge=1, le=MAX_SEQ_TOKENS)
    repeat: int = Field(3, ge=1, le=MAX_COUNT)
    warmup: int = Field(1, ge=0, le=MAX_COUNT)
    concurrency: list[Annotated[int, Field(ge=1, le=MAX_CONCURRENCY)]] = Field(
        default_factory=lambda: [1, 2, 4]
    )
    concurrency_max_tokens: int = Field(128, ge=1, le=MAX_SEQ_TOKENS)
    concurrency_requests: int | None = Field(None, ge=1, le=MAX_COUNT)
    max_failed_pct: float = Field(MAX_FAILED_PCT, ge=0, le=100, allow_inf_nan=False)
    # a stream silent this long ends the stage with a statement (not the request timeout)
    stall_timeout_s: float = Field(60.0, gt=0, le=86400, allow_inf_nan=False)
    target_tok_s: float | None = Field(None, gt=0, allow_inf_nan=False)
    slo: list[Slo] = Field(
        default_factory=list,
        description="--slo: judged on the concurrency sweep's levels (the verdict's capacity line)",
    )
    telemetry: bool = True
    measure_cpu: bool = True
    launch_timeout_s: float = Field(1800.0, gt=0, le=MAX_SECONDS, allow_inf_nan=False)
    out_dir: str = "ceiling-out"
    flag_hypotheses: list[str] = Field(default_factory=lambda: list(FLAG_HYPOTHESES))
    sanity: bool = Field(True, description="gate on `ceiling sanity` before any measurement")
    trace: bool = Field(
        False, description="record the engine's own kernels (its profiler) in windows apart"
    )
    trace_steps: int = Field(32, ge=2, le=1000, description="decode steps per traced window")
    accept_broken_output: str | None = Field(
        None,
        min_length=1,
        description="why the doctor may measure a server the sanity gate calls broken (a random-"
        "weight model, say); the gate still runs and the report records its verdict and this",
    )
    llama_bench: str | None = Field(
        None, description="llama-bench JSON of the served GGUF: the server's own cost per token"
    )
    profile: str | None = Field(
        None,
        description="a profile file (calibrate/commbench --out): its hardware part feeds the "
        "expectation, its engine.llamacpp entry the llama-server split (the GPU's best mat-vec)",
    )
    progress: bool = True

    @model_validator(mode="before")
    @classmethod
    def _old_profile_field(cls, data: Any) -> Any:
        """A doctor.json written before the one --profile (issue 40) names it llamacpp_profile:
        it still reads, as the same file under the one name."""
        if isinstance(data, dict) and "llamacpp_profile" in data:
            data = dict(data)
            old = data.pop("llamacpp_profile")
            data.setdefault("profile", old)
        return data

    @property
    def single_context(self) -> int:
        """Mean decode context of the single-stream bench: the prompt + half the output."""
        return self.input_len + self.max_tokens // 2

    @property
    def concurrency_context(self) -> int:
        """Mean decode context of the concurrency sweep."""
        return self.input_len + self.concurrency_max_tokens // 2


class Stage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    status: Literal["ok", "failed", "skipped", "interrupted"] = "ok"
    seconds: float = 0.0
    message: str | None = None


class Target(BaseModel):
    """The server examined: where, what it serves, whether doctor launched it."""

    model_config = ConfigDict(extra="forbid")

    url: str | None = None
    model: str | None = None
    variant: str | None = None
    log_path: str | None = None
    launched: bool = False
    engine: str | None = None


class ModelInfo(BaseModel):
    """The served model and the files its numbers were read from."""

    model_config = ConfigDict(extra="forbid")

    name: str | None
    path: str
    summary: str
    # the footprint the floors were computed from (a CPU doctor's `model` block, as before the
    # typed result; None where the prediction does not report it)
    weight_bytes: int | None = None
    params: int | None = None
    layers: int | None = None
    hidden_size: int | None = None
    kv_bytes_per_token: int | None = None
    dtype: str | None = None
    source: str | None = None


class Measured(BaseModel):
    """The decode step as measured, and where the number comes from."""

    model_config = ConfigDict(extra="forbid")

    step_ms: float
    step_ci_ms: tuple[float, float] | None = None
    tok_s: float
    tok_s_ci: tuple[float, float] | None = None
    source: str


class Preflight(PreflightReport, ResultModel):
    """preflight's report as the doctor keeps it: read back strictly (its computed ``ok`` is
    recomputed, not read)."""


class Telemetry(TelemetrySeries):
    """probe's series during the single-stream bench, with its summary (``summary`` in JSON)."""

    model_config = ConfigDict(
        extra="forbid", serialize_by_alias=True, validate_by_name=True, validate_by_alias=True
    )

    overview: dict[str, Any] = Field(
        default_factory=dict, alias="summary", description="TelemetrySeries.summary() of the run"
    )


BenchMode = Literal["single", "concurrency"]


class TracedOp(BaseModel):
    """One of predict's ops before and after the doctor's own trace fed it (``--trace``)."""

    name: str
    source_before: str
    ms_before: float
    source: str = Field(description="its evidence now: 'trace', or the one it kept")
    ms: float


class TraceEvidence(BaseModel):
    """The single-stream window's split as predict evidence on this box: the profile written
    (``trace-profile.json``) and which ops it timed; the rest kept their previous evidence."""

    profile: str = Field(description="the profile file (HardwareProfile with trace_ops)")
    from_trace: list[str] = Field(default_factory=list, description="ops now timed by the trace")
    kept: list[str] = Field(default_factory=list, description="ops that kept their evidence")
    ops: list[TracedOp] = Field(default_factory=list)
    step_ms_before: float | None = Field(None, description="expected step before the trace")
    step_ms: float | None = Field(None, description="expected step with the trace's ops")
    notes: list[str] = Field(default_factory=list, description="entries used or not, and why")


class DoctorResult(BaseModel):
    """The doctor's result document (``doctor.json``); the report renders from it alone."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = SCHEMA_VERSION
    kind: Literal["doctor"] = "doctor"
    title: str = "ceiling doctor"
    created: str = Field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    config: DoctorConfig = Field(default_factory=DoctorConfig)
    target: Target = Field(default_factory=Target)
    hardware: Hardware | None = None
    model: ModelInfo | None = None
    prediction: Prediction | None = None
    prediction_note: str | None = None
    preflight: Preflight | None = None
    flag_checks: dict[str, str | None] = Field(default_factory=dict)
    sanity: SanityReport | None = Field(None, description="the sanity gate's report")
    sanity_override: str | None = Field(
        None, description="the reason given to measure past a broken sanity verdict, if one was"
    )
    bench: dict[BenchMode, RunResult] = Field(default_factory=dict)
    telemetry: Telemetry | None = Field(
        None, description="probe's TelemetrySeries during the single-stream bench (+ summary)"
    )
    facts: EngineFacts | None = None
    findings: list[Finding] = Field(default_factory=list)
    measured: Measured | None = Field(
        None, description="the decode step used for the attribution and its source"
    )
    attribution: Attribution | None = None
    levels: list[LevelAttribution] = Field(default_factory=list)
    traces: list[TraceCapture] = Field(
        default_factory=list, description="--trace: the windows recorded (single, each level)"
    )
    trace_evidence: TraceEvidence | None = Field(
        None, description="--trace: the single-stream window fed to predict (its what-ifs)"
    )
    model_prediction: Prediction | None = Field(
        None,
        description="--trace: the prediction from predict's own evidence, before the trace fed "
        "it: the measured split's expected column (``prediction`` then holds the trace-fed one)",
    )
    verdict: Verdict | None = None
    stages: list[Stage] = Field(default_factory=list)
    server_died: bool = False
    server_death: str | None = None
    interrupted: bool = Field(False, description="Ctrl-C/SIGTERM stopped the run: partial")
    assumptions: list[str] = Field(default_factory=list)
    reproduce: list[str] = Field(default_factory=list)
    files: dict[str, str] = Field(default_factory=dict)

    @field_serializer("facts")
    def _facts_without_findings(self, facts: EngineFacts | None) -> dict[str, Any] | None:
        # the findings are the document's own ``findings`` (with the run's findings added)
        return None if facts is None else facts.model_dump(mode="json", exclude={"findings"})
