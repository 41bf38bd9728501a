"""The verdict's nouns: every number a field, every sentence rendered from the numbers.

A verdict is what people act on, so each of its sentences (the headline, the notes, each
hypothesis's answer, each change's evidence, the target's text) is a ``computed_field`` of the
numbers it states (:class:`~ceiling.result_model.ResultModel`): the JSON carries the
sentences for its readers, tests and reports read the numbers, and the two can never disagree. ``verdict.py``
decides the numbers; this module only words them.

Wording: ``expected`` is what predict says this configuration delivers with this engine's
kernels (the software/config gap is measured vs expected); ``bound`` is the physical ceiling of
the layout (best kernels, best collective, no host time): expected vs bound is the part that
better kernels or engine settings could recover, and no setting of the layout beats the bound.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, computed_field, model_validator

from ceiling.diagnose.attribute import UNEXPLAINED_LABEL
from ceiling.diagnose.closed_loop import ClosedLoopCapacity
from ceiling.diagnose.hypotheses import Hypothesis
from ceiling.diagnose.wording import HardwareKind, num, us_or_ms
from ceiling.fmt import pct
from ceiling.gap_schema import BandwidthGap
from ceiling.result_model import ResultModel
from ceiling.trace.schema import MeasuredSplit

# ------------------------------------------------------------------------------ headline

COMPONENT_LABELS = {
    "weights": "memory-bandwidth-bound (weight reads)",
    "kv": "memory-bandwidth-bound (KV-cache reads)",
    "collectives": "collective-latency-bound",
    "launch": "kernel-launch-bound",
    "host": "host-bound",
    "compute": "compute-bound",
}


class Bottleneck(ResultModel):
    """What bounds the deployment, as numbers (the headline and ``bound_by`` render them).

    ``case``: ``measured`` (a trace of the engine's own kernels exists: its largest measured
    class, and the split of the traced step into its classes' bounds and the configurable rest),
    ``component`` (the largest predicted component), ``host-bound`` (the unexplained
    remainder is most of the step), ``overestimate`` (the step is much shorter than predicted),
    ``no-prediction``/``no-measurement``, or ``broken-output`` (the sanity gate stopped it).
    """

    case: Literal[
        "measured",
        "component",
        "host-bound",
        "overestimate",
        "no-prediction",
        "no-measurement",
        "broken-output",
    ]
    hardware_kind: HardwareKind = "gpu"
    step_ms: float | None = Field(None, description="measured decode step")
    predicted_step_ms: float | None = None
    floors_ms: float | None = Field(None, description="fundamental components, summed")
    component: str | None = Field(None, description="the largest predicted component")
    component_ms: float | None = None
    component_share_pct: float | None = Field(None, description="of the measured step")
    unexplained_pct: float | None = None
    measured_tok_s: float | None = None
    broken: str | None = Field(None, description="the sanity gate's finding (broken-output)")
    # overestimate: a source of the prediction's evidence the measured step contradicts
    evidence_source: str | None = Field(None, description="table | prior | profile | engine")
    evidence_excess_ms: float | None = Field(None, description="its ops' cost beyond the floors")
    slack_ms: float | None = Field(None, description="measured step minus the bound")
    evidence_op: str | None = Field(None, description="its op with the largest excess")
    evidence_op_ms: float | None = None
    # measured: the largest class's predict component, and the traced step's configurable part
    measured_component: str | None = None
    configurable_ms: float | None = None
    unbounded_ms: float | None = None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def label(self) -> str:
        if self.case == "measured":
            name = self.measured_component or "unknown"
            return "measured: " + COMPONENT_LABELS.get(name, f"bound by {self.component}")
        if self.case == "host-bound":
            return "host overhead" if self.hardware_kind == "cpu" else UNEXPLAINED_LABEL
        if self.case == "overestimate":
            return "prediction overestimates"
        if self.case == "component":
            name = self.component or "unknown"
            return COMPONENT_LABELS.get(name, f"bound by {name}")
        if self.case == "broken-output":
            return "broken output"
        return "unknown"

    @computed_field  # type: ignore[prop-decorator]
    @property
    def sentence(self) -> str:
        step = us_or_ms(self.step_ms or 0.0)
        if self.case == "no-measurement":
            return "No decode measurement: nothing to attribute."
        if self.case == "no-prediction":
            return (
                f"Measured {num(self.measured_tok_s or 0.0)} tok/s per stream; no prediction to "
                "set it against."
            )
        if self.case == "broken-output":
            return (
                f"Broken output: {(self.broken or '').removeprefix('broken: ')}. Not "
                "benchmarked: speed figures of a server that computes the wrong thing mean nothing."
            )
        if self.case == "measured":
            return (
                f"Measured inside the engine: {self.component} is "
                f"{us_or_ms(self.component_ms or 0.0)} of the {step} traced step "
                f"({pct(self.component_share_pct or 0.0)}). Of the step, "
                f"{us_or_ms(self.floors_ms or 0.0)} is the bound of its classes (fundamental), "
                f"{us_or_ms(self.configurable_ms or 0.0)} configurable"
                + (
                    f", {us_or_ms(self.unbounded_ms)} in classes predict has no bound for."
                    if self.unbounded_ms
                    else "."
                )
            )
        if self.case == "host-bound":
            what = (
                "host / launch-overhead-bound, not bandwidth-bound"
                if self.hardware_kind == "cpu"
                else "bound by kernel inefficiency / host overhead, not by the hardware floors"
            )
            return (
                f"{what[0].upper()}{what[1:]}: {pct(self.unexplained_pct or 0.0)} of the {step} "
                f"decode step is {UNEXPLAINED_LABEL}; the hardware floors (weights, KV, compute) "
                f"account for {us_or_ms(self.floors_ms or 0.0)}."
            )
        if self.case == "overestimate" and self.evidence_source:
            op = (
                f" (largest: {self.evidence_op}, {us_or_ms(self.evidence_op_ms or 0.0)})"
                if self.evidence_op
                else ""
            )
            return (
                f"Faster than predicted: the measured step takes {step} against a predicted "
                f"{us_or_ms(self.predicted_step_ms or 0.0)}; the prediction's "
                f"{self.evidence_source} evidence alone costs "
                f"{us_or_ms(self.evidence_excess_ms or 0.0)} beyond the hardware floors, more "
                f"than the {us_or_ms(self.slack_ms or 0.0)} the measured step leaves{op}: it does "
                "not describe the kernels this engine ran. Trust the measurement, not the "
                "prediction's split of it."
            )
        if self.case == "overestimate":
            return (
                f"Faster than predicted: the measured step takes {step} against a predicted "
                f"{us_or_ms(self.predicted_step_ms or 0.0)}; the largest predicted component, "
                f"{self.component} ({us_or_ms(self.component_ms or 0.0)}), is likely "
                "overestimated for this deployment: check the prediction's assumptions before "
                "trusting its split."
            )
        label = self.label
        head = (
            f"{label[0].upper()}{label[1:]}: {self.component} is "
            f"{pct(self.component_share_pct or 0.0)} of the {step} step; "
        )
        if (self.unexplained_pct or 0.0) < 0:
            # a step shorter than the predicted one leaves nothing unexplained: a negative
            # share of "inefficiency" reads as nonsense (seen on vLLM 0.25, an H200, priors)
            return head + (
                f"the step is {pct(-(self.unexplained_pct or 0.0))} shorter than the "
                f"prediction's {us_or_ms(self.predicted_step_ms or 0.0)}: the prediction "
                "overestimates it, nothing is left unexplained."
            )
        return head + f"{UNEXPLAINED_LABEL} is {pct(self.unexplained_pct or 0.0)}."


# ------------------------------------------------------------------------------ changes


class Change(ResultModel):
    """A configurable change with its expected (or measured) gain.

    ``kind``: ``what-if`` (predict's one-knob variant: ``predicted_tok_s`` is its expected rate
    and ``bound_tok_s`` its bound, against ``base_tok_s`` expected for this configuration),
    ``finding`` (the engine log's advice: ``quote`` is the finding in its own words), or
    ``measured`` (the concurrency sweep).
    """

    kind: Literal["what-if", "finding", "measured"]
    change: str
    source: str
    predicted_gain_pct: float | None = None
    predicted_tok_s: float | None = None
    base_tok_s: float | None = None
    bound_tok_s: float | None = None
    from_concurrency: int | None = None
    to_concurrency: int | None = None
    from_tok_s: float | None = None
    quote: str | None = None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def evidence(self) -> str | None:
        if self.kind == "finding":
            return self.quote
        if self.kind == "measured":
            return (
                f"decode tok/s summed over streams: {self.from_tok_s or 0.0:.4g} at "
                f"{self.from_concurrency}, {self.predicted_tok_s or 0.0:.4g} at "
                f"{self.to_concurrency}"
            )
        if self.base_tok_s is None or self.predicted_tok_s is None:
            return None
        bound = f" (bound {num(self.bound_tok_s)})" if self.bound_tok_s else ""
        return (
            f"expected {num(self.predicted_tok_s)} tok/s{bound} vs {num(self.base_tok_s)} "
            "expected for this configuration"
        )


class BestConfig(ResultModel):
    """The configuration predict expects to be fastest on this hardware (one knob changed)."""

    change: str
    tok_s: float = Field(description="its expected decode tok/s per stream")


# ------------------------------------------------------------------------------ target


class TargetCheck(ResultModel):
    """The measured rate against the user's target, and what could reach the target."""

    target_tok_s: float
    measured_tok_s: float
    ci_low: float | None = None
    ci_high: float | None = None
    expected_tok_s: float | None = None
    bound_tok_s: float | None = None
    best_change: str | None = Field(None, description="a change expected to reach the target")
    best_tok_s: float | None = None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def met(self) -> bool:
        return self.measured_tok_s >= self.target_tok_s

    @computed_field  # type: ignore[prop-decorator]
    @property
    def margin_pct(self) -> float:
        return 100.0 * (self.measured_tok_s / self.target_tok_s - 1.0)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def reachable_in_layout(self) -> bool | None:
        """False: the layout's bound is below the target (no setting of it reaches it)."""
        return None if self.bound_tok_s is None else self.bound_tok_s >= self.target_tok_s

    @computed_field  # type: ignore[prop-decorator]
    @property
    def text(self) -> str:
        t, m = self.target_tok_s, self.margin_pct
        text = f"met by {pct(m, signed=True)}" if self.met else f"missed by {pct(-m)}"
        if self.ci_low is not None and self.ci_high is not None:
            if self.met and self.ci_low < t:
                text += " (on the mean only: the 95 % CI reaches below the target)"
            elif not self.met and self.ci_high >= t:
                text += " (on the mean; the 95 % CI reaches the target)"
        if self.met:
            return text
        if self.expected_tok_s is not None:
            text += f"; this configuration is expected to reach {num(self.expected_tok_s)} tok/s"
        if self.reachable_in_layout is False:
            text += (
                f"; its bound is {num(self.bound_tok_s or 0.0)} tok/s, below the target: no "
                "setting of this layout reaches it"
            )
        elif (
            self.reachable_in_layout and self.expected_tok_s is not None and self.expected_tok_s < t
        ):
            text += (
                f"; its bound is {num(self.bound_tok_s or 0.0)} tok/s: only kernels or engine "
                "settings better than this engine's defaults reach the target"
            )
        if self.best_change and self.best_tok_s is not None:
            text += f"; {self.best_change} is expected to reach {self.best_tok_s:.4g} tok/s"
        return text


# ------------------------------------------------------------------------------ the verdict


class Gap(ResultModel):
    """The measured step split: fundamental / configurable / unexplained.

    From the engine's own accounting where there is one: a trace (``Verdict.measured``), else
    the engine's bandwidth split of the step (``bandwidth``: its parts by who can change them,
    summed into the three), else the predicted components (the attribution)."""

    fundamental_ms: float
    configurable_ms: float
    unexplained_ms: float
    measured_ms: float
    bandwidth: BandwidthGap | None = Field(
        None, description="the engine's split of a one-stream step: bandwidth reached, parts"
    )

    @classmethod
    def of_bandwidth(cls, split: BandwidthGap) -> Gap:
        """The engine's bandwidth split as the verdict's gap: its parts summed by kind."""
        return cls(
            fundamental_ms=split.kind_ms("fundamental"),
            configurable_ms=split.kind_ms("configurable"),
            unexplained_ms=split.kind_ms("unexplained"),
            measured_ms=split.step_ms,
            bandwidth=split,
        )


class CpuReadNote(ResultModel):
    """The CPU numbers that decide a host-bound verdict: the weight read against the step."""

    weight_bytes: int
    mem_bw_GBps: float
    step_ms: float
    llc_bytes: int | None = None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def read_ms(self) -> float:
        return self.weight_bytes / (self.mem_bw_GBps * 1e9) * 1e3

    @computed_field  # type: ignore[prop-decorator]
    @property
    def fits_in_cache(self) -> bool:
        return self.llc_bytes is not None and self.weight_bytes < self.llc_bytes

    def sentence(self) -> str:
        return (
            f"The numbers that decide it: reading {self.weight_bytes / 1e6:.3g} MB of weights "
            f"at this CPU's {self.mem_bw_GBps:.3g} GB/s takes {self.read_ms * 1000:.3g} us, "
            f"while a measured decode step takes {self.step_ms:.3g} ms "
            f"({self.step_ms / self.read_ms:.0f}x longer): the time goes to the framework "
            "(Python, scheduling, per-operator dispatch), not to memory traffic."
            + (
                f" The weights even fit in this CPU's {(self.llc_bytes or 0) / 2**20:.0f} MiB "
                "last-level cache, so the DRAM-speed figure is an upper bound of the read time."
                if self.fits_in_cache
                else ""
            )
        )


class Verdict(ResultModel):
    """What the deployment does, what it is expected to do, its bound, and where the gap goes.

    ``predicted_tok_s`` is the *expected* rate of this configuration (predict's top-level
    figure; None on a CPU, where only floors are predicted), ``bound_tok_s`` the layout's
    physical ceiling. ``pct_of_predicted`` = measured / expected (the software and
    configuration gap to explain), ``expected_pct_of_bound`` = expected / bound (what better
    kernels or engine settings could recover).
    """

    bottleneck: Bottleneck
    measured_tok_s: float | None = None
    measured_ci_low: float | None = None
    measured_ci_high: float | None = None
    predicted_tok_s: float | None = Field(None, description="expected for this configuration")
    bound_tok_s: float | None = Field(None, description="the layout's bound")
    prediction_note: str | None = None
    pct_of_predicted: float | None = Field(None, description="measured / expected, %")
    pct_of_bound: float | None = Field(None, description="measured / bound, %")
    expected_pct_of_bound: float | None = Field(None, description="expected / bound, %")
    best_config: BestConfig | None = None
    gap: Gap | None = None
    changes: list[Change] = Field(default_factory=list)
    hypotheses: list[Hypothesis] = Field(default_factory=list)
    target: TargetCheck | None = None
    server_death: str | None = Field(None, description="when and how the server died")
    cpu_read: CpuReadNote | None = None
    measured: MeasuredSplit | None = Field(
        None, description="the engine's own split of the step (a trace), class by class"
    )
    capacity: ClosedLoopCapacity | None = Field(
        None, description="--slo: the highest concurrency level whose goodput met the SLOs"
    )

    @model_validator(mode="before")
    @classmethod
    def _bandwidth_into_gap(cls, data: Any) -> Any:
        """A doctor.json written before the bandwidth split was the gap's (``ceiling report``
        re-renders kept files) has it as ``verdict.llamacpp``: the split moves into ``gap``, with
        the names only llama-server and llama-bench then had."""
        if not isinstance(data, dict) or "llamacpp" not in data:
            return data
        data = dict(data)
        old = data.pop("llamacpp")
        if old is None:
            return data
        old = {"engine": "llama.cpp", **old}
        if old.get("server"):
            old["server"] = {"server": "llama-server", "bench": "llama-bench", **old["server"]}
        split = BandwidthGap.model_validate(old)
        gap = data.get("gap") or Gap.of_bandwidth(split).model_dump()
        data["gap"] = {**gap, "bandwidth": split}
        return data

    @computed_field  # type: ignore[prop-decorator]
    @property
    def headline(self) -> str:
        return self.bottleneck.sentence

    @computed_field  # type: ignore[prop-decorator]
    @property
    def bound_by(self) -> str:
        return self.bottleneck.label

    @computed_field  # type: ignore[prop-decorator]
    @property
    def notes(self) -> list[str]:
        out = []
        if self.server_death:
            out.append(
                f"The server died {self.server_death}; the verdict uses what was measured before."
            )
        if self.bottleneck.case == "broken-output":
            out.append(
                "Fix the deployment first (config, weights and tokenizer against the "
                "checkpoint's); the sanity checks below say what was wrong."
            )
        if self.measured is not None:
            out.append(self.measured.allreduce_sentence())
            out.extend(self.measured.notes)
        if self.cpu_read is not None:
            out.append(self.cpu_read.sentence())
        if self.pct_of_predicted is not None:
            out.append(
                f"Measured rate is {pct(self.pct_of_predicted)} of the rate expected for this "
                "configuration (this engine's kernels): the rest is the software and "
                "configuration gap to explain."
            )
        if self.expected_pct_of_bound is not None and self.bound_tok_s is not None:
            out.append(
                f"The expected rate is {pct(self.expected_pct_of_bound)} of this layout's bound "
                f"({num(self.bound_tok_s)} tok/s: best kernels, best collective, no host time); "
                "the difference is what better kernels or engine settings could recover."
            )
        elif self.pct_of_bound is not None and self.bound_tok_s is not None:
            out.append(
                f"Measured rate is {pct(self.pct_of_bound)} of the hardware floors' bound "
                f"({num(self.bound_tok_s)} tok/s)."
            )
        if self.capacity is not None:
            out.append(self.capacity.sentence)
        return out
