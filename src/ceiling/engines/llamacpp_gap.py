"""llama.cpp on a GPU: how much of the memory bandwidth its kernels reach at one stream, where the
rest of the step goes, and what the server adds per token over llama-bench.

One decode step of one stream reads every weight the token needs once (the GGUF's bytes per
token, ``predict.llamacpp``). The step splits, adding up to the measured one, into

- the bound: those bytes at the datasheet bandwidth (physics; nobody changes it);
- the peak gap: the same bytes at the best mat-vec this GPU ran for llama.cpp (test-backend-ops,
  the calibrate profile's fastest type, F16 on the H200) minus the bound: what even the best
  kernel leaves of the datasheet figure (no setting changes it);
- the server: llama-server's step minus llama-bench's on the same file and settings (sampling,
  HTTP/SSE, slots): the engine's own cost, measured when a llama-bench result is at hand;
- the kernels: the rest (the file's dequantizing mat-vecs, attention, small kernels, launches):
  changed only by the quant type, flash attention, graphs, offload or another engine.

The what-ifs give numbers for what a user can change: each is the measured step plus the
difference predict --engine llamacpp gives between the change and this configuration (with the
kernel profile when there is one): the model's absolute error cancels, its sense of the change
stays. Slots do not change a one-stream step (they raise total throughput); that is said, with 0.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ceiling.errors import CeilingError
from ceiling.gap_schema import BandwidthGap, GapPart, GapWhatIf, ServerCost
from ceiling.inputs import read_json
from ceiling.predict.gguf import GgufInfo, kernel_data, read_gguf
from ceiling.predict.llamacpp import LlamaCppProfile
from ceiling.predict.llamacpp_files import load_kernels, predict_gguf
from ceiling.predict.schema import LlamaCppDetails, Prediction
from ceiling.spec.hardware import Hardware, load_gpu

if TYPE_CHECKING:
    from ceiling.engines.facts import EngineFacts


def run_gap(
    facts: EngineFacts,
    hardware: Hardware,
    step_ms: float,
    context: int,
    llama_bench: str | None,
    profile: str | None,
) -> BandwidthGap | None:
    """The split of a doctor run's single-stream step on llama-server with a GPU (reads the
    served GGUF's header, the llama-bench rows and the profile): None on a CPU."""
    if hardware.kind != "gpu":
        return None
    if not facts.model or not Path(facts.model).is_file():
        raise CeilingError(
            f"the served GGUF {facts.model!r} is not readable here",
            fix="run the doctor where the GGUF file is",
        )
    cost = None
    if llama_bench:
        cost = server_cost(
            step_ms,
            read_llama_bench(llama_bench),
            facts.model,
            facts.flash_attention,
            source=llama_bench,
        )
    return bandwidth_gap(
        read_gguf(facts.model),
        step_ms,
        hardware.name,
        load_gpu(hardware.name).mem_bw_GBps,
        context=context,
        flash_attention=facts.flash_attention is not False,
        cuda_graphs=facts.enforce_eager is not True,
        gpu_layers=facts.gpu_layers,
        gpu_layers_total=facts.gpu_layers_total,
        profile=load_kernels(profile) if profile else None,
        server=cost,
    )


def read_llama_bench(path: str | Path) -> list[dict[str, Any]]:
    """The rows of ``llama-bench -o json``."""
    p = Path(path)
    rows = read_json(p, "--llama-bench", fix="pass the output of `llama-bench -o json`")
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise CeilingError(
            f"{p} is not llama-bench JSON (a list of rows)",
            fix="pass the output of `llama-bench -o json`",
        )
    return rows


