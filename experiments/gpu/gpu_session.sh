#!/usr/bin/env bash
# One-GPU evidence run (issue 5): probe, calibrate (-> profile), the telemetry sampler over known
# loads, the NCCL + CUDA-graph path of commbench at world size 1 (a code check: no link is
# crossed), and decode steps of Llama-3.1-8B / Qwen3-32B / Qwen3-30B-A3B shapes at TP=1 beside
# predict's numbers with the calibrated profile. Run from the repo root on the GPU machine:
#
#     bash experiments/gpu/gpu_session.sh            # results in $OUT (device tool) or experiments/results/gpu_session/
#     bash experiments/gpu/gpu_session.sh check-multi
#         second stage: experiments/gpu/multi_gpu_session.sh (both parts) at WORLD_SIZES=1 as a path check of
#         issue 7's scripts, TP=1 decode steps again (sdpa + fused rms_norm; MoE both ways), all
#         packed into $OUT/session2.tgz plus the logs (the device tool returns at most 8 files).
#
# Carry .whl (pydantic & co., see docs/probe.md) when the machine lacks them.
set -u
OUT=${OUT:-experiments/results/gpu_session}
mkdir -p "$OUT"
. "$(dirname "$0")/gpu_env.sh"  # PY, wheels, PYTHONPATH, NVLS off
if [ "${1:-}" = check-multi ]; then
  W=/tmp/session2; rm -rf "$W"; mkdir -p "$W"
  {
    OUT=$W/mg WORLD_SIZES=1 bash experiments/gpu/multi_gpu_session.sh comm
    OUT=$W/mg WORLD_SIZES=1 LAYERS=40 bash experiments/gpu/multi_gpu_session.sh tp "$W/mg/profile.json"
    echo "== TP=1 dense decode steps (sdpa, fused rms_norm) vs predict"
    timeout 300 $PY experiments/gpu/tp_decode.py --model llama-3.1-8b,qwen3-32b --tp 1 --profile "$W/mg/profile.json" \
      --gpu h200 --out "$W/tp1_dense.json"
    echo "== TP=1 MoE: grouped_mm vs a loop over the active experts"
    for impl in grouped_mm loop; do
      timeout 200 $PY experiments/gpu/tp_decode.py --model qwen3-30b-a3b --tp 1 --moe-impl $impl \
        --profile "$W/mg/profile.json" --gpu h200 --out "$W/tp1_moe_$impl.json"
    done
  } 2>&1 | tee "$W/session2.log"
  tar czf "$OUT/session2.tgz" -C "$W" .
  cp "$W/session2.log" "$OUT/"
  exit 0
fi
LOG="$OUT/session.log"
step() { echo; echo "== $*"; }
{
  step "machine"; date -u; hostname; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,pcie.link.gen.max --format=csv
  $PY -c "import torch; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version(), 'gpus', torch.cuda.device_count())"
  step "probe";      timeout 120 $PY -m ceiling probe --out "$OUT/probe.json"
  step "calibrate";  timeout 300 $PY -m ceiling calibrate --results "$OUT/calibrate.json" --out "$OUT/profile.json"
  step "telemetry";  timeout 120 $PY experiments/gpu/gpu_telemetry_load.py --out "$OUT/telemetry.json"
  step "commbench world size 1 (NCCL + CUDA graph code path; no link crossed)"
  timeout 300 $PY -m ceiling commbench --world-sizes 1 --sizes 1K..1M --model llama-3.1-70b --results "$OUT/commbench_ws1.json"
  step "TP=1 decode steps vs predict (calibrated profile)"
  timeout 600 $PY experiments/gpu/tp_decode.py --model llama-3.1-8b,qwen3-32b,qwen3-30b-a3b --tp 1 \
    --profile "$OUT/profile.json" --gpu h200 --out "$OUT/tp_decode_tp1.json"
  step "batch 16 Llama-8B shape"
  timeout 300 $PY experiments/gpu/tp_decode.py --model llama-3.1-8b --tp 1 --batch 16 \
    --profile "$OUT/profile.json" --gpu h200 --out "$OUT/tp_decode_tp1_b16.json"
  step "done"; date -u
} 2>&1 | tee "$LOG"
