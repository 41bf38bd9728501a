"""``ceiling deploy``: load the variant, render its unit and Compose service, write and validate
them (the steps live in ``ceiling.deploy``; this flow sequences them)."""

from __future__ import annotations

from pathlib import Path

from ceiling.deploy.command import DeployResult, check_inputs, validate_plan, write_plan
from ceiling.deploy.render import build_plan
from ceiling.engines.variant import load_variant
from ceiling.outputs import safe_name

__all__ = ["DeployResult", "run"]


def run(
    variant_path: Path,
    out: Path | None,
    dry_run: bool,
    image: str | None,
    gpus: int | None,
    ready_timeout_s: int,
    env_file: Path | None,
    validate: bool,
) -> DeployResult:
    """``ceiling deploy``: render the variant's unit and Compose service, write and validate
    them (``dry_run``: only render)."""
    variant = load_variant(variant_path)
    out_dir = out or Path("ceiling-out") / "deploy" / safe_name(variant.name)
    check_inputs(out_dir, dry_run, gpus, ready_timeout_s, env_file)
    plan = build_plan(
        variant, out_dir, image=image, gpus=gpus, ready_timeout_s=ready_timeout_s, env_file=env_file
    )
    result = DeployResult(plan=plan, dry_run=dry_run)
    if not dry_run:
        result.written = write_plan(plan)
        if validate:
            result.validation = validate_plan(plan)
    return result
