"""CLI commands of the bench group: ``bench`` and ``compare`` (parse options, call, print)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import typer

from ceiling.choices import BenchMode, DatasetFormat
from ceiling.cli._vocab import renamed


def _levels(text: str | None) -> list[int] | None:
    from ceiling.errors import CeilingError

    if text is None:
        return None
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError as err:
        raise CeilingError(f"bad --concurrency {text!r}", fix="e.g. --concurrency 1,2,4,8") from err


def _logit_bias(text: str | None) -> dict[str, float] | None:
    import json

    from ceiling.errors import CeilingError

    if not text:
        return None
    try:
        value = json.loads(text)
        if not isinstance(value, dict):
            raise ValueError("not a JSON object")
        return {str(k): float(v) for k, v in value.items()}
    except (ValueError, TypeError) as err:
        raise CeilingError(
            f"bad --logit-bias {text!r}: {err}", fix="""e.g. --logit-bias '{"2": -100}'"""
        ) from err


def _given(ctx: typer.Context, options: Mapping[str, object]) -> dict[str, object]:
    """The options typed on the command line (or set in the environment), without those left
    at their defaults: BenchConfig refuses a synthetic-prompt option given with --dataset,
    and only the option's absence says it was not given (its default value may be typed)."""
    # compared by name: Typer vendors its own Click, whose ParameterSource is another enum
    sources = {name: getattr(ctx.get_parameter_source(name), "name", None) for name in options}
    return {
        name: value
        for name, value in options.items()
        if sources[name] is not None and sources[name] != "DEFAULT"
    }