def server_cost(
    server_step_ms: float,
    bench_rows: list[dict[str, Any]],
    model_file: str | None,
    flash_attention: bool | None,
    source: str = "llama-bench",
) -> ServerCost:
    """The row of the same GGUF (by file name) and flash-attention setting, generating at depth 0
    (tg: n_prompt 0), against the server's measured step. Refuses rather than compare two files
    or two settings."""
    name = Path(model_file).name if model_file else None

    def same(r: dict[str, Any]) -> bool:
        return (
            (name is None or Path(str(r.get("model_filename", ""))).name == name)
            and int(r.get("n_gen", 0) or 0) > 0
            and int(r.get("n_prompt", 0) or 0) == 0
            and int(r.get("n_depth", 0) or 0) == 0
            and (flash_attention is None or bool(r.get("flash_attn")) == flash_attention)
            and float(r.get("avg_ts", 0) or 0) > 0
        )

    rows = [r for r in bench_rows if same(r)]
    if not rows:
        raise CeilingError(
            f"no llama-bench row for {name or 'the served file'} generating at depth 0 with "
            f"flash attention {'on' if flash_attention else 'off'}",
            fix="run `llama-bench -m FILE -ngl 99 -fa 1 -p 0 -n 128 -o json` on the same file",
        )
    bench_ms = 1000.0 / float(rows[0]["avg_ts"])
    added = server_step_ms - bench_ms
    return ServerCost(
        server_step_ms=server_step_ms,
        bench_step_ms=bench_ms,
        added_ms=added,
        added_pct=added / bench_ms * 100,
        source=source,
        server="llama-server",
        bench="llama-bench",
    )


def retyped(info: GgufInfo, type_name: str) -> GgufInfo:
    """The same file with every quantized or 16-bit weight matrix in ``type_name`` (norms and
    router weights stay F32, as llama.cpp's quantize keeps them)."""
    tensors = [
        t.model_copy(update={"type": type_name}) if t.type != "F32" and len(t.shape) >= 2 else t
        for t in info.tensors
    ]
    return info.model_copy(update={"tensors": tensors})


def _llamacpp(pred: Prediction) -> LlamaCppDetails:
    lc = pred.details.llamacpp
    assert lc is not None  # predict_gguf always fills it
    return lc


def _main_type(pred: Prediction) -> str | None:
    w = _llamacpp(pred).weights
    return max(w, key=lambda r: r.bytes).type if w else None


