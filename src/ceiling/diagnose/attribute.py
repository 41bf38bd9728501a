"""Attribution: set the measured decode step time against the predicted components.

Why: "the ceiling is fundamental" is a claim, and the only way to check it is to put every
millisecond of the measured step next to what the hardware floors explain. Whatever the
predicted components do not explain is shown as its own line, named "kernel inefficiency / host
overhead" — never spread over the other components and never hidden. When the measurement is
*faster* than the prediction the remainder is negative and the report says the prediction
overestimates.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field

UNEXPLAINED_LABEL = "kernel inefficiency / host overhead"

Kind = Literal["fundamental", "configurable"]

# Which predicted components are hardware floors for the deployed layout (fundamental) and
# which shrink with settings (configurable: CUDA graphs remove launch cost, async scheduling and
# faster host paths remove host cost). These are the component names of predict's contract.
COMPONENT_KINDS: dict[str, Kind] = {
    "weights": "fundamental",
    "kv": "fundamental",
    "compute": "fundamental",
    "collectives": "fundamental",
    "launch": "configurable",
    "host": "configurable",
}

COMPONENT_NOTES: dict[str, str] = {
    "weights": "weight bytes read once per step at the achievable memory bandwidth",
    "kv": "KV-cache bytes read per step",
    "compute": "matrix math at peak throughput",
    "collectives": "allreduce / all-to-all latency for this layout",
    "launch": "fixed kernel costs and inefficiency vs the best known kernels",
    "host": "scheduler, sampling, Python",
}


class ComponentShare(BaseModel):
    """One predicted component and its share of the measured step."""

    name: str
    predicted_ms: float
    share_pct: float = Field(description="predicted_ms as a percentage of the measured step")
    kind: Kind
    note: str | None = None


class Attribution(BaseModel):
    """Measured step vs predicted components, with the unexplained remainder named."""

    measured_step_ms: float
    measured_step_ci_ms: tuple[float, float] | None = None
    batch: int = 1
    predicted_step_ms: float
    components: list[ComponentShare]
    unexplained_label: str = UNEXPLAINED_LABEL
    unexplained_ms: float = Field(
        description="measured - predicted (negative: prediction too high)"
    )
    unexplained_pct: float
    unexplained_note: str | None = None
    fundamental_ms: float
    configurable_ms: float
    explained_pct: float = Field(description="share of the measured step the components explain")
    bound_by: str
    basis: str = Field(description="where the predicted components come from")

    @property
    def unexplained_per_token_ms(self) -> float:
        """Unexplained time per generated token (a step yields ``batch`` tokens)."""
        return self.unexplained_ms / max(self.batch, 1)


def step_ms(tok_s: float) -> float:
    """Per-stream decode tok/s -> milliseconds per decode step."""
    if tok_s <= 0:
        raise ValueError("tok/s must be positive")
    return 1000.0 / tok_s


def step_ci_ms(low_tok_s: float | None, high_tok_s: float | None) -> tuple[float, float] | None:
    """A tok/s interval -> a step-time interval (bounds swap: faster = shorter)."""
    if not low_tok_s or not high_tok_s or low_tok_s <= 0 or high_tok_s <= 0:
        return None
    return (1000.0 / high_tok_s, 1000.0 / low_tok_s)


def attribute(
    measured_step_ms: float,
    components_ms: Mapping[str, float],
    *,
    basis: str,
    batch: int = 1,
    measured_ci_ms: tuple[float, float] | None = None,
    kinds: Mapping[str, Kind] | None = None,
    notes: Mapping[str, str] | None = None,
    unexplained_note: str | None = None,
) -> Attribution:
    """Split ``measured_step_ms`` into the predicted components and the named remainder.

    Components keep their predicted values (we do not rescale them to fit the measurement);
    the remainder absorbs the difference. Unknown component names count as fundamental only if
    ``kinds`` says so, otherwise configurable (the conservative side for "it is fundamental").
    """
    if measured_step_ms <= 0:
        raise ValueError("measured step time must be positive")
    kind_of: dict[str, Kind] = dict(COMPONENT_KINDS)
    note_of = {**COMPONENT_NOTES, **(notes or {})}
    for name, text in (kinds or {}).items():
        # predict says e.g. "fundamental (bandwidth x weight format)" or "configurable (enable
        # CUDA graphs)"; a text that is neither keeps our default kind and becomes the note.
        word = str(text).split(" ", 1)[0].strip().lower()
        if word in ("fundamental", "configurable"):
            kind_of[name] = word  # type: ignore[assignment]
        if str(text).strip() and str(text) not in ("fundamental", "configurable", "none"):
            note_of[name] = str(text)
    shares = [
        ComponentShare(
            name=name,
            predicted_ms=float(ms),
            share_pct=100.0 * float(ms) / measured_step_ms,
            kind=kind_of.get(name, "configurable"),
            note=note_of.get(name),
        )
        for name, ms in components_ms.items()
        if ms is not None
    ]
    predicted = sum(c.predicted_ms for c in shares)
    rest = measured_step_ms - predicted
    fundamental = sum(c.predicted_ms for c in shares if c.kind == "fundamental")
    configurable = sum(c.predicted_ms for c in shares if c.kind == "configurable")
    if unexplained_note is None and rest < 0:
        unexplained_note = (
            f"the measured step is {-rest:.3g} ms shorter than predicted: the prediction "
            "overestimates (check the hardware numbers it used)"
        )
    candidates = [(c.predicted_ms, c.name) for c in shares] + [(rest, UNEXPLAINED_LABEL)]
    bound_by = max(candidates)[1]
    return Attribution(
        measured_step_ms=measured_step_ms,
        measured_step_ci_ms=measured_ci_ms,
        batch=batch,
        predicted_step_ms=predicted,
        components=shares,
        unexplained_ms=rest,
        unexplained_pct=100.0 * rest / measured_step_ms,
        unexplained_note=unexplained_note,
        fundamental_ms=fundamental,
        configurable_ms=configurable,
        explained_pct=100.0 * min(predicted, measured_step_ms) / measured_step_ms,
        bound_by=bound_by,
        basis=basis,
    )


class LevelAttribution(BaseModel):
    """Attribution at one concurrency level: how the step divides among the batch."""

    concurrency: int
    measured_step_ms: float
    predicted_step_ms: float
    unexplained_ms: float
    unexplained_per_token_ms: float
    predicted_per_token_ms: float
    decode_tok_s_total: float = Field(
        description="decode rate summed over the streams: batch x 1000 / step ms, the batch "
        "being the engine's measured one where its counters say it ran fewer than the streams"
    )
    engine_batch: float | None = Field(
        None,
        description="sequences per engine step, from the engine's own counters (generated "
        "tokens / steps); None without them. Below the concurrency, the per-token and total "
        "figures use it: streams the engine did not run together share no step",
    )
    output_tok_s: float | None = Field(
        None, description="end-to-end output tok/s of the level (includes prefill and TTFT)"
    )
    completed: int | None = None
    failed: int = Field(
        0, description="requests that failed at this level: the level was not really served"
    )
    errors: dict[str, int] = Field(default_factory=dict, description="failures by kind")


def attribute_levels(
    levels: Sequence[tuple[int, float, Mapping[str, float], float | None]],
    outcomes: Sequence[Mapping[str, Any]] | None = None,
) -> list[LevelAttribution]:
    """Per concurrency level: (concurrency, measured step ms, components at that batch, tok/s),
    with each level's request outcomes (completed, failed, errors) beside it.

    A host-bound engine shows an unexplained time per *step* that stays roughly flat as the
    batch grows, so per *token* it falls: that is the signature the report points at. A level
    whose requests failed says nothing about batching: the verdict leaves it out of any gain.
    ``engine_batch`` in an outcome (the engine's measured sequences per step) replaces the
    concurrency as the batch when it is smaller: c streams the engine ran one at a time make
    one token per step, not c (the components should then be predicted at that batch too).
    """
    out = []
    for i, (conc, measured, comps, tok_s) in enumerate(levels):
        oc = outcomes[i] if outcomes and i < len(outcomes) else {}
        predicted = float(sum(v for v in comps.values() if v is not None))
        rest = measured - predicted
        eb = oc.get("engine_batch")
        engine_batch = float(eb) if eb is not None and eb > 0 else None
        b: float = max(int(conc), 1)
        if engine_batch is not None and engine_batch < b:
            b = max(engine_batch, 1.0)
        out.append(
            LevelAttribution(
                concurrency=max(int(conc), 1),
                measured_step_ms=measured,
                predicted_step_ms=predicted,
                unexplained_ms=rest,
                unexplained_per_token_ms=rest / b,
                predicted_per_token_ms=predicted / b,
                decode_tok_s_total=b * 1000.0 / measured,
                engine_batch=engine_batch,
                output_tok_s=tok_s,
                completed=oc.get("completed"),
                failed=int(oc.get("failed") or 0),
                errors=dict(oc.get("errors") or {}),
            )
        )
    return out
