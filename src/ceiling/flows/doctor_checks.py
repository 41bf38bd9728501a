"""Doctor's input, checked before anything is launched or requested, and its exit code.

A doctor run may start with a model load of many minutes: every option, path and name is
checked first (``DoctorConfig``'s bounds through :func:`ceiling.inputs.model_from_options`,
then :func:`check_config`), so a typo costs a second. At the end,
:func:`outcome` turns the result into the exit code: a doctor whose requests all failed, or
whose server died, did not measure what it claims and must not exit 0.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from ceiling.bench.config import BenchConfig
from ceiling.bench.failures import OVERFLOW_FIX, failure_statement
from ceiling.bench.slo import Slo
from ceiling.diagnose.schema import BenchMode, DoctorConfig, DoctorResult
from ceiling.engines import engine_names
from ceiling.engines.variant import Variant, load_variant
from ceiling.errors import CeilingError, ExitStatus
from ceiling.inputs import base_url, check_out_dir, check_server_url, read_text
from ceiling.spec.hardware import load_gpu
from ceiling.spec.model import catalog_name, did_you_mean

#: DoctorConfig field -> the CLI option that sets it, where the two names differ
OPTION_NAMES = {
    "launch_timeout_s": "--ready-timeout",
    "stall_timeout_s": "--stall-timeout",
    "target_tok_s": "--target",
    "out_dir": "--out-dir",
    "model_path": "--model",
}


def check_config(cfg: DoctorConfig) -> None:
    """Every option that names something (server, files, catalog entries) is checked here,
    before the first launch or request; raises CeilingError (exit 2) for the first bad one."""
    if not cfg.url and not cfg.variant:
        raise CeilingError(
            "doctor needs a server to examine",
            fix="pass --url http://HOST:PORT (running) or --variant FILE (launch)",
        )
    if cfg.accept_broken_output and not cfg.sanity:
        raise CeilingError(
            "--accept-broken-output and --no-sanity both given",
            fix="keep --accept-broken-output (the gate runs and its verdict is recorded), "
            "drop --no-sanity",
        )
    if cfg.url and cfg.variant:
        raise CeilingError(
            "--url and --variant both given: doctor examines one server",
            fix="pass --url for a running server, or --variant to launch one (not both)",
        )
    if cfg.llama_bench:  # read now: a bad file must not cost a model load
        from ceiling.engines.llamacpp_gap import read_llama_bench

        read_llama_bench(cfg.llama_bench)
    if cfg.profile:  # read now too
        _check_profile(
            cfg.profile, cfg.engine or (load_variant(cfg.variant).engine if cfg.variant else None)
        )
    if cfg.url:
        cfg.url = base_url(cfg.url)  # as bench reads it: scheme added, a trailing /v1 dropped
        check_server_url(cfg.url)
    if cfg.log:
        if cfg.variant:
            raise CeilingError(
                "--log is for a running server (--url); a launched server's log is captured",
                fix="drop --log when you pass --variant",
            )
        read_text(cfg.log, "--log", fix="pass the running server's log file, or drop --log")
    if cfg.variant:
        load_variant(cfg.variant)  # a malformed variant fails here, not after a probe
    if cfg.model_path:
        _check_model_path(cfg.model_path)
    if cfg.gpu:
        load_gpu(cfg.gpu)
    if cfg.engine and cfg.engine.lower() not in engine_names():
        raise CeilingError(
            f"--engine {cfg.engine!r} is not an engine ceiling knows",
            fix="one of: " + ", ".join(engine_names()),
        )
    check_out_dir(cfg.out_dir, "--out-dir")


def _check_profile(path: str, engine: str | None) -> None:
    """The --profile file reads, and its llama.cpp entry too where it has one. A target known
    (--engine, the variant) to serve a GGUF reads nothing but that entry (its prediction and the
    bandwidth split are llama.cpp's kernels), so a profile without it is refused here, by name,
    rather than after a model load. A target detected later meets the same words there."""
    from ceiling.diagnose.expect import serves_gguf
    from ceiling.predict.llamacpp_files import load_kernels
    from ceiling.spec.profile import load_profile

    if "llamacpp" in load_profile(path).engine:
        load_kernels(path)
    elif serves_gguf(engine, None):
        raise CeilingError(
            f"--profile {path} has no engine.llamacpp entry: on {engine} the prediction and the "
            "bandwidth verdict read llama.cpp's own kernels, and this profile holds none",
            fix=f"add them on this GPU: `ceiling calibrate --engine llamacpp --merge {path} "
            "--out FILE`, then pass --profile FILE (or drop --profile)",
        )


def _check_model_path(value: str) -> None:
    if catalog_name(value) is not None:
        return
    p = Path(value).expanduser()
    if p.is_dir() and not (p / "config.json").is_file():
        raise CeilingError(
            f"--model {p}: no config.json in that directory",
            fix="pass a model directory, its config.json, or a catalog name (predict --list-models)",
        )
    if not p.exists():
        raise CeilingError(
            f"--model {value!r}: not a catalog name, file or directory{did_you_mean(value)}",
            fix="pass a model directory, its config.json, or a catalog name (predict --list-models)",
        )


def completed_requests(res: DoctorResult) -> int | None:
    """Requests that completed over the bench stages that ran (None: no bench ran)."""
    if not res.bench:
        return None
    return sum(lv.completed for b in res.bench.values() for lv in (b.levels or [b]))


def outcome(res: DoctorResult) -> tuple[ExitStatus, str | None]:
    """(exit code, why it is not 0): 1 when the server died, no request completed, or more than
    ``--max-failed-pct`` of a stage's requests failed; 2 when the context overflowed (the
    lengths asked do not fit the server)."""
    if res.server_died:
        return ExitStatus.FAILED, f"the server died {res.server_death}"
    failed = bench_failure(res)
    return failed if failed is not None else (ExitStatus.OK, None)


def bench_failure(res: DoctorResult) -> tuple[ExitStatus, str] | None:
    """Why the measurement failed, so that no verdict is drawn from it (None: it did not; a
    server that died mid-run is the flow's own case and words its verdict itself)."""
    overflow = next((b.context_overflow for b in res.bench.values() if b.context_overflow), None)
    if overflow:
        return ExitStatus.INPUT, f"{overflow}; fix: {OVERFLOW_FIX}"
    if completed_requests(res) == 0:
        errors: dict[str, int] = {}
        for b in res.bench.values():
            for k, v in b.errors.items():
                errors[k] = errors.get(k, 0) + int(v)
        return ExitStatus.FAILED, f"no request completed (errors: {errors or 'none recorded'})"
    for mode, b in res.bench.items():
        if b.partial and not b.stalled:
            continue  # a stage cut short (the server died, Ctrl-C): said by the flow
        why = failure_statement(b, res.config.max_failed_pct)
        if why:
            return ExitStatus.FAILED, f"bench {mode}: {why}"
    return None


__all__ = [
    "OPTION_NAMES",
    "bench_command",
    "bench_config",
    "bench_failure",
    "check_config",
    "completed_requests",
    "doctor_command",
    "outcome",
    "reproduce",
]


def bench_config(
    cfg: DoctorConfig, url: str, model: str | None, mode: BenchMode, out: Path | None
) -> BenchConfig:
    """The bench a doctor stage runs (``mode``: single stream, or the concurrency sweep;
    ``model`` None: the server's first, as bench finds it)."""
    # what every doctor bench shares; the doctor samples telemetry itself and keeps the series
    common: dict[str, Any] = {
        "url": url,
        "model": model,
        "input_len": cfg.input_len,
        "save_detailed": True,
        "out": out,
        "stall_timeout": cfg.stall_timeout_s,
    }
    if mode == "single":
        return BenchConfig(
            **common,
            mode="single",
            max_tokens=cfg.max_tokens,
            repeat=cfg.repeat,
            warmup=cfg.warmup,
            telemetry=False,
        )
    return BenchConfig(
        **common,
        mode="concurrency",
        concurrency=cfg.concurrency,
        max_tokens=cfg.concurrency_max_tokens,
        requests=cfg.concurrency_requests,
        repeat=1,
        warmup=0,
        # the levels' goodput is the verdict's capacity line (ceiling.diagnose.closed_loop)
        slo=cfg.slo,
    )


#: DoctorConfig fields that no doctor option sets (the API's), or that change what is shown,
#: not what is measured (--quiet, --json): a Reproduce line cannot and need not carry them
_NO_OPTION = frozenset(
    {"url", "variant", "warmup", "concurrency_requests", "flag_hypotheses", "progress"}
)
#: written even at their defaults: the line says how long and where
_ALWAYS = frozenset({"max_tokens", "repeat", "concurrency", "out_dir"})
#: a switch written when its value is not the default
_SWITCHES = {
    "telemetry": "--no-telemetry",
    "measure_cpu": "--no-measure-cpu",
    "sanity": "--no-sanity",
    "trace": "--trace",
}
_BENCH_OPTIONS = {"model": "--served-model", "timeout": "--request-timeout"}
_BENCH_SWITCHES = {
    "ignore_eos": ("--ignore-eos", "--no-ignore-eos"),
    "chat": ("--chat", ""),
    "save_detailed": ("--save-detailed", ""),
    "telemetry": ("--telemetry", ""),
}


def _word(value: object) -> str:
    if isinstance(value, list) and value and all(isinstance(v, Slo) for v in value):
        return ",".join(v.text for v in value)  # as --slo takes them back
    if isinstance(value, list):
        return ",".join(str(v) for v in value) or "none"
    return str(value)


def doctor_command(cfg: DoctorConfig, url: str) -> str:
    """The ``ceiling doctor`` command that runs ``cfg`` again: every option that differs from
    its default, so that the run it starts is this one (tests parse it with the real CLI)."""
    args = ["ceiling", "doctor", *(["--variant", cfg.variant] if cfg.variant else ["--url", url])]
    default = DoctorConfig()
    for name in DoctorConfig.model_fields:
        value = getattr(cfg, name)
        if name in _NO_OPTION or value is None:
            continue
        if value == getattr(default, name) and name not in _ALWAYS:
            continue
        if name in _SWITCHES:
            args.append(_SWITCHES[name])
        elif name == "cuda_graphs":
            args.append("--cuda-graphs" if value else "--no-cuda-graphs")
        else:
            args += [OPTION_NAMES.get(name, "--" + name.replace("_", "-")), _word(value)]
    return shlex.join(args)


def bench_command(bc: BenchConfig) -> str:
    """The ``ceiling bench`` command that runs ``bc`` again (its result file aside: a new one)."""
    args = ["ceiling", "bench", "--url", bc.url]
    default = BenchConfig(url=bc.url)
    for name in BenchConfig.model_fields:
        value = getattr(bc, name)
        if name in ("url", "out") or value is None or value == getattr(default, name):
            continue
        if name in _BENCH_SWITCHES:
            on, off = _BENCH_SWITCHES[name]
            args.append(on if value else off)
        elif name == "logit_bias":
            args += ["--logit-bias", json.dumps(value)]
        else:
            args += [_BENCH_OPTIONS.get(name, "--" + name.replace("_", "-")), _word(value)]
    return shlex.join(args)


def reproduce(cfg: DoctorConfig, url: str, model: str | None) -> list[str]:
    """The commands that re-run this doctor and its benches."""
    modes: list[BenchMode] = ["single", "concurrency"] if cfg.concurrency else ["single"]
    cmds = [doctor_command(cfg, url)]
    cmds += [bench_command(bench_config(cfg, url, model, m, None)) for m in modes]
    if cfg.variant:
        cmds.insert(0, shlex.join(["ceiling", "preflight", cfg.variant]))
    return cmds


def random_weights(res: DoctorResult, variant: Variant | None) -> str | None:
    """The engine's own word (the variant's flags, else the start-up log's arguments) that the
    served weights are random, or None."""
    from ceiling.engines import get_engine

    name = variant.engine if variant is not None else res.target.engine
    if name not in engine_names():
        return None
    argv = variant.argv() if variant is not None else []
    log_args = res.facts.non_default_args if res.facts is not None else {}
    return get_engine(name).random_weights(argv, log_args)
