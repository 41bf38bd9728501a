"""The nouns of ``ceiling.trace``: a rank's trace as read, and the measured split of its steps.

Times inside a :class:`RankTrace` are the trace's own microseconds (``ts_us``, ``dur_us``);
everything in a :class:`TraceSplit` is milliseconds per step (mean over the steps counted).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, computed_field

SCHEMA_VERSION = 1

EventKind = Literal["kernel", "memcpy", "memset", "cpu_op"]


class KernelEvent(BaseModel):
    """One GPU activity (kernel, memcpy, memset) or, in a CPU trace, one top-level operator."""

    name: str
    ts_us: float
    dur_us: float
    kind: EventKind = "kernel"
    stream: int = Field(0, description="CUDA stream (GPU) or thread id (CPU operators)")
    device: int = Field(0, description="GPU index (one process may drive several)")
    correlation: int | None = Field(None, description="links a kernel to its launch")
    launch_ts_us: float | None = Field(
        None, description="when the host launched it (the runtime call's start), if recorded"
    )

    @property
    def end_us(self) -> float:
        return self.ts_us + self.dur_us


class Annotation(BaseModel):
    """A profiler annotation (``record_function``/``ProfilerStep#N``) on the host timeline."""

    name: str
    ts_us: float
    dur_us: float
    thread: int = 0


class RankTrace(BaseModel):
    """One rank's trace: its GPU activities, or its top-level CPU operators on a CPU trace."""

    schema_version: int = SCHEMA_VERSION
    path: str
    rank: int | None = Field(None, description="distributedInfo.rank, else from the file name")
    world_size: int | None = None
    device: Literal["gpu", "cpu"] = "gpu"
    engine_hint: str | None = Field(None, description="engine named by the trace (vllm_version)")
    engine_version: str | None = None
    events: list[KernelEvent] = Field(default_factory=list, description="sorted by start")
    annotations: list[Annotation] = Field(default_factory=list, description="sorted by start")
    ops_thread: int | None = Field(None, description="CPU trace: the thread whose ops are read")
    nested_ops_skipped: int = Field(0, description="CPU trace: operators inside another one")
    notes: list[str] = Field(default_factory=list)


class ClassTime(BaseModel):
    """One op class of the step: wall time it holds per step (overlap counted once)."""

    op_class: str
    ms: float = Field(description="per step, mean over the steps counted")
    calls: float = Field(description="kernels (or operators) per step")
    share: float = Field(description="of the measured step")
    impl: list[str] = Field(default_factory=list, description="implementations seen")
    predict_ops: list[str] = Field(default_factory=list, description="predict's ops it measures")
    transfer_ms: float | None = Field(
        None, description="collectives on several ranks: time moving data (the shortest rank's)"
    )
    wait_ms: float | None = Field(
        None, description="collectives on several ranks: time waiting for the slowest rank"
    )


class KernelStat(BaseModel):
    name: str
    op_class: str
    impl: str = ""
    ms: float = Field(description="per step (wall time held, overlap counted once)")
    calls: float = Field(description="per step")
    mean_us: float = Field(description="mean duration of one call (own duration)")


class Unmatched(BaseModel):
    name: str
    ms: float = Field(description="per step")
    count: float = Field(description="per step")


class OverlapNote(BaseModel):
    """Time of a side stream that ran while the main stream was busy: counted once (in the
    main stream's class); what overlapped is named here."""

    stream: int
    op_class: str
    hidden_ms: float = Field(description="per step, hidden behind the main stream")
    own_ms: float = Field(description="per step, the side stream's kernels' own time")
    top_kernels: list[str] = Field(default_factory=list)


class CollectiveWait(BaseModel):
    """One collective class across the ranks, per step: the data's own transfer time (the
    shortest rank's duration of each call) and the time ranks waited for the slowest one."""

    op_class: str
    transfer_ms: float
    wait_ms_mean: float = Field(description="mean over ranks")
    wait_ms_max: float = Field(description="the rank that waited longest")
    most_waiting_rank: int | None = None


class StepTime(BaseModel):
    index: int
    start_us: float
    ms: float
    busy_ms: float
    idle_ms: float
    label: str = ""


class RankSplit(BaseModel):
    """One rank's split (the same accounting as the headline, for this rank alone)."""

    rank: int | None
    path: str
    device: Literal["gpu", "cpu"]
    step_ms: float
    idle_ms: float
    steps: int
    classes: dict[str, float] = Field(description="op class -> ms per step")
    collective_wait_ms: float | None = None


class TraceSplit(BaseModel):
    """The measured decode step of a trace, by op class: per step, classes + idle == step.

    With several ranks the headline is the slowest rank's (the step waits for it); per-rank
    splits, their spread and the time collectives spent waiting for the slowest rank follow.
    """

    schema_version: int = SCHEMA_VERSION
    engine: str | None = None
    engine_version: str | None = None
    device: Literal["gpu", "cpu"] = "gpu"
    step_source: str = Field(description="how steps were found: annotation name, or periodic")
    steps: int = Field(description="steps counted")
    steps_skipped: dict[str, int] = Field(
        default_factory=dict, description="why steps were left out (partial, prefill, ...)"
    )
    batch: int | None = Field(None, description="sequences per step (the engine's annotation)")
    context: int | None = Field(None, description="mean context per sequence, if annotated")
    step_ms: float = Field(description="measured step, mean over the steps counted")
    step_ms_median: float = 0.0
    step_ms_min: float = 0.0
    step_ms_max: float = 0.0
    busy_ms: float = Field(description="wall time with at least one kernel running, per step")
    idle_ms: float = Field(description="GPU idle inside the step: host/launch overhead class")
    classes: list[ClassTime] = Field(description="largest first; sums with idle to the step")
    coverage: float = Field(description="classified share of kernel time (1 - unmatched)")
    unmatched: list[Unmatched] = Field(default_factory=list)
    top_kernels: list[KernelStat] = Field(default_factory=list)
    overlap: list[OverlapNote] = Field(default_factory=list)
    per_step: list[StepTime] = Field(default_factory=list, description="the headline rank's")
    gemm_calls_ms: list[float] = Field(
        default_factory=list,
        description="the main stream's GEMM calls in step order, mean ms (empty when steps "
        "differ): trace.roles reads layer roles from their positions",
    )
    ranks: list[RankSplit] = Field(default_factory=list)
    slowest_rank: int | None = None
    rank_spread_pct: float | None = Field(
        None, description="(slowest - fastest) / fastest mean step, percent"
    )
    missing_ranks: list[int] = Field(default_factory=list)
    collective_waits: list[CollectiveWait] = Field(
        default_factory=list, description="several ranks: transfer vs waiting, per collective"
    )
    notes: list[str] = Field(default_factory=list)

    def class_ms(self, op_class: str) -> float:
        return next((c.ms for c in self.classes if c.op_class == op_class), 0.0)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def headline(self) -> str:
        """One sentence: the step, its coverage, the largest class and, across ranks, each
        collective's share of the step and its time waiting for the slowest rank."""
        top = self.classes[0] if self.classes else None
        what = f"; largest: {top.op_class} {top.ms:.3f} ms ({top.share * 100:.0f} %)" if top else ""
        ranks = (
            f", slowest of {len(self.ranks)} ranks: {self.slowest_rank}"
            if len(self.ranks) > 1
            else ""
        )
        waits = ""
        for w in self.collective_waits:
            mean_ms = w.transfer_ms + w.wait_ms_mean  # what a rank spends in it, on average
            if not self.step_ms:
                continue
            waits += (
                f"; {w.op_class}: {mean_ms:.3f} ms of the {self.step_ms:.3f} ms step "
                f"({mean_ms / self.step_ms * 100:.0f} %), of which {w.wait_ms_mean:.3f} ms "
                f"waiting for the slowest rank (up to {w.wait_ms_max:.3f} ms on rank "
                f"{w.most_waiting_rank})"
            )
        return (
            f"measured step {self.step_ms:.3f} ms ({self.steps} steps, {self.device}{ranks}): "
            f"kernels {self.busy_ms:.3f} ms, idle {self.idle_ms:.3f} ms; "
            f"{self.coverage * 100:.1f} % classified{what}{waits}"
        )


class ClassRow(BaseModel):
    """One measured class (or classes sharing predict ops) against predict's same ops."""

    op_class: str
    measured_ms: float
    share_pct: float = Field(description="of the measured step")
    component: str | None = Field(None, description="predict's step component it belongs to")
    predict_ops: list[str] = Field(default_factory=list)
    expected_ms: float | None = Field(None, description="predict's expected, same ops")
    bound_ms: float | None = Field(None, description="predict's bound, same ops")
    fundamental_ms: float | None = Field(None, description="the bound (or less, if measured)")
    gap_ms: float | None = Field(None, description="measured - bound: the configurable part")
    transfer_ms: float | None = None
    wait_ms: float | None = Field(None, description="collectives: waiting for the slowest rank")


class MeasuredSplit(BaseModel):
    """The measured step by class, with the fundamental/configurable split it supports."""

    source: str = "trace"
    label: str = Field("single", description="the window it was recorded in")
    files: list[str] = Field(default_factory=list)
    device: str = "gpu"
    steps: int
    step_ms: float = Field(description="measured step (the slowest rank's)")
    idle_ms: float
    coverage: float
    rows: list[ClassRow] = Field(description="largest first; they sum to the step")
    fundamental_ms: float
    configurable_ms: float
    unbounded_ms: float = Field(description="measured in classes predict has no bound for")
    unseen_ops: list[str] = Field(
        default_factory=list, description="predicted ops (> 0 ms) no class of the trace measured"
    )
    unseen_expected_ms: float = Field(0.0, description="predict's expected for unseen_ops")
    unseen_bound_ms: float = Field(0.0, description="predict's bound for unseen_ops")
    ranks: int = 1
    slowest_rank: int | None = None
    rank_spread_pct: float | None = None
    missing_ranks: list[int] = Field(default_factory=list)
    allreduce_ms: float = 0.0
    allreduce_wait_ms: float | None = None
    notes: list[str] = Field(default_factory=list)

    def largest(self) -> ClassRow | None:
        return max(self.rows, key=lambda r: r.measured_ms, default=None)

    def allreduce_sentence(self) -> str:
        """The founding question, answered from the trace."""
        if self.allreduce_ms <= 0:
            why = "one rank" if self.ranks <= 1 else f"{self.ranks} ranks"
            return f"allreduce: none in the measured {self.step_ms:.3g} ms step ({why})."
        pct = self.allreduce_ms / self.step_ms * 100 if self.step_ms else 0.0
        head = (
            f"allreduce: {self.allreduce_ms:.3g} ms of the {self.step_ms:.3g} ms step ({pct:.3g} %)"
        )
        if self.allreduce_wait_ms is None:
            return head + "; waiting for the slowest rank needs every rank's trace."
        return head + f", of which {self.allreduce_wait_ms:.3g} ms is waiting for the slowest rank."

    def sentence(self) -> str:
        top = self.largest()
        if top is None:
            return f"Measured inside the engine: a {self.step_ms:.3g} ms step."
        return (
            f"Measured inside the engine ({self.steps} steps, {self.coverage * 100:.3g} % of "
            f"operator time classified): {top.op_class} is {top.measured_ms:.3g} ms of the "
            f"{self.step_ms:.3g} ms step ({top.share_pct:.3g} %); {self.fundamental_ms:.3g} ms is "
            f"the bound of its classes (fundamental), {self.configurable_ms:.3g} ms configurable"
            + (f", {self.unbounded_ms:.3g} ms without a bound" if self.unbounded_ms > 0 else "")
            + "."
        )


class TraceReport(BaseModel):
    """What ``ceiling trace FILE...`` returns: the split, and beside a prediction when one was
    asked for; the files it wrote."""

    schema_version: int = SCHEMA_VERSION
    files: list[str]
    label: str = Field("", description="the window (doctor: single, concurrency N)")
    split: TraceSplit
    prediction: str | None = Field(None, description="the setup predicted, one line")
    predicted_step_ms: float | None = None
    bound_step_ms: float | None = None
    measured: MeasuredSplit | None = Field(
        None, description="the split beside the prediction, class by class (with one)"
    )
    out: str | None = None
    profile_out: str | None = None
    report: str | None = None


#: a capture file's own version (it was capture.py's SCHEMA_VERSION; both are 1 today)
CAPTURE_SCHEMA_VERSION = 1


class TraceCapture(BaseModel):
    """One recorded window: what was asked, what the engine wrote, and its measured split."""

    schema_version: int = CAPTURE_SCHEMA_VERSION
    url: str
    engine: str
    engine_version: str | None = None
    label: str = Field("single", description="which stage recorded it (single, concurrency N)")
    streams: int = 1
    steps_asked: int
    recorded: bool = False
    why_not: str | None = Field(None, description="not recorded: why, and how to turn it on")
    files: list[str] = Field(default_factory=list, description="one per rank")
    start_call_s: float | None = Field(None, description="how long the start call took")
    stop_call_s: float | None = None
    wall_s: float = Field(0.0, description="the whole window: streams up to files read")
    window_epoch_s: list[float] | None = Field(
        None, description="the counted steps' span (wall clock, epoch seconds)"
    )
    stream_itl_ms: float | None = Field(
        None, description="mean gap between the streams' tokens inside the counted steps' span"
    )
    stream_gaps: int = Field(0, description="token gaps that mean is taken over")
    step_vs_stream_pct: float | None = Field(
        None, description="(trace step - stream ITL) / stream ITL, percent"
    )
    engine_itl_ms: float | None = Field(
        None,
        description="the engine's own mean inter-token latency (/metrics, engine-core "
        "timestamps) over the middle of the window",
    )
    engine_itl_count: int = Field(0, description="observations that mean is over")
    engine_itl_span_s: list[float] | None = Field(
        None, description="when the two scrapes were taken (wall clock, epoch seconds)"
    )
    engine_itl_steps: list[int] | None = Field(
        None,
        description="the recorded steps (0 = the window's first) whose tokens the server "
        "counted between the two scrapes, from its own token count (a window armed by step "
        "count only); these steps are compared, not those that ran between the scrape times",
    )
    trace_step_in_span_ms: float | None = Field(
        None, description="the trace's mean step over the steps that began between the scrapes"
    )
    step_vs_engine_pct: float | None = Field(
        None, description="(trace step - engine ITL) / engine ITL, percent"
    )
    split: TraceSplit | None = None
    streams_ended_early: bool = Field(
        False, description="the generations ended before the window's steps were recorded"
    )
    attempts: int = Field(1, description="windows recorded to get this one")
    notes: list[str] = Field(default_factory=list)
