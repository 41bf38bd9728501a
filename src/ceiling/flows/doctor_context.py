"""The doctor's one typed context and its declared stage table's nouns (``Step``, ``When``).

Why a context: the stages read and write the same dozen things (the configuration, the result,
the server, its URL and log, the served model), and passing them positionally made every stage
take 5-8 parameters in its own order. One object carries them; each ``Step`` says which of its
fields it reads and writes, and when it runs (``When``: a predicate with a label the docs show).

Why a table: the order of the stages is data, not control flow, so the docs' stage order can be
made from the same table that runs (``stage_order``) instead of drifting from it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ceiling import interrupts
from ceiling.console import console
from ceiling.diagnose.schema import DoctorConfig, DoctorResult, Stage
from ceiling.engines.profiling import ProfilerSetup
from ceiling.engines.variant import Variant
from ceiling.errors import CeilingError
from ceiling.run.launcher import Server
from ceiling.server.schema import ServedModel


class Recorder:
    """Records stages into the result; failures are kept, not raised (unless fatal)."""

    def __init__(self, result: DoctorResult, progress: bool) -> None:
        self.result = result
        self.progress = progress

    @contextlib.contextmanager
    def stage(self, name: str, fatal: bool = False) -> Iterator[Stage]:
        st = Stage(name=name)
        self.result.stages.append(st)
        t0 = time.monotonic()
        if self.progress:
            console().print(f"[bold]doctor[/bold]: {name} ...")  # our stage names
        try:
            yield st
        except CeilingError as exc:
            st.status, st.message = "failed", exc.message.splitlines()[0]
            if fatal:
                raise
        except KeyboardInterrupt:
            st.status, st.message = "interrupted", interrupts.describe()
            raise
        finally:
            st.seconds = round(time.monotonic() - t0, 2)

    def skip(self, name: str, why: str) -> None:
        self.result.stages.append(Stage(name=name, status="skipped", message=why))


@dataclass
class DoctorContext:
    """What the stages share. ``cfg`` is the configuration the later stages read (the setup
    stage replaces it: the TP seen, ``--gpu`` by its catalog name); ``res.config`` keeps the
    one given. ``url``, ``log_path``, ``models`` and ``served`` are known from the target step
    on (after the launch); ``setup`` is the profiler's, with ``--trace``."""

    cfg: DoctorConfig
    res: DoctorResult
    rec: Recorder
    out: Path
    stack: contextlib.ExitStack
    variant: Variant | None = None
    server: Server | None = None
    url: str = ""
    log_path: Path | None = None
    models: list[ServedModel] = field(default_factory=list)
    served: str | None = None
    setup: ProfilerSetup | None = None
    #: ``log_path`` where this process could read it when the target was found (else None and
    #: the inspect stages skip)
    readable_log: Path | None = None
    #: while ``doctor_watch`` checks a step: the fields it read (None: not checked)
    _reads: set[str] | None = field(default=None, init=False, repr=False, compare=False)

    def __getattribute__(self, name: str) -> Any:
        reads = object.__getattribute__(self, "_reads")
        if reads is not None and not name.startswith("_"):
            reads.add(name)
        return object.__getattribute__(self, name)


@dataclass(frozen=True)
class When:
    """When a step runs: a predicate on the context, and the words the docs say it with."""

    label: str
    test: Callable[[DoctorContext], bool]

    def __call__(self, ctx: DoctorContext) -> bool:
        return self.test(ctx)


ALWAYS = When("", lambda ctx: True)
# the mode is the input's (--variant xor --url, checked before anything runs)
VARIANT = When("variant only", lambda ctx: bool(ctx.cfg.variant))
URL = When("`--url` only", lambda ctx: not ctx.cfg.variant)


@dataclass(frozen=True)
class Step:
    """One entry of the stage table. ``recorded``: it appears in ``doctor.json``'s stages
    under ``name`` (a step that only prepares the context, such as finding the target, is not
    and the docs leave it out). ``reads``/``writes`` name context fields (``res.x``: a field of
    the result), checked while the flow runs with ``CEILING_CHECK_STAGES=1`` (the tests:
    ``doctor_watch``); ``note`` is why it sits where it does, shown in the docs."""

    name: str
    run: Callable[[DoctorContext], None]
    when: When = ALWAYS
    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    note: str = ""
    recorded: bool = True


def stage_order(steps: Sequence[Step]) -> str:
    """The docs' stage order: the recorded steps, in order, each with when it runs and why it
    sits there; then the report (written by whoever asks, after the last stage)."""
    parts = []
    for step in steps:
        if not step.recorded:
            continue
        said = "; ".join(s for s in (step.when.label, step.note) if s)
        parts.append(f"{step.name} ({said})" if said else step.name)
    return " -> ".join([*parts, "report"]) + "."