def bandwidth_gap(
    info: GgufInfo,
    step_ms: float,
    gpu: str,
    datasheet_GBps: float,
    context: int,
    flash_attention: bool = True,
    cuda_graphs: bool = True,
    gpu_layers: int | None = None,
    gpu_layers_total: int | None = None,
    profile: LlamaCppProfile | None = None,
    server: ServerCost | None = None,
) -> BandwidthGap:
    """The one-stream verdict of a llama.cpp GPU run (module docstring)."""

    def pred(i: GgufInfo, fa: bool = flash_attention, g: bool = cuda_graphs) -> Prediction:
        return predict_gguf(i, gpu, datasheet_GBps, context, g, fa, profile=profile)

    here = pred(info)
    nbytes = _llamacpp(here).bytes_per_token
    achieved = nbytes / step_ms / 1e6
    bound = nbytes / (datasheet_GBps * 1e6)
    peak = (
        max(profile.matvec.values(), key=lambda r: r.GBps) if profile and profile.matvec else None
    )
    parts = [
        GapPart(
            name="bound",
            ms=bound,
            who="nobody",
            why=f"{nbytes / 1e9:.2f} GB per token at the datasheet "
            f"{datasheet_GBps / 1000:.2f} TB/s",
        )
    ]
    floor = bound
    if peak is not None and peak.GBps < datasheet_GBps:
        floor = nbytes / (peak.GBps * 1e6)
        parts.append(
            GapPart(
                name="peak gap",
                ms=floor - bound,
                who="nobody",
                why=f"the best llama.cpp mat-vec measured on this GPU ({peak.type}, "
                f"{peak.GBps / 1000:.2f} TB/s) vs the datasheet",
            )
        )
    rest = step_ms - floor
    if server is not None:
        parts.append(
            GapPart(
                name="server",
                ms=server.added_ms,
                who="engine",
                why=f"llama-server {server.server_step_ms:.3f} ms vs llama-bench "
                f"{server.bench_step_ms:.3f} ms per token: sampling, HTTP/SSE, "
                "slots",
            )
        )
        rest -= server.added_ms
    typ = _main_type(here)

    src = f"predict --engine llamacpp delta ({here.evidence.tables}) on the measured step"
    ifs: list[GapWhatIf] = []

    here_ms = here.decode_ms_per_token

    def add(lever: Any, change: str, other: Prediction | float, source: str = src) -> None:
        delta = (other.decode_ms_per_token if isinstance(other, Prediction) else other) - here_ms
        ifs.append(
            GapWhatIf(
                lever=lever,
                change=change,
                step_ms=step_ms + delta,
                saves_ms=0.0 - delta,
                source=source,
            )
        )

    types = sorted(profile.matvec) if profile and profile.matvec else ["F16", "Q8_0", "Q4_K"]
    for t in types:
        if t != typ and t in kernel_data().types:
            add(
                "quant type",
                f"every weight matrix {t} (this file: mostly {typ})",
                pred(retyped(info, t)),
            )
    add(
        "flash attention",
        "flash attention on" if not flash_attention else "flash attention on (already on)",
        pred(info, fa=True),
    )
    add(
        "cuda graphs",
        "CUDA graphs on" if not cuda_graphs else "CUDA graphs on (already on)",
        pred(info, g=True),
    )
    if gpu_layers is not None and gpu_layers_total and gpu_layers < gpu_layers_total:
        # the host's share is not in predict's GPU model: the estimate is the whole file on the
        # GPU as predicted, the step of the part on the CPU is what it saves
        ifs.append(
            GapWhatIf(
                lever="offload",
                change=f"all {gpu_layers_total} layers on the GPU (now {gpu_layers})",
                step_ms=here_ms,
                saves_ms=step_ms - here_ms,
                source=f"predict --engine llamacpp ({here.evidence.tables})",
            )
        )
    else:
        add("offload", "all layers on the GPU (already)", here_ms)
    add(
        "slots",
        "more slots (--parallel): no change to a one-stream step; they raise total "
        "throughput at several streams",
        here_ms,
    )
    if server is not None:
        ifs.append(
            GapWhatIf(
                lever="engine",
                change="the kernels without llama-server's per-token work (llama-bench's step)",
                step_ms=server.bench_step_ms,
                saves_ms=server.added_ms,
                source=server.source,
            )
        )

    for w in ifs:  # a setting this run has off: the user's part of the gap, its what-if's saving
        if w.lever in ("flash attention", "cuda graphs", "offload") and w.saves_ms > 0:
            parts.append(
                GapPart(name=w.lever, ms=w.saves_ms, who="user", why=f"{w.change}: its what-if")
            )
            rest -= w.saves_ms
    parts.append(
        GapPart(
            name="kernels",
            ms=rest,
            who="engine",
            why=f"llama.cpp's kernels at this file's types (mostly {typ}: "
            "dequantizing mat-vec, attention, small kernels) beyond the best "
            "mat-vec; changed by the quant type or another engine"
            + ("" if rest >= 0 else "; negative: the what-ifs above overstate"),
        )
    )
    pk = peak.GBps if peak is not None else None
    best = max((w for w in ifs if w.lever != "engine"), key=lambda w: w.saves_ms)
    sentence = (
        f"At one stream llama.cpp reads {nbytes / 1e9:.2f} GB per token in {step_ms:.3f} ms: "
        f"{achieved / 1000:.2f} TB/s, {achieved / datasheet_GBps * 100:.0f} % of the datasheet "
        f"{datasheet_GBps / 1000:.1f} TB/s"
        + (
            f" ({achieved / pk * 100:.0f} % of the best llama.cpp mat-vec measured here, "
            f"{pk / 1000:.2f} TB/s)"
            if pk
            else ""
        )
        + f". Of the {step_ms - bound:.3f} ms above the bound, "
        + ", ".join(f"{p.name} {p.ms:.3f} ms ({p.who})" for p in parts[1:])
        + f"; the best setting a user can change: {best.change} (saves {best.saves_ms:.3f} ms)"
        + (
            f"; llama-server adds {server.added_ms:.3f} ms per token over llama-bench "
            f"(+{server.added_pct:.0f} %)."
            if server
            else "."
        )
    )
    return BandwidthGap(
        engine="llama.cpp",
        step_ms=step_ms,
        bytes_per_step=nbytes,
        achieved_GBps=achieved,
        datasheet_GBps=datasheet_GBps,
        pct_of_datasheet=achieved / datasheet_GBps * 100,
        measured_peak_GBps=pk,
        measured_peak_type=peak.type if peak else None,
        pct_of_measured_peak=achieved / pk * 100 if pk else None,
        bound_ms=bound,
        parts=parts,
        what_ifs=ifs,
        server=server,
        sentence=sentence,
    )
