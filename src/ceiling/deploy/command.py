"""``ceiling deploy``'s files: write a rendered plan (render.py) and validate it (validate.py);
``DeployResult`` is what the command returns (``ceiling.flows.deploy.run`` puts it together)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, computed_field

from ceiling.deploy.render import DeployFile, DeployPlan
from ceiling.deploy.validate import Validation, verify_compose, verify_unit
from ceiling.errors import CeilingError
from ceiling.inputs import check_out_dir
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


def check_inputs(
    out_dir: Path, dry_run: bool, gpus: int | None, ready_timeout_s: int, env_file: Path | None
) -> None:
    """Every input of ``ceiling deploy`` before anything is rendered, validated or written."""
    if gpus is not None and not 0 <= gpus <= 4096:
        raise CeilingError(f"--gpus {gpus} is not a GPU count", fix="e.g. --gpus 8 (0: CPU)")
    if not 1 <= ready_timeout_s <= 7 * 86400:
        raise CeilingError(
            f"--ready-timeout {ready_timeout_s} is out of range", fix="seconds, e.g. 1800"
        )
    if env_file is not None and env_file.is_dir():
        raise CeilingError(f"--env-file {env_file} is a directory", fix="name a file")
    if not dry_run:
        check_out_dir(out_dir, "--out")
