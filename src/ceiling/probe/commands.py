"""The probe group's commands as library functions: run, save files, print or emit JSON.

The CLI module parses options and calls exactly one of these; tests call them directly too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ceiling.console import console, dumps, emit_json
from ceiling.errors import CeilingError
from ceiling.inputs import check_out_file


def _check_outputs(**paths: Path | None) -> None:
    """Every output path is writable before anything is measured (option name -> path)."""
    for option, path in paths.items():
        check_out_file(path, "--" + option)


def _write(path: Path | None, obj: Any) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(dumps(obj) + "\n")
        console().print(f"wrote {path}")


def probe_command(as_json: bool, out: Path | None) -> int:
    from ceiling.probe import render
    from ceiling.probe.topology import probe

    _check_outputs(out=out)
    topo = probe()
    _write(out, topo)
    if as_json:
        emit_json(topo)
    else:
        render.topology(topo)
    return 0


def telemetry_command(
    duration_s: float, interval_ms: float, as_json: bool, out: Path | None
) -> int:
    from ceiling.probe import render
    from ceiling.probe.telemetry import record

    if not duration_s > 0 or duration_s == float("inf"):
        raise CeilingError(f"--duration {duration_s:g} is not a positive time", fix="--duration 10")
    if not 10 <= interval_ms <= 1000:
        raise CeilingError(f"--interval-ms {interval_ms:g} is out of range", fix="10 to 1000 ms")
    _check_outputs(out=out)
    series = record(duration_s, interval_ms / 1000)
    if not series.available:
        raise CeilingError(
            f"no telemetry: {series.reason}",
            fix="run on a machine with an NVIDIA driver and `pip install 'ceiling[gpu]'`",
        )
    summary = series.summary(label="the sampled window")
    _write(out, {"summary": summary, "series": series})
    if as_json:
        emit_json({"summary": summary, "series": series})
    else:
        render.telemetry(summary)
    return 0


def commbench_command(
    cfg: Any, as_json: bool, out: Path | None, results: Path | None, merge: Path | None
) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from ceiling.probe import render
    from ceiling.probe.commbench import run_commbench, to_profile
    from ceiling.spec.profile import load_profile, save_profile

    _check_outputs(out=out, results=results)
    base = load_profile(merge) if merge else None
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console(),
        transient=True,
    ) as prog:
        tasks: dict[str, Any] = {}

        def on_progress(label: str, done: int, total: int) -> None:
            if label not in tasks:
                tasks[label] = prog.add_task(f"allreduce {label}", total=total)
            prog.update(tasks[label], completed=done)

        def checkpoint(partial: Any, final: bool = False) -> None:
            if results is not None:
                results.parent.mkdir(parents=True, exist_ok=True)
                results.write_text(dumps(partial) + "\n")
            if out is not None:
                prof = to_profile(partial)
                save_profile(base.merge(prof) if base is not None else prof, out)
            if final:
                for p in (results, out):
                    if p is not None:
                        console().print(f"wrote {p}")

        res = run_commbench(cfg, on_progress, checkpoint)
    checkpoint(res, final=True)
    if as_json:
        emit_json(res)
    else:
        render.commbench(res)
    failed = [r.error for r in res.runs if r.error]
    if failed and len(failed) == len(res.runs):
        raise CeilingError(
            f"every commbench run failed; first: {failed[0]}", fix=_nccl_fix(failed[0])
        )
    if not res.all_correct:
        raise CeilingError(
            "an allreduce returned a wrong sum (see the 'check' column)",
            fix="suspect the driver/P2P path of that variant; retry with NCCL_P2P_DISABLE=1",
        )
    return 1 if failed else 0


def _nccl_fix(error: str) -> str:
    if "No module named 'torch'" in error:
        return "install torch in the python that runs the ranks (--python)"
    return "read the quoted rank log lines; NCCL_DEBUG=INFO in --env shows NCCL's own view"


def calibrate_command(
    cfg: Any,
    as_json: bool,
    out: Path | None,
    results: Path | None,
    merge: Path | None,
    ops_cfg: Any = None,
) -> int:
    from ceiling.probe import render
    from ceiling.probe.calibrate import run_calibrate, to_profile
    from ceiling.spec.profile import load_profile, save_profile

    _check_outputs(out=out, results=results)
    base = load_profile(merge) if merge else None
    ops_res = None
    with console().status("calibrating") as status:
        res = run_calibrate(cfg, lambda msg: status.update(f"calibrate: {msg}"))
        if ops_cfg is not None:
            from ceiling.probe.calibrate_ops import run_ops

            ops_res = run_ops(ops_cfg, lambda msg: status.update(f"calibrate --ops: {msg}"))
    _write(results, res if ops_res is None else {"calibrate": res, "ops": ops_res})
    prof = to_profile(res)
    if ops_res is not None:
        from ceiling.probe.calibrate_ops import to_profile_ops

        prof = prof.merge(to_profile_ops(ops_res))
    if base is not None:
        prof = base.merge(prof)
    if out is not None:
        save_profile(prof, out)
        console().print(f"wrote profile {out}")
    if as_json:
        emit_json({"result": res, "ops": ops_res, "profile": prof})
    else:
        render.calibrate(res, _datasheet_bw(prof.gpu))
        if ops_res is not None:
            render.calibrate_ops(ops_res)
    return 0


def _datasheet_bw(gpu: str | None) -> float | None:
    if not gpu:
        return None
    try:
        from ceiling.spec.hardware import load_gpu

        return load_gpu(gpu).mem_bw_GBps
    except Exception:
        return None
