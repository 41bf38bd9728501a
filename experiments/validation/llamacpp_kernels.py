"""llama.cpp's decode kernels timed inside its CUDA graph on the H200, against its step.

    .venv/bin/python experiments/validation/llamacpp_kernels.py \
        [--call experiments/results/2026-12-02_h200-llamacpp/call5] [--out FILE.json]

Reads what `NCU=1 experiments/gpu/llamacpp_heldout.sh` recorded for each file: Nsight Compute's
per-kernel duration (`gpu__time_duration.sum`, clocks and L2 left as the run had them) of every
kernel of a short llama-bench decode run (`ncu-FILE.csv.gz`), and the same call's tg128 step
(`bench-FILE.json`). Per decode token: the kernels' summed time by kind (quantized mat-vec by
weight type, F16 mat-vec, activation quantization, attention, the rest), the mat-vecs' bytes per
token from the file's header (predict's `weights_read`) over their time, and what is left of the
step when every kernel is counted (launch gaps, host work). Set beside the same mat-vecs timed
one by one by test-backend-ops (call3/matvec.sql) where that call has the shapes: the question
issue 27 left open is how much less a quantized mat-vec costs inside the graph than alone.

ncu serialises kernels and replays each once to time it, so a kernel's figure is its own run
time with no overlap; llama.cpp's decode runs one stream, so their sum is the GPU's busy time.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import gguf

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from ceiling.predict.gguf import read_gguf  # noqa: E402
from ceiling.predict.llamacpp import weights_read  # noqa: E402
from ceiling.predict.llamacpp_fit import points_from_sql  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from llamacpp_h200 import RES, header  # noqa: E402

QUANT = re.compile(r"mul_mat_vec_q<(?:\(ggml_type\))?(\d+),")


def kind(name: str) -> str:
    """The kind of one kernel, from its demangled name (ggml-cuda's kernel names)."""
    m = QUANT.search(name)
    if m:
        return f"matvec {gguf.GGMLQuantizationType(int(m.group(1))).name}"
    if "mul_mat_vec_f" in name or "gemv" in name:
        return "matvec F16"
    if "quantize_q8_1" in name or "quantize_mmq" in name:
        return "quantize activations"
    if "flash_attn" in name:
        return "attention"
    return "other"


def read_kernels(path: Path) -> list[tuple[str, float]]:
    """(kernel name, microseconds) in launch order; ncu's raw page has a units row first."""
    text = gzip.decompress(path.read_bytes()).decode()
    rows = list(csv.DictReader(io.StringIO(text)))
    out = []
    for r in rows:
        if not (r.get("ID") or "").isdigit():
            continue  # the units row
        ns = float(r["gpu__time_duration.sum"].replace(",", ""))  # ncu groups thousands
        out.append((r["Kernel Name"], ns / 1e3))
    return out


def tokens(kernels: list[tuple[str, float]], n: int) -> list[list[tuple[str, float]]]:
    """The run's kernels cut into its n decode evaluations (llama-bench's warm-up token, then
    -n tokens): every evaluation launches the same graph, so the sequence divides evenly and
    every part names the same kernels; otherwise nothing is cut (ValueError)."""
    if not kernels or len(kernels) % n:
        raise ValueError(f"{len(kernels)} kernels do not divide into {n} evaluations")
    size = len(kernels) // n
    parts = [kernels[i * size : (i + 1) * size] for i in range(n)]
    names = [[k for k, _ in p] for p in parts]
    if any(x != names[0] for x in names[1:]):
        raise ValueError("the evaluations launch different kernels")
    return parts


def isolated_us(info_path: Path, sql: Path) -> dict[str, float]:
    """The file's mat-vecs timed one by one (test-backend-ops), summed per type, where every
    matrix of that type is a plain mat-vec whose shape was timed."""
    if not sql.exists():
        return {}
    pts = {
        (p.type, p.k, p.m): p.time_us for p in points_from_sql(sql.read_text()) if p.op == "MUL_MAT"
    }
    out: dict[str, float] = defaultdict(float)
    missing: set[str] = set()
    for t, share in weights_read(read_gguf(info_path)):
        if t.name.startswith("token_embd"):
            continue  # one row per token (get_rows), not a mat-vec
        if share < 1.0:  # routed experts: the graph's kernels of that type include them
            missing.add(t.type)
            continue
        key = (t.type, t.shape[0], t.shape[1])
        if key in pts:
            out[t.type] += pts[key]
        else:
            missing.add(t.type)
    return {k: v for k, v in out.items() if k not in missing}


def read_cupti(path: Path) -> list[tuple[str, float, int]]:
    """(kernel name, microseconds, start ns) in start order, from kernel_times.cpp's trace."""
    out = []
    for line in gzip.decompress(path.read_bytes()).decode().splitlines():
        if line.startswith("#"):
            if line.startswith("# dropped") and int(line.split()[2]):
                raise ValueError(f"{path.name}: CUPTI dropped records ({line})")
            continue
        start, end, _graph, _stream, name = line.split("\t", 4)
        out.append((name, (int(end) - int(start)) / 1e3, int(start)))
    return sorted(out, key=lambda k: k[2])


def analyse(call: Path, name: str, cache: Path, source: str = "ncu") -> dict[str, object]:
    """One file's kernels per decode token. ``ncu``: Nsight Compute's serialised timings, the
    last evaluation; ``cupti``: the CUPTI trace, medians over the second half of the run's
    evaluations (CUDA graphs in use by then), with the GPU's own step (start to start)."""
    if source == "ncu":
        kernels = [(k, us, 0) for k, us in read_kernels(call / f"ncu-{name}.csv.gz")]
    else:
        kernels = read_cupti(call / f"cupti-{name}.tsv.gz")
    meta = json.loads((call / f"{source}-bench-{name}.json").read_text())
    evals = 1 + int(meta[0]["n_gen"])  # llama-bench's warm-up token, then -n tokens
    parts = tokens([(k, us) for k, us, _ in kernels], evals)
    size = len(parts[0])
    starts = [kernels[len(kernels) - size * (evals - i)][2] for i in range(evals)]
    use = range(evals - 1, evals) if source == "ncu" else range(evals // 2, evals)
    per_kind: dict[str, list[float]] = defaultdict(list)
    for i in use:
        sums: dict[str, float] = defaultdict(float)
        for k, us in parts[i]:
            sums[kind(k)] += us
        for k, v in sums.items():
            per_kind[k].append(v)
    by_kind = {k: statistics.median(v) for k, v in sorted(per_kind.items())}
    busy = statistics.median(sum(us for _, us in parts[i]) for i in use)
    bench = json.loads((call / f"bench-{name}.json").read_text())
    step_us = 1e6 / bench[0]["avg_ts"]
    info_path = header(name, cache)
    bytes_by_type: dict[str, float] = defaultdict(float)
    for t, share in weights_read(read_gguf(info_path)):
        if not t.name.startswith("token_embd"):
            bytes_by_type[t.type] += t.nbytes * share
    matvec = {
        typ: {
            "us": by_kind[f"matvec {typ}"],
            "GB": bytes_by_type[typ] / 1e9,
            "TB_s": bytes_by_type[typ] / by_kind[f"matvec {typ}"] / 1e6,
        }
        for typ in sorted(bytes_by_type)
        if by_kind.get(f"matvec {typ}")
    }
    alone = isolated_us(info_path, RES / "call3/matvec.sql")
    row: dict[str, object] = {
        "file": name,
        "source": source,
        "kernels_per_token": size,
        "tokens_in_run": evals,
        "step_us": step_us,
        "kernels_us": busy,
        "not_in_kernels_us": step_us - busy,
        "by_kind_us": by_kind,
        "matvec": matvec,
        "isolated_matvec_us": alone,
        "in_graph_vs_isolated": {t: by_kind[f"matvec {t}"] / us for t, us in alone.items()},
        "token_spread_us": [sum(us for _, us in p) for p in parts],
    }
    if source == "cupti":
        gpu_steps = [starts[i + 1] - starts[i] for i in use if i + 1 < evals]
        row["gpu_step_us"] = statistics.median(gpu_steps) / 1e3
        row["traced_step_us"] = 1e6 / meta[0]["avg_ts"]
        row["idle_us"] = float(row["gpu_step_us"]) - busy  # the GPU between kernels
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--call", type=Path, default=RES / "call6")
    ap.add_argument("--cache", type=Path, default=ROOT / ".cache/gguf-headers")
    ap.add_argument("--out", type=Path, help="default: CALL/kernels.json")
    a = ap.parse_args(argv)
    a.cache.mkdir(parents=True, exist_ok=True)
    rows = []
    found = [(f.name[len("ncu-") : -len(".csv.gz")], "ncu") for f in a.call.glob("ncu-*.csv.gz")]
    found += [
        (f.name[len("cupti-") : -len(".tsv.gz")], "cupti") for f in a.call.glob("cupti-*.tsv.gz")
    ]
    for name, source in sorted(found):
        try:
            r = analyse(a.call, name, a.cache, source)
        except (ValueError, FileNotFoundError, KeyError) as e:
            print(f"{name}: not read ({e})", file=sys.stderr)
            continue
        rows.append(r)
        kinds = ", ".join(f"{k} {v / 1e3:.3f}" for k, v in r["by_kind_us"].items())
        gpu = (f", GPU step {r['gpu_step_us'] / 1e3:.3f} ms (traced run "
               f"{r['traced_step_us'] / 1e3:.3f}), GPU idle {r['idle_us'] / 1e3:.3f} ms"
               if source == "cupti" else "")  # fmt: skip
        print(f"{name} [{source}]: step {r['step_us'] / 1e3:.3f} ms, kernels "
              f"{r['kernels_us'] / 1e3:.3f} ms ({r['kernels_per_token']} per token){gpu}, "
              f"outside kernels {r['not_in_kernels_us'] / 1e3:.3f} ms; {kinds}")  # fmt: skip
        for typ, m in r["matvec"].items():
            alone = r["isolated_matvec_us"].get(typ)
            print(f"    {typ:7s} {m['GB']:.2f} GB in {m['us'] / 1e3:.3f} ms = {m['TB_s']:.2f} TB/s"
                  + (f"; alone {alone / 1e3:.3f} ms" if alone else ""))  # fmt: skip
    out = a.out or a.call / "kernels.json"
    out.write_text(json.dumps({"schema_version": 1, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
