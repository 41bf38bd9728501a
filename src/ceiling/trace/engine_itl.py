"""The engine's own inter-token latency over a recorded window, from its /metrics scrapes.

The server's token count at each scrape says which engine steps made the tokens it counted
(the only traffic is the window's streams), so the comparison with the trace is over the same
steps whatever the scrape times: on a loaded 2-core box the streams trail the API server by
30 steps and more, and the API server its engine by as much. Pure functions of scrape texts.
"""

from __future__ import annotations

import itertools
import math

from ceiling.bench.server_metrics import counters, delta, histogram_means_ms
from ceiling.trace.schema import TraceCapture


def scrape_points(recorded: int, warm: int) -> list[int]:
    """The streams' token counts at which /metrics is scraped while an armed window of
    ``recorded`` steps runs: past the window's first steps, then at an eighth, a quarter, a
    half and three quarters of it (the server's count runs ahead of the streams', so the
    early points are the likelier to fall inside on a loaded box)."""
    return sorted({warm + 3, *(warm + recorded * k // 8 for k in (1, 2, 4, 6))})


def engine_itl(
    res: TraceCapture, first: str | None, second: str | None, t_first: float, t_second: float
) -> None:
    """The engine's mean ITL per token between two /metrics scrapes, kept on ``res``: the ITL
    histogram's sum over the tokens generated between them. Why not the histogram's own mean:
    the server observes one ITL per output it processes, and a server behind its engine gets
    several tokens in one output (seen on a loaded 2-core box: one observation per ~16 tokens,
    a mean 16 steps long); the sum is the time the tokens took either way."""
    if first is None or second is None:
        return  # no /metrics served: nothing to compare with
    d = delta(first, second) or {}
    itl = histogram_means_ms(d).get("itl")
    if itl is None:
        return  # an engine that keeps no ITL histogram
    tokens = counter_change(d, "generated_tokens")
    tokens = itl["count"] if tokens is None else tokens
    if itl.get("mean_ms") is None or tokens <= 0:
        # the server counted no token between the scrapes although the engine was decoding:
        # its API process trailed the engine (seen on a busy 2-core box)
        res.notes.append(
            f"the server counted no token between the two /metrics scrapes "
            f"{t_second - t_first:.3f} s apart (its API process trailed the engine): not compared"
        )
        return
    res.engine_itl_ms = itl["mean_ms"] * itl["count"] / tokens
    res.engine_itl_count = int(tokens)
    res.engine_itl_span_s = [t_first, t_second]


def counter_change(d: dict[str, float], quantity: str) -> float | None:
    """A counter's change in the delta ``d`` (None: the server keeps no such counter)."""
    return next((d[n] for n in counters().get(quantity, ()) if n in d), None)


def counted_steps(
    res: TraceCapture, zero: str | None, first: str | None, second: str | None, warm: int
) -> None:
    """The recorded steps (0 = the armed window's first) whose tokens the server counted
    between ``first`` and ``second``, from its token count since ``zero``. Why not the
    scrape times: the API server counts a token when it has processed it, which on a busy box
    trails the engine by a fifth of a second and more, so a scrape taken after the recording
    ended can still count only tokens made inside it (and one taken inside it, tokens made
    before it)."""
    if res.engine_itl_ms is None:
        return
    a, b = (
        tokens_per_stream(zero, first, res.streams),
        tokens_per_stream(zero, second, res.streams),
    )
    if a is None or b is None:
        return
    # per stream, token k (from 1) is made by engine step k - 1 (step 0: the prefill) and its
    # ITL is that step's time; the armed window begins at engine step ``warm``. Streams a
    # token apart round outwards: tokens floor(a) + 1 .. ceil(b) were counted in between.
    res.engine_itl_steps = [math.floor(a) - warm, math.ceil(b) - 1 - warm]


def tokens_per_stream(zero: str | None, scraped: str | None, streams: int) -> float | None:
    """Tokens per stream the server counted since ``zero`` (None: not known): its generated-
    tokens counter, else its ITL observations (one per token after the first, while the server
    keeps up)."""
    d = delta(zero, scraped)
    if d is None:
        return None
    tokens = counter_change(d, "generated_tokens")
    if tokens is None:
        itl = histogram_means_ms(d).get("itl")
        return None if itl is None else itl["count"] / max(streams, 1) + 1
    return tokens / max(streams, 1)


def widest_inside(
    zero: str | None,
    scrapes: list[tuple[float, str | None]],
    streams: int,
    recorded: int,
    warm: int,
) -> tuple[tuple[float, str | None], tuple[float, str | None]]:
    """The first and the last of ``scrapes`` whose counted tokens were all made by recorded
    steps (a step of margin at each end, as :func:`compare_steps` wants); without such a
    pair, the first and the last scrape (their comparison is then left out with a note)."""
    if not scrapes:
        return (0.0, None), (0.0, None)
    inside = []
    for t, text in scrapes:
        n = tokens_per_stream(zero, text, streams)
        if n is not None and math.floor(n) - warm >= 1:
            if math.ceil(n) - 1 - warm > recorded - 3:
                break  # past the recording: so is every later one
            inside.append((t, text))
    inside = without_stalls(inside)
    if len(inside) >= 2:
        return inside[0], inside[-1]
    return scrapes[0], scrapes[-1]


def without_stalls(scrapes: list[tuple[float, str | None]]) -> list[tuple[float, str | None]]:
    """``scrapes`` less those at either end whose interval held a stall: a mean ITL over 3x the
    median interval's. Why: the profiler's start stalls the engine for seconds (8 s seen at
    concurrency 2 on 2 cores), and where the streams are steps apart their mean count can place
    that token inside the window; one such ITL in a 0.5 s span made the engine's mean 20x."""
    means = []
    for (_, a), (_, b) in itertools.pairwise(scrapes):
        d = delta(a, b) or {}
        itl, tokens = histogram_means_ms(d).get("itl"), counter_change(d, "generated_tokens")
        n = itl["count"] if itl and tokens is None else tokens
        means.append(itl["mean_ms"] * itl["count"] / n if itl and n and itl["mean_ms"] else None)
    known = sorted(m for m in means if m is not None)
    if len(known) < 2:
        return scrapes
    cap = 3 * known[len(known) // 2]
    lo, hi = 0, len(means)
    while lo < hi and (means[lo] is None or means[lo] > cap):
        lo += 1
    while hi > lo and (means[hi - 1] is None or means[hi - 1] > cap):
        hi -= 1
    return scrapes[lo : hi + 1]


def compare_steps(res: TraceCapture, steps: list[int]) -> None:
    """The engine's ITL beside the trace's mean over the steps that made the counted tokens;
    left out (with a note) when any of them lies outside the recorded steps. One step of margin
    at each end: the engine's delay may or may not count the prefill step."""
    sp = res.split
    assert sp is not None and res.engine_itl_ms is not None
    lo, hi = steps
    if lo < 1 or hi > len(sp.per_step) - 2 or hi - lo < 2:
        res.notes.append(
            f"the engine's ITL ({res.engine_itl_ms:.3f} ms) is over the tokens of steps "
            f"{lo}..{hi} of a recording of {len(sp.per_step)}: partly outside it, so not compared"
        )
        res.engine_itl_ms, res.engine_itl_count = None, 0
        return
    inside = [st.ms for st in sp.per_step[lo : hi + 1]]
    res.trace_step_in_span_ms = sum(inside) / len(inside)
    step = res.trace_step_in_span_ms
    res.step_vs_engine_pct = round((step - res.engine_itl_ms) / res.engine_itl_ms * 100, 2)
