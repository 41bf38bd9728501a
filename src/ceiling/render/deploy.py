"""What ``ceiling deploy`` and ``ceiling ready`` print."""

from __future__ import annotations

from pathlib import Path

from ceiling.deploy.command import DeployResult
from ceiling.deploy.ready import Ready
from ceiling.render import emit_json, esc, out


def deploy(result: DeployResult, json_out: bool = False) -> None:
    """The files (a dry run prints them), the validators' verdicts, how to install."""
    plan = result.plan
    if json_out:
        emit_json(result)
        return
    o = out()
    if result.dry_run:
        for f in (plan.unit, plan.compose, *plan.scripts, plan.env_file):
            o.print(f"# ---- {esc(f.path)}", soft_wrap=True)
            o.print(esc(f.content), soft_wrap=True, highlight=False)
        return
    for path in result.written:
        o.print(f"wrote {esc(path)}", soft_wrap=True)
    for note in plan.notes:
        o.print(f"note: {esc(note)}", soft_wrap=True)
    for c in result.validation:
        colour = {"passed": "green", "failed": "red", "skipped": "yellow"}[c.status]
        o.print(f"[{colour}]{c.status}[/{colour}] {c.tool} {esc(c.file)}", soft_wrap=True)
        if c.status != "passed" and c.output:
            o.print(esc(c.output), soft_wrap=True)
    unit = Path(plan.unit.path).name
    o.print(
        f"install: cp {esc(plan.unit.path)} /etc/systemd/system/ && systemctl daemon-reload "
        f"&& systemctl enable --now {unit}  |  docker compose -f {esc(plan.compose.path)} up -d",
        soft_wrap=True,
    )


def ready(result: Ready, json_out: bool = False) -> None:
    if json_out:
        emit_json(result)
        return
    out().print(
        f"ready: {esc(result.url)} ({', '.join(result.paths)}) after {result.ready_s:.1f} s"
    )
