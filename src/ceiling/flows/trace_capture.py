"""``ceiling trace capture --url ...``: record one window of a running server's decode steps
through its own profiler, read it back, and write ``capture.json`` (the window, its split).

The engine (``--engine``, else what ``/v1/models`` says owns the model) picks the adapter that
knows how to ask for a window (``Engine.profiler``). Where the files land: SGLang writes into
the directory the request names (``--out``'s ``traces/``); vLLM into the ``torch_profiler_dir``
it was started with, which only ``--trace-dir`` can tell (the files must be readable here).
"""

from __future__ import annotations

from pathlib import Path

from ceiling.console import dumps
from ceiling.engines import get_engine
from ceiling.errors import CeilingError
from ceiling.flows.target import engine_of, served_models, server_version
from ceiling.inputs import base_url
from ceiling.outputs import write_atomic
from ceiling.trace.capture import TraceCapture, capture_window, engine_steps


def capture(
    url: str,
    out: Path,
    steps: int = 32,
    streams: int = 1,
    ranks: int = 1,
    engine: str | None = None,
    engine_version: str | None = None,
    model: str | None = None,
    trace_dir: Path | None = None,
) -> TraceCapture:
    """Record and read one window; write ``out/capture.json``. A server whose profiler is off
    is a result with ``why_not`` (the flag or variable that turns it on), not an error."""
    if steps < 2:
        raise CeilingError(
            f"bad --steps {steps}: a step ends where the next begins", fix="--steps 32"
        )
    if streams < 1 or ranks < 1:
        raise CeilingError("--streams and --ranks count from 1", fix="--streams 1 --ranks 1")
    url = base_url(url)
    models = served_models(url)
    name = engine or (engine_of(models[0]) if models else None)
    if not name:
        raise CeilingError(
            f"{url} does not say which engine it runs", fix="pass --engine vllm (or sglang)"
        )
    adapter = get_engine(str(name))
    served = model or (models[0].id if models else "")
    folder = Path(trace_dir) if trace_dir else out / "traces"
    if engine_version is None and adapter.version_path:  # the form for the server's version
        engine_version = server_version(url, adapter.version_path)
    setup = adapter.profiler(engine_version, folder, engine_steps(steps), prefix="capture")
    if setup.supported and not setup.works_unlaunched and trace_dir is None:
        raise CeilingError(
            f"{adapter.display_name} writes its traces where it was started to "
            "(torch_profiler_dir); ceiling cannot find them without it",
            fix="pass --trace-dir DIR: the directory the server writes its traces into ("
            + setup.enable_hint
            + ")",
        )
    out.mkdir(parents=True, exist_ok=True)
    extra = {adapter.ignore_eos_field: True} if adapter.ignore_eos_field else {}
    res = capture_window(
        url,
        served,
        setup,
        steps,
        streams=streams,
        ranks=ranks,
        label="capture",
        extra_body=extra,
    )
    write_atomic(out / "capture.json", dumps(res) + "\n", what="trace capture")
    return res
