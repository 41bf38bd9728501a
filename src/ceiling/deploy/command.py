"""``ceiling deploy``: render (render.py), write, validate (validate.py), print."""

from __future__ import annotations

import os
from pathlib import Path

from ceiling.deploy.render import DeployFile, DeployPlan, build_plan
from ceiling.deploy.validate import Validation, verify_compose, verify_unit


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
    path = Path(f.path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, f.mode)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(f.content)
    os.chmod(tmp, f.mode)
    tmp.replace(path)


def validate_plan(plan: DeployPlan) -> list[Validation]:
    return [verify_unit(Path(plan.unit.path)), verify_compose(Path(plan.compose.path))]


def run_deploy(
    variant_path: Path,
    out: Path | None,
    dry_run: bool,
    image: str | None,
    gpus: int | None,
    ready_timeout_s: int,
    env_file: Path | None,
    validate: bool,
    json_out: bool,
) -> int:
    from rich.markup import escape

    from ceiling.console import emit_json
    from ceiling.console import out as stdout
    from ceiling.engines.variant import load_variant

    variant = load_variant(variant_path)
    out_dir = out or Path("ceiling-out") / "deploy" / variant.name
    plan = build_plan(variant, out_dir, image=image, gpus=gpus, ready_timeout_s=ready_timeout_s,
                      env_file=env_file)  # fmt: skip
    written: list[str] = []
    checks: list[Validation] = []
    if not dry_run:
        written = write_plan(plan)
        if validate:
            checks = validate_plan(plan)
    failed = [c for c in checks if c.status == "failed"]
    if json_out:
        emit_json({"plan": plan, "written": written, "validation": checks, "ok": not failed})
        return 1 if failed else 0
    o = stdout()
    if dry_run:
        for f in (plan.unit, plan.compose, *plan.scripts, plan.env_file):
            o.print(f"# ---- {escape(f.path)}", soft_wrap=True)
            o.print(escape(f.content), soft_wrap=True, highlight=False)
        return 0
    for path in written:
        o.print(f"wrote {escape(path)}", soft_wrap=True)
    for note in plan.notes:
        o.print(f"note: {escape(note)}", soft_wrap=True)
    for c in checks:
        colour = {"passed": "green", "failed": "red", "skipped": "yellow"}[c.status]
        o.print(f"[{colour}]{c.status}[/{colour}] {c.tool} {escape(c.file)}", soft_wrap=True)
        if c.status != "passed" and c.output:
            o.print(escape(c.output), soft_wrap=True)
    unit = Path(plan.unit.path).name
    o.print(
        f"install: cp {escape(plan.unit.path)} /etc/systemd/system/ && systemctl daemon-reload "
        f"&& systemctl enable --now {unit}  |  docker compose -f {escape(plan.compose.path)} up -d",
        soft_wrap=True,
    )
    return 1 if failed else 0