def register(app: typer.Typer) -> None:
    """Add ``bench`` and ``compare`` to the app."""

    @app.command("bench")
    def bench(
        ctx: typer.Context,
        url: str = typer.Option("http://127.0.0.1:8000", "--url", help="Server root (OpenAI API)."),
        served_model: str = typer.Option(
            None, "--served-model", help="Served model name (default: from /v1/models)."
        ),
        old_model: str = typer.Option(
            None, "--model", hidden=True, help="Old spelling, kept one release (docs/cli.md)."
        ),
        mode: BenchMode = typer.Option("single", "--mode", help="How to drive the server."),
        max_tokens: int = typer.Option(
            None, "--max-tokens", help="Output tokens (single: 2048, else 256)."
        ),
        input_len: int = typer.Option(
            128, "--input-len", help="Synthetic prompt length in tokens."
        ),
        dataset: Path = typer.Option(
            None,
            "--dataset",
            dir_okay=False,
            help="Prompts from a file (JSONL or ShareGPT JSON) instead of synthetic.",
        ),
        dataset_format: DatasetFormat = typer.Option(
            "auto",
            "--dataset-format",
            help="How to read --dataset (auto: ShareGPT if a JSON list of conversations).",
        ),
        input_range: float = typer.Option(
            0.0,
            "--input-range",
            help="Draw each prompt's length within input-len x [1-R, 1+R] (0 <= R < 1).",
        ),
        output_range: float = typer.Option(
            0.0,
            "--output-range",
            help="Draw each request's max tokens within max-tokens x [1-R, 1+R].",
        ),
        prefix_len: int = typer.Option(
            0, "--prefix-len", help="Tokens at the start of every prompt, shared (prefix cache)."
        ),
        turns: int = typer.Option(
            1, "--turns", help="Requests per session, each resending the history (multi-turn)."
        ),
        concurrency: str = typer.Option(
            None, "--concurrency", help="Levels for --mode concurrency (default 1,2,4,8)."
        ),
        rate: float = typer.Option(
            None, "--rate", help="Requests/s for --mode rate (Poisson); capacity: the first."
        ),
        burstiness: float = typer.Option(
            1.0, "--burstiness", help="Gamma shape: <1 burstier, 1 Poisson."
        ),
        requests: int = typer.Option(None, "--requests", help="Requests per level."),
        duration: float = typer.Option(
            None, "--duration", help="Seconds per level (instead of --requests)."
        ),
        repeat: int = typer.Option(
            1, "--repeat", help="Repeat the whole measurement N times (CIs)."
        ),
        warmup: int = typer.Option(1, "--warmup", help="Warm-up requests, excluded."),
        ignore_eos: bool = typer.Option(
            True, "--ignore-eos/--no-ignore-eos", help="Generate exactly max_tokens."
        ),
        logit_bias: str = typer.Option(
            None,
            "--logit-bias",
            help="JSON token id -> bias, sent as is (ban EOS on servers without ignore_eos).",
        ),
        chat: bool = typer.Option(False, "--chat", help="Use /v1/chat/completions."),
        temperature: float = typer.Option(None, "--temperature", help="Sampling temperature."),
        save_detailed: bool = typer.Option(
            False, "--save-detailed", help="Keep per-request records."
        ),
        telemetry: bool = typer.Option(
            False, "--telemetry", help="Sample NVML telemetry meanwhile."
        ),
        out: Path = typer.Option(
            None,
            "--out",
            dir_okay=False,
            help="Result file (default ceiling-out/bench-<time>.json).",
        ),
        request_timeout: float = typer.Option(
            900.0, "--request-timeout", help="Seconds one request may take."
        ),
        old_timeout: float = typer.Option(
            None, "--timeout", hidden=True, help="Old spelling, kept one release (docs/cli.md)."
        ),
        stall_timeout: float = typer.Option(
            60.0, "--stall-timeout", help="Max silence in a stream, s."
        ),
        seed: int = typer.Option(0, "--seed", help="Seed for prompts and arrivals."),
        workers: int = typer.Option(
            1, "--workers", help="Load-generating processes (each its own event loop)."
        ),
        ray: str = typer.Option(
            None, "--ray", help="Ray address (auto, host:port, local): workers as Ray actors."
        ),
        as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON on stdout."),
        quiet: bool = typer.Option(False, "--quiet", help="No progress bars."),
        max_failed_pct: float = typer.Option(
            5.0, "--max-failed-pct", help="Above this share of failed requests (%) the run fails."
        ),
        slo: str = typer.Option(
            None,
            "--slo",
            help="Objectives METRIC:STAT<=TIME, e.g. ttft:p99<=500ms,itl:p90<=50ms (goodput).",
        ),
        tolerance: float = typer.Option(
            None,
            "--tolerance",
            help="Capacity: goodput may fall this share below the offered rate (default 0.05).",
        ),
        precision: float = typer.Option(
            None,
            "--precision",
            help="Capacity: stop when the knee is bracketed this close (default 0.02).",
        ),
        percentiles: str = typer.Option(
            "50,90,99", "--percentiles", help="Percentiles reported (p<N>_ttft_ms, ...)."
        ),
    ) -> None:
        """Measure a running OpenAI-compatible server: TTFT, ITL, TPOT, throughput, with CIs.

        \b
        Example:
          ceiling bench --url http://127.0.0.1:8000 --mode concurrency --concurrency 1,4,16

        API key: CEILING_API_KEY (else OPENAI_API_KEY) is sent as the Bearer token; it never
        reaches output or result files. Exit codes: 0 ok, 1 every request failed or the server
        died (partial result written), or more than --max-failed-pct of the requests failed
        (result written, no summary), 2 bad option or a context overflow, 4 server unreachable or refused, 130
        interrupted (partial result written).
        """
        import time

        from ceiling.bench.causes import failure_fix
        from ceiling.bench.config import make_config
        from ceiling.bench.failures import OVERFLOW_FIX, failure_statement
        from ceiling.bench.results import summary_dict
        from ceiling.bench.runner import run_bench
        from ceiling.bench.slo import parse_percentiles, parse_slos
        from ceiling.console import emit_json, say
        from ceiling.console import out as stdout
        from ceiling.errors import CeilingError, ExitStatus
        from ceiling.render.bench import render_result

        model = renamed(served_model, old_model, "bench --model", "--served-model")
        timeout = renamed(request_timeout, old_timeout, "bench --timeout", "--request-timeout")
        if out is None:
            out = Path("ceiling-out") / time.strftime("bench-%Y%m%d-%H%M%S.json")
        shaping = dict(
            input_len=input_len,
            input_range=input_range,
            output_range=output_range,
            prefix_len=prefix_len,
            turns=turns,
        )
        cfg = make_config(
            url=url,
            model=model,
            mode=mode,
            max_tokens=max_tokens,
            dataset=dataset,
            dataset_format=dataset_format,
            **_given(ctx, shaping),
            concurrency=_levels(concurrency),
            rate=rate,
            burstiness=burstiness,
            requests=requests,
            duration=duration,
            repeat=repeat,
            warmup=warmup,
            ignore_eos=ignore_eos,
            logit_bias=_logit_bias(logit_bias),
            chat=chat,
            temperature=temperature,
            save_detailed=save_detailed,
            telemetry=telemetry,
            out=out,
            timeout=timeout,
            stall_timeout=stall_timeout,
            seed=seed,
            workers=workers,
            ray=ray,
            max_failed_pct=max_failed_pct,
            slo=parse_slos(slo),
            tolerance=tolerance,
            precision=precision,
            percentiles=parse_percentiles(percentiles),
        )
        result = run_bench(cfg, progress=not quiet)
        why = failure_statement(result, cfg.max_failed_pct)
        if result.context_overflow:
            raise CeilingError(f"{why}; result in {out}", fix=OVERFLOW_FIX)
        if why and not result.partial:
            raise CeilingError(
                f"{why}; result in {out}",
                fix=failure_fix(result.error_messages),
                exit_code=ExitStatus.FAILED,
            )
        if as_json:
            emit_json(summary_dict(result))
        else:
            render_result(result, stdout(), str(out))
        if result.partial:
            say(f"partial result written to {out}: {result.partial_reason}")
            raise typer.Exit(ExitStatus.INTERRUPTED if result.interrupted else ExitStatus.FAILED)

    @app.command("compare")
    def compare_cmd(
        files: list[Path] = typer.Argument(
            ...,
            help="Result files of `ceiling bench`; the first is the baseline A.",
            metavar="FILE",
        ),
        metric: str = typer.Option(
            "decode_tok_s_per_stream",
            "--metric",
            help="Summary key to compare (mean_ttft_ms, mean_tpot_ms, output_throughput, ...).",
            metavar="KEY",
        ),
        as_json: bool = typer.Option(False, "--json", help="Print the comparison as JSON."),
    ) -> None:
        """Is B different from A? Delta % with a 95 % CI and a plain verdict.

        \b
        Example:
          ceiling compare before.json after.json --metric mean_ttft_ms
        """
        from ceiling.bench.compare import compare
        from ceiling.bench.results import load_result
        from ceiling.console import emit_json
        from ceiling.console import out as stdout
        from ceiling.render.bench import render_comparison

        results = [load_result(f) for f in files]
        comp = compare(results, metric=metric, labels=[f.name for f in files])
        if as_json:
            emit_json(comp)
        else:
            render_comparison(comp, stdout())
