"""How ceiling writes a percentage: one formatter for every table, sentence and report.

About two significant digits, never a false zero or a false hundred:

- ``0`` is ``0 %``; a non-zero value never reads ``0 %``: under 0.1 it keeps one significant
  digit (``0.04 %``, ``-0.0003 %``; under a millionth of a percent ``<0.000001 %``);
- under 10: one decimal (``4.2 %``); from 10: whole numbers with thousands separators
  (``37 %``, ``26,593 %``);
- a share under 100 never reads ``100 %`` (``99.7 %``, ``>99.9 %``);
- ``signed``: a ``+`` before a positive value (deltas; no ``>99.9`` there).

Pure (no I/O): the verdict's sentences (``ceiling.diagnose``), the renderers and the reports use
it alike.
"""

from __future__ import annotations

import math

__all__ = ["pct", "share"]


def pct(value: float, signed: bool = False, unit: str = " %") -> str:
    """``value`` in percent (``37.4`` -> ``37 %``); ``unit=""`` for a column whose header says %."""
    if not math.isfinite(value):
        return f"{value}{unit}"
    sign = "-" if value < 0 else ("+" if signed and value > 0 else "")
    a = abs(value)
    if a == 0:
        body = "0"
    elif a < 1e-6:
        body = "<0.000001"
    elif a < 0.1:
        body = f"{a:.{-math.floor(math.log10(a))}f}"
        if float(body) >= 0.1:  # 0.0996 rounds up: the next band's precision
            body = "0.1"
    elif round(a, 1) < 10:
        body = f"{a:.1f}"
    elif a < 100 and round(a) >= 100 and not signed:
        body = ">99.9" if round(a, 1) >= 100 else f"{a:.1f}"
    else:
        body = f"{a:,.0f}"
    return f"{sign}{body}{unit}"


def share(fraction: float, unit: str = " %") -> str:
    """A share given as a fraction (``0.374`` -> ``37 %``)."""
    return pct(fraction * 100, unit=unit)
