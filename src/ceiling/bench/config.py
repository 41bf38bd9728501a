"""What a benchmark run is asked to do (``BenchConfig``), validated once, up front."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, Field, ValidationError, model_validator

from ceiling.bench.failures import MAX_FAILED_PCT
from ceiling.bench.slo import DEFAULT_PERCENTILES, Slo
from ceiling.choices import BenchMode, DatasetFormat
from ceiling.errors import CeilingError
from ceiling.inputs import base_url, check_server_url

Mode = BenchMode  # ceiling.choices: the CLI offers the same

#: Defaults that depend on the mode: single-stream decode wants long generations.
DEFAULT_MAX_TOKENS = {"single": 2048, "concurrency": 256, "rate": 256, "capacity": 256}
#: --mode concurrency without --concurrency.
DEFAULT_LEVELS = (1, 2, 4, 8)
#: The modes that send requests at a rate (open loop): --rate and --burstiness belong to them.
RATE_MODES = ("rate", "capacity")


#: More tokens than any model's context (the longest, Llama 4 Scout's, is 10 M): a larger
#: --input-len/--max-tokens is a typo, and would make the client allocate the prompt first.
MAX_SEQ_TOKENS = 10_000_000
#: Requests, repeats, warm-ups: beyond this a value is a typo, not a plan.
MAX_COUNT = 10_000_000
MAX_CONCURRENCY = 100_000
#: A week: a longer time is a typo (socket and event-loop timers overflow near 1e308 s).
MAX_SECONDS = 7 * 86400.0
#: The options that shape synthetic prompts (ceiling.bench.workloads), in the order they are
#: named when one is given together with --dataset. --max-tokens is not one: it sets a
#: dataset's output budget too.
SHAPING = ("input_len", "input_range", "output_range", "prefix_len", "turns")
#: Turns of one multi-turn session: beyond this the history outgrows any context anyway.
MAX_TURNS = 1000


def length_bounds(length: int, ratio: float) -> tuple[int, int]:
    """The closed integer range lengths are drawn from: [floor(L (1 - r)), ceil(L (1 + r))],
    at least 1 (``vllm bench serve``'s ``--random-range-ratio``)."""
    return max(1, math.floor(length * (1 - ratio))), max(1, math.ceil(length * (1 + ratio)))


class BenchConfig(BaseModel):
    """Options of one ``ceiling bench`` run (see docs/bench.md for each)."""

    url: str
    model: str | None = None
    mode: Mode = "single"
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_SEQ_TOKENS)
    input_len: int = Field(default=128, ge=1, le=MAX_SEQ_TOKENS)
    dataset: Path | None = None
    dataset_format: DatasetFormat = "auto"
    # synthetic workloads (ceiling.bench.workloads): lengths drawn per request within
    # [L (1 - range), L (1 + range)]; the first prefix_len tokens shared by every request;
    # sessions of `turns` requests that resend the growing history
    input_range: float = Field(default=0.0, ge=0, lt=1, allow_inf_nan=False)
    output_range: float = Field(default=0.0, ge=0, lt=1, allow_inf_nan=False)
    prefix_len: int = Field(default=0, ge=0, le=MAX_SEQ_TOKENS)
    turns: int = Field(default=1, ge=1, le=MAX_TURNS)
    # None: not given (the concurrency mode's default levels); given in another mode: refused
    concurrency: list[int] | None = None
    rate: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    burstiness: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    requests: int | None = Field(default=None, ge=1, le=MAX_COUNT)
    duration: float | None = Field(default=None, gt=0, le=MAX_SECONDS, allow_inf_nan=False)
    repeat: int = Field(default=1, ge=1, le=MAX_COUNT)
    warmup: int = Field(default=1, ge=0, le=MAX_COUNT)
    ignore_eos: bool = True
    # sent as is (token id -> bias)
    logit_bias: dict[str, Annotated[float, Field(allow_inf_nan=False)]] | None = None
    chat: bool = False
    temperature: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    save_detailed: bool = False
    telemetry: bool = False
    out: Path | None = None
    timeout: float = Field(default=900.0, gt=0, le=MAX_SECONDS, allow_inf_nan=False)
    stall_timeout: float = Field(default=60.0, gt=0, le=MAX_SECONDS, allow_inf_nan=False)
    seed: int = Field(default=0, ge=0, le=2**63 - 1)  # numpy's generators take non-negative
    workers: int = Field(default=1, ge=1, le=1024)
    # above this share of failed requests (%) the run is a failure: exit 1, no verdict
    max_failed_pct: float = Field(default=MAX_FAILED_PCT, ge=0, le=100, allow_inf_nan=False)
    ray: str | None = None  # Ray address ("auto", "host:port", "ray://...", "local")
    slo: list[Slo] = Field(default_factory=list)  # ceiling.bench.slo.parse_slos
    # --mode capacity (ceiling.bench.capacity): goodput may fall this share below the offered
    # rate; the search ends when the knee is bracketed within `precision` (None: the defaults)
    tolerance: float | None = Field(default=None, ge=0, lt=1, allow_inf_nan=False)
    precision: float | None = Field(default=None, gt=0, le=1, allow_inf_nan=False)
    # the p<N>_<metric>_ms keys reported (an SLO's own percentile is always added)
    percentiles: list[Annotated[float, Field(gt=0, le=100)]] = Field(
        default_factory=lambda: list(DEFAULT_PERCENTILES), min_length=1
    )

    @model_validator(mode="after")
    def _check(self) -> BenchConfig:
        check_server_url(base_url(self.url))
        if self.mode == "rate" and self.rate is None:
            raise CeilingError("--mode rate needs --rate", fix="e.g. --rate 4 (requests/s)")
        if self.mode == "capacity" and not self.slo:
            raise CeilingError(
                "--mode capacity needs --slo: capacity is the highest rate served within them",
                fix="e.g. --mode capacity --slo ttft:p99<=500ms,itl:p90<=50ms",
            )
        self._check_conflicts()
        self._check_workload()
        if (
            self.mode == "concurrency"
            and self.concurrency is not None
            and (
                not self.concurrency or any(not 1 <= c <= MAX_CONCURRENCY for c in self.concurrency)
            )
        ):
            raise CeilingError(
                "--concurrency needs positive integers", fix="e.g. --concurrency 1,2,4,8"
            )
        if self.dataset is not None and not self.dataset.is_file():
            raise CeilingError(
                f"dataset {self.dataset} not found", fix="pass a JSONL or ShareGPT JSON file"
            )
        return self

    def _check_workload(self) -> None:
        """Workload options that contradict each other are refused: each names what it
        shapes, so a run never silently measures another workload than the one asked for."""
        if self.dataset is not None:
            # "given", not "away from its default": --input-len 512 --dataset F would otherwise
            # pass silently (the dataset's lengths win), and the result would read as 512
            for name in (n for n in SHAPING if n in self.model_fields_set):
                flag = "--" + name.replace("_", "-")
                raise CeilingError(
                    f"{flag} conflicts with --dataset: it shapes synthetic prompts, and a "
                    "dataset brings its own prompts and lengths",
                    fix=f"drop {flag}, or drop --dataset",
                )
        elif self.dataset_format != "auto":
            raise CeilingError(
                f"--dataset-format {self.dataset_format} needs --dataset",
                fix="add --dataset FILE, or drop --dataset-format",
            )
        if self.prefix_len and self.dataset is None:
            shortest = length_bounds(self.input_len, self.input_range)[0]
            if self.prefix_len >= shortest:
                what = (
                    f"--input-len {self.input_len}"
                    if not self.input_range
                    else f"the shortest prompt of --input-len {self.input_len} "
                    f"--input-range {self.input_range:g} ({shortest} tokens)"
                )
                raise CeilingError(
                    f"--prefix-len {self.prefix_len} is not shorter than {what}: the prompts "
                    "would be all prefix, identical, and a prefix cache would serve them whole",
                    fix=f"a --prefix-len below {shortest}, or a longer --input-len",
                )
        if self.turns > 1 and self.mode == "capacity":
            raise CeilingError(
                f"--turns {self.turns} conflicts with --mode capacity: its rates are requests "
                "per second, and a session sends its turns one after another",
                fix="run --mode rate --rate R --turns K (R sessions per second), or drop --turns",
            )

    def input_bounds(self) -> tuple[int, int]:
        """Shortest and longest synthetic prompt (first turn) in tokens."""
        return length_bounds(self.input_len, self.input_range)

    def _check_conflicts(self) -> None:
        """An option the mode would ignore is refused: a run that silently measured something
        else than asked (--mode single --concurrency 1,4: one stream) is worse than an error."""
        given = f"--mode {self.mode}"
        if self.concurrency is not None and self.mode != "concurrency":
            levels = ",".join(str(c) for c in self.concurrency)
            raise CeilingError(
                f"--concurrency {levels} conflicts with {given}: that mode does not use levels",
                fix=f"run --mode concurrency --concurrency {levels}, or drop --concurrency",
            )
        if self.rate is not None and self.mode not in RATE_MODES:
            raise CeilingError(
                f"--rate {self.rate:g} conflicts with {given}: it sends a fixed number of "
                "streams, not requests per second",
                fix=f"run --mode rate --rate {self.rate:g}, or drop --rate",
            )
        for name in ("tolerance", "precision"):
            if getattr(self, name) is not None and self.mode != "capacity":
                raise CeilingError(
                    f"--{name} conflicts with {given}: only the capacity search uses it",
                    fix=f"run --mode capacity --slo ..., or drop --{name}",
                )
        if self.mode == "capacity" and self.repeat > 1:
            raise CeilingError(
                f"--repeat {self.repeat} conflicts with --mode capacity: each rate runs once "
                "(the search's bracket, --precision, is its resolution)",
                fix="drop --repeat; run the search again to see its spread",
            )
        if self.burstiness != 1.0 and self.mode not in RATE_MODES:
            raise CeilingError(
                f"--burstiness {self.burstiness:g} conflicts with {given}: arrivals are open "
                "loop only in --mode rate",
                fix="run --mode rate, or drop --burstiness",
            )

    @property
    def effective_max_tokens(self) -> int:
        """``max_tokens`` or the mode's default."""
        return self.max_tokens or DEFAULT_MAX_TOKENS[self.mode]

    def levels(self) -> list[int | None]:
        """Concurrency per measured level (None: open loop, rate mode)."""
        if self.mode == "single":
            return [1]
        if self.mode == "concurrency":
            return list(self.concurrency or DEFAULT_LEVELS)
        return [None]

    def requests_for(self, level: int | None) -> int | None:
        """Requests per level: ``--requests``, else unbounded with ``--duration``, else a default."""
        if self.mode == "capacity":
            return None  # per level: ceiling.bench.capacity.level_requests
        if self.requests is not None:
            return self.requests
        if self.duration is not None:
            return None
        if self.mode == "single":
            return 5
        if self.mode == "concurrency":
            return max(8, 4 * (level or 1))
        return 100


def make_config(**options: object) -> BenchConfig:
    """BenchConfig from CLI options; invalid values become one CeilingError, not a traceback."""
    try:
        return BenchConfig(**options)
    except ValidationError as err:
        first = err.errors()[0]
        where = "--" + str(first["loc"][0]).replace("_", "-") if first.get("loc") else "option"
        raise CeilingError(f"bad {where}: {first['msg']}", fix="see ceiling bench --help") from err
