"""``ceiling deploy``'s files: write a rendered plan (render.py) and validate it (validate.py);
``DeployResult`` is what the command returns (``ceiling.flows.deploy.run`` puts it together)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, computed_field

from ceiling.deploy.render import DeployFile, DeployPlan
from ceiling.deploy.validate import Validation, verify_compose, verify_unit
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
