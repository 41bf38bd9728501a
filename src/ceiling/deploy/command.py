"""``ceiling deploy``: render (render.py), write, validate (validate.py), print."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, computed_field

from ceiling.deploy.render import DeployFile, DeployPlan, build_plan
from ceiling.deploy.validate import Validation, verify_compose, verify_unit
from ceiling.engines.variant import load_variant
from ceiling.outputs import write_atomic


def write_plan(plan: DeployPlan) -> list[str]:
    """Write the unit, the compose file, the launch scripts; the env file only if absent (it
    holds the user's secrets once filled in), mode 600."""
    written = []
    for f in (plan.unit, plan.compose, *plan.scripts):
        _write(f)
        written.append(f.path)
    env = Path(plan.env_file.path)
    if not env.exists():
        _write(plan.env_file)
        written.append(plan.env_file.path)
    return written


def _write(f: DeployFile) -> None:
    write_atomic(Path(f.path), f.content, mode=f.mode, what="deploy file")


def validate_plan(plan: DeployPlan) -> list[Validation]:
    return [verify_unit(Path(plan.unit.path)), verify_compose(Path(plan.compose.path))]


class DeployResult(BaseModel):
    """``ceiling deploy``: the plan, the files written, the validators' verdicts."""

    plan: DeployPlan
    written: list[str] = Field(default_factory=list)
    validation: list[Validation] = Field(default_factory=list)
    dry_run: bool = Field(False, exclude=True)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def ok(self) -> bool:
        return not any(c.status == "failed" for c in self.validation)


def deploy(
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
    out_dir = out or Path("ceiling-out") / "deploy" / variant.name
    plan = build_plan(variant, out_dir, image=image, gpus=gpus, ready_timeout_s=ready_timeout_s,
                      env_file=env_file)  # fmt: skip
    result = DeployResult(plan=plan, dry_run=dry_run)
    if not dry_run:
        result.written = write_plan(plan)
        if validate:
            result.validation = validate_plan(plan)
    return result
