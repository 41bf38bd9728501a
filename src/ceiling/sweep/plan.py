"""Sweep plans: which variants to run, how to bench them, and when to stop early.

A plan is a YAML file a user keeps next to the results::

    name: nccl-settings
    baseline: base                      # default: the first variant
    repeats: 5                          # bench repeats per variant (one server launch each)
    bench: {mode: single, max_tokens: 256, warmup: 1}
    early_stop: {min_repeats: 3, min_gain_pct: 1.0}
    executor: local                     # or ray (address: auto, gpus_per_trial: 8)
    variants:
      - name: base
        variant: ../variants/cpu-tiny.yaml
      - name: ring-ll
        extends: ../variants/cpu-tiny.yaml   # inline: any variant-file keys
        env: {NCCL_ALGO: Ring, NCCL_PROTO: LL}

Inline variants are written out as variant files (so the engines module reads them exactly as
it reads any other) and each gets a fingerprint: the ledger uses it to tell "the same trial,
resumed" from "a changed variant that must run again".
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, ValidationError

from ceiling.engines.variant import load_variant
from ceiling.errors import CeilingError
from ceiling.inputs import read_text
from ceiling.outputs import inside, safe_name, write_atomic

SCHEMA_VERSION = 1


class EarlyStop(BaseModel):
    """Stop repeating a variant once its gain CI cannot reach ``min_gain_pct`` over baseline."""

    enabled: bool = True
    min_repeats: int = Field(3, ge=2)
    min_gain_pct: float = 1.0
    level: float = 0.95


class RayOptions(BaseModel):
    address: str | None = Field(None, description="ray cluster address; None = start locally")
    gpus_per_trial: float = 0
    cpus_per_trial: float = 1


class PlanVariant(BaseModel):
    """One entry: a variant file, or inline variant keys (with ``extends``)."""

    model_config = {"extra": "allow"}

    name: str
    variant: str | None = None


class Plan(BaseModel):
    schema_version: int = SCHEMA_VERSION
    name: str = "sweep"
    baseline: str | None = None
    repeats: int = Field(5, ge=1)
    bench: dict[str, Any] = Field(default_factory=lambda: {"mode": "single", "max_tokens": 256})
    early_stop: EarlyStop = Field(default_factory=EarlyStop)
    executor: Literal["local", "ray"] = "local"
    ray: RayOptions = Field(default_factory=RayOptions)
    launch_timeout_s: float = 1800.0
    # the sanity gate before each trial's first repeat (a broken variant is reported broken)
    sanity: bool = True
    variants: list[PlanVariant]
    source: str | None = None

    @property
    def baseline_name(self) -> str:
        return self.baseline or self.variants[0].name


def load_plan(path: str | Path) -> Plan:
    """Read and validate a plan file."""
    p = Path(path)
    text = read_text(p, "plan file", fix="pass a plan YAML file (see examples/plans/)")
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise CeilingError(
            f"malformed plan {p}: {str(exc).splitlines()[0]}",
            fix="fix the YAML syntax (see examples/plans/)",
        ) from None
    if not isinstance(data, dict):
        raise CeilingError(
            f"malformed plan {p}: top level is {type(data).__name__}, not a mapping",
            fix="write `variants:` (and `bench:`, `baseline:`) at the top level",
        )
    try:
        plan = Plan.model_validate({**data, "source": str(p.resolve())})
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        raise CeilingError(f"plan {p}: {loc}: {err['msg']}", fix="see docs/sweep.md") from None
    if not plan.variants:
        raise CeilingError(f"plan {p} lists no variants", fix="add a `variants:` list")
    names = [v.name for v in plan.variants]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise CeilingError(
            f"plan {p}: duplicate variant names {sorted(dup)}",
            fix="give every variant a unique name",
        )
    files = [safe_name(n) for n in names]  # the names files get ('a/b' and 'a_b' collide)
    clash = sorted({n for n, f in zip(names, files, strict=True) if files.count(f) > 1})
    if clash:
        raise CeilingError(
            f"plan {p}: variant names {clash} give the same file name",
            fix="name variants with letters, digits, '.', '-', '_' only",
        )
    if plan.baseline_name not in names:
        raise CeilingError(
            f"plan {p}: baseline {plan.baseline_name!r} is not a variant", fix=f"use one of {names}"
        )
    for v in plan.variants:
        extra = v.model_extra or {}
        if v.variant is None and "extends" not in extra and "engine" not in extra:
            raise CeilingError(
                f"plan {p}: variant {v.name!r} has neither `variant:` nor inline "
                "keys (`extends:` or `engine:`)",
                fix="see docs/sweep.md",
            )
    return plan


def materialize(plan: Plan, work_dir: str | Path) -> dict[str, Path]:
    """Write each plan entry as a variant file under ``work_dir/variants``; name -> path.

    Paths in the plan are relative to the plan file. Inline entries are written with
    ``extends`` made absolute and the model path resolved from the parent, so the written file
    means the same thing wherever it lives.
    """
    base = Path(plan.source).parent if plan.source else Path.cwd()
    out = Path(work_dir) / "variants"
    out.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    for v in plan.variants:
        extra = dict(v.model_extra or {})
        if v.variant is not None:
            src = (base / v.variant).resolve()
            if not extra:
                paths[v.name] = src
                continue
            extra.setdefault("extends", str(src))
        if "extends" in extra:
            parent = (base / str(extra["extends"])).resolve()
            extra["extends"] = str(parent)
            if "model" not in extra:
                extra["model"] = load_variant(parent).model
        elif isinstance(extra.get("model"), str) and extra["model"].startswith("."):
            extra["model"] = str((base / extra["model"]).resolve())
        extra["name"] = v.name
        target = inside(work_dir, out / f"{safe_name(v.name)}.yaml", "variant copy")
        write_atomic(
            target,
            yaml.safe_dump(extra, sort_keys=True),
            mode=0o600,
            what="variant copy",
            keep_previous=False,
        )
        paths[v.name] = target
    return paths


def fingerprint(variant: Any, bench: dict[str, Any]) -> str:
    """A short stable hash of what decides a trial's outcome: engine, model, args, env, bench.

    The variant's file location and launch-time details (port, log directory) are left out so
    that moving the plan does not invalidate finished trials.
    """
    data = variant.model_dump(mode="json") if hasattr(variant, "model_dump") else dict(variant)
    for key in ("source", "extends_chain", "port", "log_dir", "name"):
        data.pop(key, None)
    blob = json.dumps({"variant": data, "bench": bench}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
