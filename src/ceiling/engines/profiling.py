"""How an engine records its own kernels: the nouns every adapter fills (``Engine.profiler``).

An engine that can trace itself (vLLM, SGLang: PyTorch's profiler inside the workers) is told to
through a flag or a variable at launch, then records a window between two HTTP calls and writes
one Chrome-trace file per rank. What differs per engine and version (the flag, the variable, the
endpoints and their body, the file names) is each adapter's knowledge; ``ProfilerSetup`` is what
it answers, so that ``ceiling.trace.capture`` and the doctor never name an engine's flags.
"""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from ceiling.engines.variant import Arg, Variant, normalize_flag
from ceiling.errors import CeilingError


class ProfilerSetup(BaseModel):
    """One engine version's profiler: what a launch adds, how a window is recorded, where the
    files land, and the sentence that tells a user how to turn it on by hand."""

    engine: str
    version: str | None = None
    # whether this engine (at this version) records its kernels through HTTP endpoints
    supported: bool
    # what a launched variant gets: flags (appended) and variables
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    # the window: POST start_path with start_body, then POST stop_path
    start_path: str | None = None
    start_body: dict[str, Any] = Field(default_factory=dict)
    stop_path: str | None = None
    # whether the engine itself ends the window after the steps asked for (the body or the
    # launch config carries the count); otherwise only the stop call ends it
    bounded_by_engine: bool = False
    # the start body's key for the steps the engine lets pass before it records (vLLM's
    # ``delay_iterations``): a window armed so before the streams begin is placed by the
    # engine's own step count, whatever the client has read
    delay_key: str | None = None
    # whether a server ceiling did not launch can be traced anyway (SGLang: the endpoint is
    # always there and the body names the output directory)
    works_unlaunched: bool = False
    # where the files land (all ranks) and which of them are the workers' traces
    trace_dir: str | None = None
    file_patterns: list[str] = Field(default_factory=list)
    exclude_patterns: list[str] = Field(default_factory=list)
    # where a variant that sets the profiler itself names its directory (its values win over
    # ours in ``apply``, so the files land there): a flag whose value is JSON with the
    # directory under ``dir_flag_key`` (vLLM's --profiler-config), or a variable
    dir_flag: str | None = None
    dir_flag_key: str | None = None
    dir_env: str | None = None
    # a server ceiling did not launch: exactly which flag or variable turns profiling on
    enable_hint: str
    # what instead, where the engine has no profiler of its own
    alternative: str | None = None
    source: str = ""  # where this knowledge was read (engine source files, version)
    notes: list[str] = Field(default_factory=list)

    def trace_files(self, folder: Path, since: float | None = None) -> list[Path]:
        """The workers' trace files under ``folder`` (one per rank), modified at or after
        ``since`` (epoch seconds), sorted by name."""
        found: list[Path] = []
        if not folder.is_dir():
            return found
        for path in folder.rglob("*"):
            if not path.is_file():
                continue
            name = path.name
            if not any(fnmatch.fnmatch(name, p) for p in self.file_patterns):
                continue
            if any(fnmatch.fnmatch(name, p) for p in self.exclude_patterns):
                continue
            if since is not None and path.stat().st_mtime < since:
                continue
            found.append(path)
        return sorted(found)

    def for_variant(self, variant: Variant) -> ProfilerSetup:
        """This setup with ``trace_dir`` where ``variant`` itself tells the engine to write
        (its own flag or variable wins in ``apply``: looking in ours would find nothing).
        A setting that names no directory ceiling can read is an error saying what to fix."""
        folder: str | None = None
        what = ""
        if self.dir_flag is not None:
            key = normalize_flag(self.dir_flag)
            mine = [a for a in variant.args if a.key == key]
            if mine:
                what = f"the variant's {self.dir_flag}"
                folder = _dir_from_flag(mine[-1], self.dir_flag_key, what, self.enable_hint)
        if folder is None and self.dir_env is not None and self.dir_env in variant.env:
            what = f"the variant's {self.dir_env}"
            folder = variant.env[self.dir_env]
        if folder is None:
            return self
        path = Path(folder).expanduser()
        if not path.is_absolute():
            raise CeilingError(
                f"{what} names a relative trace directory ({folder!r}): the server resolves "
                "it from its own working directory, which ceiling cannot see",
                fix=f"give an absolute directory in {what}, or drop it (ceiling then sets one)",
            )
        notes = [*self.notes, f"trace files read from {path} ({what})"]
        return self.model_copy(update={"trace_dir": str(path), "notes": notes})

    def apply(self, variant: Variant) -> Variant:
        """``variant`` with this profiler's flags and variables added (the variant's own
        values win: a user who set the flag already keeps theirs)."""
        data = variant.model_dump()
        have = {a.key for a in variant.args}
        extra = [a for a in _args(self.args) if a.key not in have]
        data["args"] = [*data["args"], *(a.model_dump() for a in extra)]
        data["env"] = {**self.env, **variant.env}
        return Variant.model_validate(data)


def _dir_from_flag(arg: Arg, key: str | None, what: str, hint: str) -> str:
    """The directory a variant's own profiler flag names (its value, or ``key`` of its JSON)."""
    text = " ".join(arg.values)
    if key is None:
        if not text:
            raise CeilingError(f"{what} has no value", fix=hint)
        return text
    try:
        conf = json.loads(text)
    except ValueError as exc:
        raise CeilingError(f"{what} is not JSON ({text[:80]!r})", fix=hint) from exc
    if not isinstance(conf, dict) or not conf.get(key):
        raise CeilingError(
            f"{what} names no {key}: the engine would write no trace ceiling can find",
            fix=f'add "{key}": "/absolute/dir" to it, or drop the flag (ceiling sets it)',
        )
    if conf.get("profiler", "torch") != "torch":
        raise CeilingError(
            f"{what} asks for the {conf['profiler']!r} profiler: ceiling reads torch traces",
            fix='set "profiler": "torch" in it, or drop the flag (ceiling sets it)',
        )
    return str(conf[key])


def _args(tokens: list[str]) -> list[Arg]:
    out: list[Arg] = []
    for tok in tokens:
        if tok.startswith("-"):
            out.append(Arg(flag=tok))
        elif out:
            out[-1].values.append(tok)
    return out


def unsupported(engine: str, version: str | None, hint: str, alternative: str) -> ProfilerSetup:
    """The answer of an engine (or version) that cannot record its own kernels."""
    return ProfilerSetup(
        engine=engine, version=version, supported=False, enable_hint=hint, alternative=alternative
    )
