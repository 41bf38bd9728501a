"""What ``ceiling sanity`` prints: the verdict, then each check with its evidence."""

from __future__ import annotations

from ceiling.render import emit_json, esc, out
from ceiling.sanity.report import SanityReport


def report(result: SanityReport, json_out: bool = False) -> None:
    if json_out:
        emit_json(result)
        return
    o = out()
    colour = {"ok": "green", "suspect": "yellow", "broken": "red"}[result.verdict]
    o.print(f"[bold {colour}]{esc(result.headline)}[/bold {colour}]", soft_wrap=True)
    o.print(
        f"model {esc(result.model)} at {esc(result.url)}; family {result.family} "
        f"({esc(result.family_reason)}); {result.seconds:.1f} s"
    )
    for c in result.checks:
        cc = {"ok": "green", "suspect": "yellow", "broken": "red"}.get(c.status, "dim")
        o.print(f"  [{cc}]{c.status:>7}[/{cc}] {c.name}: {esc(c.summary)}", soft_wrap=True)
        for line in c.evidence[:5]:
            o.print(f"          | {esc(line)}", soft_wrap=True)
