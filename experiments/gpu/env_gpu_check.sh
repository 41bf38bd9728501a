#!/usr/bin/env bash
# `ceiling env` on a GPU machine (issue 15): the checks a CPU box cannot exercise, in one call of
# the device tool. Run from the repo root (carry .whl: bash experiments/gpu/gpu_wheels.sh first):
#
#     bash experiments/gpu/env_gpu_check.sh            # results in $OUT (device tool) or experiments/results/env_gpu/
#
# 1. `ceiling env` on the machine's own Python (CUDA torch): driver vs torch's CUDA runtime, the
#    GPUs' compute capability vs torch's arch list, the NCCL torch loads vs its nvidia-nccl wheel;
#    cold and warm timings.
# 2. The fatbin reader (envcheck/binaries.py) against the truth: the architectures it reads from
#    libtorch_cuda.so's .nv_fatbin (and every other CUDA library torch ships) beside
#    torch.cuda.get_arch_list(); and what the arch check says for sm_80/90/100/120 GPUs.
# Prints tables; writes env_host.json, fatbin.json into $OUT.
set -u
OUT=${OUT:-experiments/results/env_gpu}
mkdir -p "$OUT"
. "$(dirname "$0")/gpu_env.sh"  # PY, wheels, PYTHONPATH, NVLS off
export CEILING_CACHE_DIR=$(mktemp -d)
nvidia-smi --query-gpu=index,name,compute_cap,driver_version --format=csv || true
echo "== ceiling env (cold, then warm)"
for run in cold warm; do
  /usr/bin/time -f "$run: %e s wall" $PY -m ceiling env --python "$(command -v $PY)" --tp "${TP:-1}" --json \
    > "$OUT/env_host_$run.json" 2> "$OUT/env_host_$run.err"
  tail -1 "$OUT/env_host_$run.err"
done
cp "$OUT/env_host_warm.json" "$OUT/env_host.json"
$PY -m ceiling env --python "$(command -v $PY)" --tp "${TP:-1}" || true
echo "== fatbin reader vs torch.cuda.get_arch_list()"
$PY - "$OUT/fatbin.json" <<'PYEOF'
import json, sys, time
from pathlib import Path
import torch
from ceiling.envcheck.binaries import fatbin_archs, runs_on
lib = Path(torch.__file__).parent / "lib"
truth = torch.cuda.get_arch_list()
rows = []
for so in sorted(lib.glob("*.so*")) + sorted(Path(torch.__file__).parents[1].glob("nvidia/*/lib/*.so*")):
    t = time.monotonic()
    archs = fatbin_archs(so)
    took = time.monotonic() - t
    if archs is None or archs.empty:
        continue
    row = {"file": so.name, "size_mb": round(so.stat().st_size / 2**20), "read_s": round(took, 3),
           "sm": archs.sm, "ptx": archs.ptx,
           "runs_on": {cap: runs_on(archs, cap)[0] for cap in (80, 86, 90, 100, 120)}}
    rows.append(row)
    print(f"{so.name:40s} {row['size_mb']:6d} MB {took:6.3f} s  {archs.label()}")
    print(f"{'':40s} runs on sm_80/86/90/100/120: {row['runs_on']}")
print("torch.cuda.get_arch_list():", truth)
main = next((r for r in rows if r["file"].startswith("libtorch_cuda")), None)
if main:
    read = sorted({f"sm_{a}" for a in main["sm"]} | {f"compute_{a}" for a in main["ptx"]})
    print("libtorch_cuda.so fatbin:   ", read)
    print("match (sm_ set):", {a for a in truth if a.startswith("sm_")} <= set(read))
json.dump({"arch_list": truth, "binaries": rows}, open(sys.argv[1], "w"), indent=2)
PYEOF
