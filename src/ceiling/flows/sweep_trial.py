"""Sweep trials and where they run.

A trial is: launch the variant's server, check its output (the sanity gate: a variant whose
output is broken is reported ``broken`` and not benchmarked), bench it one repeat at a time,
stop early once the variant cannot significantly beat the baseline, tear the server down.
Trials are generators of events (``launched``, ``sanity``, ``broken``, ``repeat``,
``stopped_early``, ``failed``, ``done``) so that the same
trial code runs in this process (:class:`LocalExecutor`) or as a Ray task on a cluster node
(:class:`RayExecutor`) while the ledger stays on the driver (``flows/sweep.py``): a lost worker loses
at most the repeat it was running.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, Field

from ceiling.bench.config import BenchConfig
from ceiling.bench.runner import run_bench
from ceiling.engines import get_engine
from ceiling.engines.variant import load_variant
from ceiling.errors import CeilingError
from ceiling.outputs import inside, safe_name
from ceiling.redact import use_api_key
from ceiling.run.launcher import launch
from ceiling.sanity.gate import doctor_gate
from ceiling.sweep.early_stop import decide
from ceiling.sweep.events import (
    Broken,
    Done,
    Failed,
    Launched,
    Repeat,
    SanityPassed,
    StoppedEarly,
    TrialEvent,
)
from ceiling.sweep.plan import EarlyStop

Event = TrialEvent  # the name the flow exported before the events were typed


class TrialSpec(BaseModel):
    """Everything a trial needs, picklable (it travels to Ray workers)."""

    name: str
    variant_path: str
    fingerprint: str
    bench: dict[str, Any]
    repeats_total: int
    repeats_done: int = 0
    samples_done: list[float] = Field(default_factory=list)
    baseline_samples: list[float] | None = None
    early_stop: EarlyStop = Field(default_factory=EarlyStop)
    launch_timeout_s: float = 1800.0
    progress: bool = True  # the engine's start-up phases on stderr (lines without a terminal)
    sanity: bool = True
    out_dir: str
    log_dir: str


TrialFn = Callable[[TrialSpec], Iterator[Event]]


def execute_trial(spec: TrialSpec) -> Iterator[Event]:
    """The real trial: launch the engine, bench repeat by repeat, tear down.

    Failures to launch (preflight passed but the engine died) become a ``failed`` event with the
    engine's classified cause and its log path; the sweep goes on with the next variant.
    """
    variant = load_variant(spec.variant_path).with_overrides(log_dir=spec.log_dir)
    samples = list(spec.samples_done)
    try:
        with (
            launch(
                variant,
                timeout_s=spec.launch_timeout_s,
                progress=spec.progress,
                timeout_option="`launch_timeout_s:` in the plan",
            ) as server,
            use_api_key(server.api_key),
        ):
            yield Launched(log_path=str(server.log_path), url=server.url)
            if spec.sanity and spec.repeats_done == 0:
                report = doctor_gate(server.url, server.model, variant.engine, None, variant)
                gate = report.model_dump(mode="json")
                # a variant told to load random weights answers noise by design (the doctor's
                # rule): its timings still compare, so it is measured, and the gate says why
                random = get_engine(variant.engine).random_weights(variant.argv(), {})
                if random is not None:
                    gate["override"] = random
                if report.verdict == "broken" and random is None:
                    yield Broken(
                        error=f"broken output: {report.headline}",
                        sanity=gate,
                        log_path=str(server.log_path),
                    )
                    return
                yield SanityPassed(sanity=gate, log_path=str(server.log_path))
            for idx in range(spec.repeats_done, spec.repeats_total):
                name = f"{safe_name(spec.name)}-{spec.fingerprint}-r{idx}.json"
                out = inside(spec.out_dir, Path(spec.out_dir) / "results" / name, "result")
                cfg = BenchConfig(
                    **{
                        **spec.bench,
                        "url": server.url,
                        "model": server.model,
                        "repeat": 1,
                        "out": out,
                    }
                )
                res = run_bench(cfg, progress=spec.progress)
                if res.partial:
                    # A partial repeat is not a measurement. A live server means the user
                    # interrupted (Ctrl-C): leave the trial resumable. A dead one is a failure.
                    if server.alive():
                        raise KeyboardInterrupt(res.partial_reason or "interrupted")
                    yield Failed(
                        log_path=str(server.log_path),
                        error=f"server died during repeat {idx}: {res.partial_reason}",
                    )
                    return
                tok = res.decode_tok_s_per_stream
                yield Repeat(
                    idx=idx, tok_s=tok, result=res.model_dump(mode="json"), result_path=str(out)
                )
                if tok is not None:
                    samples.append(tok)
                if spec.baseline_samples is not None:
                    d = decide(spec.baseline_samples, samples, spec.early_stop)
                    if d.stop:
                        yield StoppedEarly(reason=d.reason)
                        return
    except CeilingError as exc:
        log = getattr(exc, "log_path", None)
        yield Failed(error=exc.message, log_path=str(log) if log else None)
        return
    yield Done()


class Executor(Protocol):
    """Runs one trial somewhere and streams its events back to the driver."""

    def run(self, spec: TrialSpec, trial_fn: TrialFn) -> Iterator[Event]: ...

    def close(self) -> None: ...


class LocalExecutor:
    """Trials in this process, one after another."""

    def run(self, spec: TrialSpec, trial_fn: TrialFn) -> Iterator[Event]:
        yield from trial_fn(spec)

    def close(self) -> None:
        pass


class RayExecutor:
    """Trials as Ray tasks (streaming generators) on nodes with the GPUs they need.

    The ledger stays on the driver: each event comes back as soon as the worker yields it and
    is committed before the next one is read. ``address=None`` starts a local Ray instance
    (this is how it is tested on a CPU-only machine).
    """

    def __init__(
        self, address: str | None = None, gpus_per_trial: float = 0, cpus_per_trial: float = 1
    ) -> None:
        try:
            import ray
        except ImportError as exc:
            raise CeilingError(
                "the Ray executor needs the `ray` package",
                fix="pip install 'ceiling[ray]' (or use executor: local)",
            ) from exc
        self.ray = ray
        if not ray.is_initialized():
            kwargs: dict[str, Any] = (
                {"address": address}
                if address
                else {"num_cpus": max(int(cpus_per_trial), 1), "include_dashboard": False}
            )
            ray.init(ignore_reinit_error=True, log_to_driver=False, **kwargs)
        self.gpus, self.cpus = gpus_per_trial, cpus_per_trial

    def run(self, spec: TrialSpec, trial_fn: TrialFn) -> Iterator[Event]:
        ray = self.ray

        def remote_trial(payload: dict[str, Any]) -> Iterator[Event]:
            yield from trial_fn(TrialSpec.model_validate(payload))

        task = ray.remote(remote_trial).options(
            num_gpus=self.gpus, num_cpus=self.cpus, num_returns="streaming", max_retries=0
        )
        gen = task.remote(spec.model_dump(mode="json"))
        try:
            for ref in gen:
                yield ray.get(ref)
        except ray.exceptions.RayError as exc:
            yield Failed(error=f"ray worker failed: {exc}".splitlines()[0])

    def close(self) -> None:
        if self.ray.is_initialized():
            self.ray.shutdown()
