"""Early stop: stop spending repeats on a variant that cannot significantly beat the baseline.

Why: each repeat of a large deployment costs minutes, and the usual outcome of a tuning variant
is "no difference" (81.9 vs 81.4 tok/s). After ``min_repeats`` we compute Welch's 95 % interval
of the gain over the baseline; once its *upper* bound is below ``min_gain_pct``, more repeats
can only narrow an interval that already excludes a worthwhile gain, so we stop. A variant that
might still win keeps running to the planned number of repeats.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel

from ceiling.bench.stats import welch
from ceiling.sweep.plan import EarlyStop


class Decision(BaseModel):
    stop: bool
    reason: str
    gain_pct: float | None = None
    gain_low_pct: float | None = None
    gain_high_pct: float | None = None


def gain_interval(
    baseline: Sequence[float], samples: Sequence[float], level: float = 0.95
) -> tuple[float, float | None, float | None]:
    """Gain of the variant over the baseline in percent, with Welch's interval (or Nones)."""
    w = welch(baseline, samples, level=level)
    if w.mean_a == 0:
        return 0.0, None, None
    pct = 100.0 / w.mean_a
    low = w.low * pct if w.low is not None else None
    high = w.high * pct if w.high is not None else None
    return w.diff * pct, low, high


def decide(baseline: Sequence[float], samples: Sequence[float], policy: EarlyStop) -> Decision:
    """Whether to stop repeating a (non-baseline) variant now."""
    if not policy.enabled:
        return Decision(stop=False, reason="early stop disabled")
    if len(baseline) < 2:
        return Decision(stop=False, reason="baseline has fewer than 2 repeats: no interval")
    if len(samples) < policy.min_repeats:
        return Decision(
            stop=False,
            reason=f"{len(samples)} of {policy.min_repeats} repeats before early stop may apply",
        )
    gain, low, high = gain_interval(baseline, samples, policy.level)
    if high is None:
        return Decision(stop=False, reason="no interval yet", gain_pct=gain)
    if high < policy.min_gain_pct:
        return Decision(
            stop=True,
            gain_pct=gain,
            gain_low_pct=low,
            gain_high_pct=high,
            reason=(
                f"cannot significantly beat the baseline: gain {gain:+.2f} %, "
                f"{policy.level:.0%} CI [{low:+.2f}, {high:+.2f}] % is below "
                f"+{policy.min_gain_pct:g} %"
            ),
        )
    return Decision(
        stop=False,
        gain_pct=gain,
        gain_low_pct=low,
        gain_high_pct=high,
        reason=f"gain {gain:+.2f} %, CI [{low:+.2f}, {high:+.2f}] %: may still win",
    )
