"""What the engine commands print: preflight, launch, shm, stop, inspect."""

from __future__ import annotations

from ceiling.console import say
from ceiling.diagnose.facts import EngineFacts
from ceiling.engines.preflight_model import PreflightRun
from ceiling.render import console, emit_json, esc, out
from ceiling.run.guard import StopReport
from ceiling.run.launcher import Server, StopResult
from ceiling.run.shm import ShmReport


def preflight(run: PreflightRun, json_out: bool = False) -> None:
    if json_out:
        emit_json(run)
        return
    o = out()
    for r in run.reports:
        verdict = "[green]ok[/green]" if r.ok else "[red]FAIL[/red]"
        cache = "cached flags" if r.cache_hit else "flags read from the engine"
        o.print(
            f"{verdict} {r.variant}: {r.engine} {r.engine_version}, {r.flags_checked} flags, "
            f"{r.env_checked} env vars checked ({cache}, {r.elapsed_s:.2f} s)"
        )
        for note in r.notes:
            o.print(f"   note: {esc(note)}", soft_wrap=True)
        for p in r.problems:
            colour = "red" if p.level == "error" else "yellow"
            o.print(f"   [{colour}]{p.level}[/{colour}] {esc(p.message)}", soft_wrap=True)
            if p.fix:
                o.print(f"      fix: {esc(p.fix)}", soft_wrap=True)


def launch_ready(server: Server, json_out: bool = False) -> None:
    """A launched server is ready: where, what, how long it took (``--json``: its info)."""
    if json_out:
        emit_json(server.info())
        return
    for note in server.notes:
        say(f"note: {note}")
    console().print(
        f"[green]ready[/green] {esc(server.variant.name)} at {server.url} "
        f"(model {esc(repr(server.model))}) in {server.ready_s or 0.0:.1f} s; "
        f"log: {esc(server.log_path)}"
    )
    key_note = server.key_note()
    if key_note:
        say(f"note: {key_note}")


def launch_serving(server: Server) -> None:
    say("serving; Ctrl-C stops it")


def launch_stopped(server: Server, result: StopResult) -> None:
    say(
        f"stopped {server.variant.name}: signals {result.signals or 'none'}, "
        f"port {'free' if result.port_free else 'STILL IN USE'}"
    )


def shm(report: ShmReport, json_out: bool = False) -> None:
    if json_out:
        emit_json(report)
        return
    o = out()
    recs = [r for r in report.orphans if r.pid in report.orphaned_engines]
    if recs:
        o.print(
            f"{len(recs)} engine server(s) outlived the ceiling that launched them "
            f"({', '.join(f'{r.variant} pid {r.pid} port {r.port}' for r in recs)}): "
            "`ceiling stop` ends them and frees their segments"
        )
    if not report.segments:
        o.print(f"no engine/NCCL segments in {esc(report.root)}")
        return
    for seg in report.segments:
        state = f"in use by pid {seg.in_use_by}" if seg.in_use_by else "stale"
        if any(pid in report.orphan_of for pid in seg.in_use_by):
            state += ", an orphaned engine: `ceiling stop`"
        mark = "removed" if seg.path in report.removed else state
        o.print(f"{seg.size_bytes / 2**20:10.1f} MiB  {esc(seg.path)}  ({esc(mark)})")
    stale = [s for s in report.segments if s.stale]
    if not report.applied:
        o.print(
            f"{len(stale)} stale segment(s), {report.stale_bytes / 2**20:.1f} MiB; "
            "dry run: `ceiling shm --apply` removes them"
        )
    else:
        o.print(f"removed {len(report.removed)} segment(s)")
        for path, why in report.failed.items():
            o.print(f"could not remove {esc(path)}: {esc(why)}")
    if report.unreadable_pids:
        o.print(f"note: {report.unreadable_pids} process(es) could not be inspected")


def stop(report: StopReport, json_out: bool = False) -> None:
    if json_out:
        emit_json(report)
        return
    o = out()
    for d in report.stopped:
        state = "stopped" if not d.leftover_pids else f"STILL RUNNING {d.leftover_pids}"
        o.print(
            f"{esc(d.variant)} (pid {d.pid}, port {d.port}): {state} "
            f"({', '.join(d.signals) or 'already gone'})"
        )
    if not report.stopped:
        o.print("no orphaned engine servers")
    if report.left_running:
        o.print(
            f"{len(report.left_running)} server(s) belong to a running ceiling "
            f"(pids {[r.pid for r in report.left_running]}): `ceiling stop --all` stops them too"
        )


def inspect(facts: EngineFacts, json_out: bool = False) -> None:
    """A start-up log's facts (a key column and a value column that wraps), then each finding
    with its evidence, advice (or why it is withheld) and its page, indented under it: every
    line fits the terminal (80 columns included)."""
    if json_out:
        emit_json(facts)
        return
    from rich.table import Table

    o = out()
    skip = {"findings", "evidence", "warnings", "errors", "non_default_args", "schema_version"}
    skip.add("start_failure")
    grid = Table.grid(padding=(0, 1))
    grid.add_column(justify="right", no_wrap=True)
    grid.add_column(overflow="fold")
    for key, value in facts.model_dump().items():
        if key in skip or value in (None, [], {}):
            continue
        grid.add_row(f"{key}:", esc(value))
    if facts.non_default_args:
        grid.add_row("non_default_args:", esc(facts.non_default_args))
    grid.add_row("warnings/errors:", f"{len(facts.warnings)} / {len(facts.errors)}")
    o.print(grid)
    died = facts.start_failure
    if died is not None:
        o.print(f"[red]the server did not start[/red]: {esc(died.cause)}")
        for line in died.evidence[:3]:
            _under(f"| {esc(line)}")
        for note in died.removed_flags:
            _under(esc(note))
        if died.fix:
            _under(f"fix: {esc(died.fix)}")
    for f in facts.findings:
        colour = {"critical": "red", "warning": "yellow"}.get(f.severity, "cyan")
        o.print(f"[{colour}]{f.severity}[/{colour}] {esc(f.title)} ({f.kind})")
        for line in f.evidence[:3]:
            _under(f"| {esc(line)}")
        if f.fix:
            _under(f"fix: {esc(f.fix)}")
        elif f.withheld:
            _under(esc(f.withheld))
        if f.doc:
            _under(f"why and what to do: {f.doc}")


def _under(markup: str) -> None:
    """A line under a finding, indented; it wraps (long words fold) under its own indent."""
    from rich.padding import Padding

    out().print(Padding(markup, (0, 0, 0, 4), expand=False), overflow="fold")
