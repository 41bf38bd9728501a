"""The result file: one JSON per run, ``vllm bench serve`` key names where they overlap.

With one level (``--mode single``, ``rate``, one concurrency) the top-level keys carry that
level's summary, so such a result reads like a ``vllm bench serve`` result; with several the
top level carries totals (requests, tokens, duration, errors) and no per-level figure (null);
``levels`` holds every level. Per-repeat summaries sit under ``repeats`` and confidence intervals under ``ci``.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ceiling.bench.metrics import EarlyEnd, RequestRecord
from ceiling.bench.slo import SloCheck
from ceiling.bench.stats import Interval
from ceiling.console import dumps
from ceiling.errors import CeilingError, ExitStatus
from ceiling.inputs import read_json
from ceiling.outputs import write_atomic

SCHEMA_VERSION = 1
KIND = "ceiling.bench.result"

#: Summary keys that get a confidence interval across repeats, and which way is better.
CI_METRICS: dict[str, str] = {
    "decode_tok_s_per_stream": "higher",
    "output_throughput": "higher",
    "request_throughput": "higher",
    "request_goodput": "higher",
    "steady_state_output_throughput": "higher",
    "mean_tpot_ms": "lower",
    "mean_ttft_ms": "lower",
    "mean_itl_ms": "lower",
    "mean_e2el_ms": "lower",
}


class Summary(BaseModel):
    """Run summary: ``vllm bench serve`` names (ms, tok/s, req/s) plus ours (extra keys kept).

    Stats keys exist for ttft, tpot, itl, e2el and ttfct (time to first *content* token):
    ``mean_/median_/std_<name>_ms`` and ``p<N>_<name>_ms`` for each of ``--percentiles``
    (default 50, 90, 99) and each percentile an SLO names. ``request_goodput`` and
    ``good_completed`` only with ``--slo`` (ceiling.bench.slo: the per-request rule).
    """

    model_config = ConfigDict(extra="allow")

    duration: float = 0.0
    completed: int = 0
    failed: int = 0
    total_input_tokens: int = 0
    total_output_tokens: int = 0
    request_throughput: float | None = None
    output_throughput: float | None = None
    total_token_throughput: float | None = None
    mean_ttft_ms: float | None = None
    median_ttft_ms: float | None = None
    p99_ttft_ms: float | None = None
    mean_tpot_ms: float | None = None
    median_tpot_ms: float | None = None
    p99_tpot_ms: float | None = None
    mean_itl_ms: float | None = None
    median_itl_ms: float | None = None
    p99_itl_ms: float | None = None
    mean_e2el_ms: float | None = None
    median_e2el_ms: float | None = None
    p99_e2el_ms: float | None = None
    decode_tok_s_per_stream: float | None = None
    steady_state_output_throughput: float | None = None
    good_completed: int | None = Field(
        None, description="completed requests that met every SLO (None: no --slo)"
    )
    request_goodput: float | None = Field(
        None, description="good_completed per second of duration (vllm bench serve's key)"
    )


class PerRequest(BaseModel):
    """Compact per-request values kept in every result (what ``compare`` bootstraps over)."""

    repeat: list[int] = Field(default_factory=list)
    tpot_ms: list[float | None] = Field(default_factory=list)
    ttft_ms: list[float | None] = Field(default_factory=list)
    e2el_ms: list[float | None] = Field(default_factory=list)
    output_tokens: list[int] = Field(default_factory=list)
    # Each request's inter-chunk gaps as their sum and count (two numbers, not every sample):
    # mean_itl_ms is sum(itl_sum_ms) / sum(itl_count), and compare bootstraps exactly that,
    # resampling requests. Not TPOT: a chunk that carries several tokens is one ITL sample.
    itl_sum_ms: list[float] = Field(default_factory=list)
    itl_count: list[int] = Field(default_factory=list)


class LevelResult(Summary):
    """One level of a run (a concurrency, or the rate), pooled over repeats."""

    concurrency: int | None = None
    request_rate: float | None = None
    burstiness: float | None = None
    errors: dict[str, int] = Field(default_factory=dict)
    error_messages: dict[str, int] = Field(
        default_factory=dict,
        description="each distinct error text (the server's own words) -> failed requests",
    )
    finish_reasons: dict[str, int] = Field(
        default_factory=dict, description="completed requests per finish_reason the server gave"
    )
    early_ends: list[EarlyEnd] = Field(
        default_factory=list, description="completed requests that ended before max_tokens"
    )
    ci: dict[str, Interval] = Field(default_factory=dict)
    slo: list[SloCheck] = Field(default_factory=list, description="each --slo on this level")
    slo_met: bool | None = Field(None, description="every SLO's statistic met (None: no --slo)")
    repeats: list[Summary] = Field(default_factory=list)
    server_metrics: dict[str, Any] | None = None
    per_request: PerRequest = Field(default_factory=PerRequest)
    requests: list[RequestRecord] | None = None


class WorkerInfo(BaseModel):
    """One load-generating worker of a ``--workers``/``--ray`` run.

    ``clock_offset_ms``: the worker's monotonic clock minus the driver's (0 on the same host,
    where CLOCK_MONOTONIC is one clock); ``clock_basis``: ``same_host``, ``measured`` (round
    trips, ``clock_uncertainty_ms`` = half the best round trip) or ``unknown`` (then nothing
    that compares times across workers is reported).
    """

    index: int
    kind: str = "process"
    host: str = ""
    pid: int = 0
    node: str | None = None
    same_host: bool = True
    clock_basis: str = "same_host"
    clock_offset_ms: float | None = 0.0
    clock_uncertainty_ms: float | None = None
    clock_offset_measured_ms: float | None = None
    loop_lag_ms: dict[str, float | None] = Field(default_factory=dict)
    requests: int = 0
    streams: int = 0


class CapacityPoint(BaseModel):
    """One level of the search: a point of the throughput/latency curve."""

    rate: float = Field(description="the Poisson rate asked, req/s")
    sent: int
    good_completed: int
    request_goodput: float | None
    request_throughput: float | None
    passed: bool = Field(description="good_completed >= (1 - tolerance) x sent")
    slo: list[SloCheck] = Field(default_factory=list)


class CapacityResult(BaseModel):
    """What the search found (ceiling.bench.capacity; docs/bench.md)."""

    knee_rate: float | None = Field(description="the highest rate that passed (None: none did)")
    first_failing_rate: float | None = Field(description="the lowest failing rate above it")
    binding_slo: str | None = Field(description="the SLO most requests missed just above the knee")
    tolerance: float
    precision: float
    level_rule: str = Field(description="how long each level ran, and why")
    stopped: str = Field(description="why the search ended")
    curve: list[CapacityPoint] = Field(default_factory=list)


class RunResult(LevelResult):
    """A whole ``ceiling bench`` run: the only level's figures at the top level, or with
    several levels their totals (ceiling.bench.assemble.run_head); every level in ``levels``."""

    schema_version: int = SCHEMA_VERSION
    kind: str = KIND
    date: str = ""
    ceiling_version: str = ""
    url: str = ""
    endpoint: str = ""
    model_id: str = ""
    mode: str = ""
    config: dict[str, Any] = Field(default_factory=dict)
    input_len_source: str | None = None
    served_context: int | None = Field(
        None, description="tokens of context one request gets on the server, as it says"
    )
    served_context_source: str | None = Field(
        None, description="where served_context was read (/v1/models, /props)"
    )
    timestamp_source: str = "socket"
    timestamp_fallbacks: int = 0
    partial: bool = False
    partial_reason: str | None = None
    stalled: str | None = Field(
        None, description="a stream went silent for --stall-timeout mid-way (the run stopped)"
    )
    context_overflow: str | None = Field(
        None, description="the server's context cannot hold prompt + max_tokens (the run stopped)"
    )
    interrupted: bool = False  # partial because of Ctrl-C/SIGTERM (CLI exit code 130)
    cancelled_in_flight: int = 0
    warnings: list[str] = Field(default_factory=list)
    notes: list[str] = Field(
        default_factory=list, description="what the run states without warning (said once)"
    )
    loop_lag_ms: dict[str, float | None] = Field(default_factory=dict)
    telemetry: dict[str, Any] | None = None
    workers: list[WorkerInfo] = Field(default_factory=list)
    clock_aligned: bool = True
    levels: list[LevelResult] = Field(default_factory=list)
    capacity: CapacityResult | None = Field(None, description="--mode capacity: the search")

    def level(self, concurrency: int | None) -> LevelResult | None:
        """The level with this concurrency (None: the rate level)."""
        for lv in self.levels:
            if lv.concurrency == concurrency:
                return lv
        return None


def summary_dict(result: RunResult) -> dict[str, Any]:
    """The result without per-request lists (what ``--json`` prints)."""
    data = result.model_dump(mode="json")
    for holder in [data, *data.get("levels", [])]:
        holder.pop("per_request", None)
        holder.pop("requests", None)
    return data


def save_result(result: RunResult, path: Path) -> Path:
    """Write the result JSON (creating folders); returns the path.

    A regular file is replaced atomically (temporary file, then rename), so a crash never leaves
    half a result. Anything else that already exists at ``path`` (``/dev/null``, ``/dev/stdout``,
    a FIFO) is written into, never replaced: the rename would swap a device node that other
    processes own for a plain file.
    """
    text = dumps(result.model_dump(mode="json", exclude_none=False)) + "\n"
    if path.is_dir():
        raise CeilingError(f"--out {path} is a directory", fix="name a file, e.g. run.json")
    try:
        write_atomic(path, text, what="result")
    except CeilingError as exc:
        rescue = _rescue(text)  # what was measured is never lost to a bad path
        raise CeilingError(
            f"{exc.message}; the result was saved to {rescue}",
            fix=f"move {rescue} where you want it",
            exit_code=ExitStatus.FAILED,
        ) from None
    return path


def _rescue(text: str) -> Path:
    """Write ``text`` to a new file in the temporary directory (else the working directory)."""
    for folder in (tempfile.gettempdir(), "."):
        try:
            fd, name = tempfile.mkstemp(
                prefix=time.strftime("ceiling-result-%Y%m%d-%H%M%S-"), suffix=".json", dir=folder
            )
            with open(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
            return Path(name)
        except OSError:
            continue
    raise CeilingError("cannot write the result anywhere", fix="free some disk space")


def load_result(path: str | Path) -> RunResult:
    """Read a result file written by ``ceiling bench``; CeilingError when it is not one."""
    p = Path(path)
    data = read_json(p, "result file", fix="pass a result file written by ceiling bench")
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise CeilingError(
            f"{p} is not a ceiling bench result (no kind={KIND!r})",
            fix="pass a result file that ceiling bench wrote (its --out)",
        )
    version = data.get("schema_version", 0)
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise CeilingError(
            f"{p} has schema_version {data.get('schema_version')}, newer than this ceiling reads",
            fix="upgrade ceiling",
        )
    try:
        return RunResult.model_validate(data)
    except ValidationError as err:
        raise CeilingError(
            f"{p} is malformed: {err.errors()[0]['msg']}", fix="re-run ceiling bench"
        ) from err
