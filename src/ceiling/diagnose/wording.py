"""How the verdict words numbers: significant digits, us or ms, clipped log lines.

Shared by the verdict's nouns (``verdict_model``) and the hypotheses (``hypotheses``), which
render their sentences from their fields.
"""

from __future__ import annotations

from typing import Literal

HardwareKind = Literal["gpu", "cpu"]


def clip(text: str, limit: int = 160) -> str:
    """Log lines can be kilobytes long (vLLM's config line): keep the start."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def num(v: float, digits: int = 3) -> str:
    """Significant digits without scientific notation for the magnitudes a report shows
    (1,070 tok/s, not 1.07e+03)."""
    if abs(v) >= 10**digits:
        return f"{v:,.0f}"
    return f"{v:.{digits}g}"


def us_or_ms(ms: float) -> str:
    return f"{ms * 1000:.3g} us" if abs(ms) < 1 else f"{ms:.3g} ms"
