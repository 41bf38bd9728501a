"""What ``ceiling env`` prints: the verdict line, the stack, every problem with its evidence."""

from __future__ import annotations

from ceiling.envcheck.models import EnvReport
from ceiling.render import emit_json, esc, out


def env(report: EnvReport, json_out: bool = False) -> None:
    if json_out:
        emit_json(report)
        return
    o = out()
    verdict = "[green]ok[/green]" if report.ok else "[red]FAIL[/red]"
    torch = f"torch {report.torch_version}" if report.torch_version else "no torch"
    if report.torch_cuda:
        torch += f" (CUDA {report.torch_cuda})"
    engines = ", ".join(report.engines) or "no engine"
    o.print(
        f"{verdict} {esc(report.python)}: Python {report.python_version}, {torch}, {engines}; "
        f"{report.dists_checked} distributions, {report.binaries_checked} binaries "
        f"({'cached' if report.binaries_cached else 'loaded'}), TP={report.tp}, "
        f"{report.elapsed_s:.2f} s",
        soft_wrap=True,
    )
    if report.driver.version or report.gpus:
        gpus = ", ".join(f"{g.name} (sm_{g.capability})" for g in report.gpus) or "no GPU"
        o.print(f"   driver {report.driver.version} (CUDA {report.driver.cuda}); {gpus}")
    for note in report.notes:
        o.print(f"   note: {esc(note)}", soft_wrap=True)
    for p in report.problems:
        colour = {"error": "red", "warning": "yellow", "info": "cyan"}[p.level]
        o.print(f"   [{colour}]{p.level}[/{colour}] {esc(p.what)}", soft_wrap=True)
        for ev in p.evidence:
            o.print(f"      evidence: {esc(ev)}", soft_wrap=True)
        if p.fix:
            o.print(f"      fix: {esc(p.fix)}", soft_wrap=True)
