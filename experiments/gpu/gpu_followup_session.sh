#!/usr/bin/env bash
# Second GPU-host session of 2026-11-30, one call of the device tool (< 10 min), for three issues:
#   1. issue 16: experiments/validation/ingest_rate.py on the host's many CPU cores (no GPU used): the chunk rate
#      `ceiling bench` stamps without falling behind, --workers 1/2/4, against a local synthetic
#      server (vLLM is not installed there: ratios are against ceiling's single process).
#   2. issues 10/11: the kernels one decode step of plain PyTorch runs (tp_decode --census at TP=1:
#      Llama-8B and Qwen3-30B-A3B shapes) and calibrate --ops at the MoE's TP=2 shapes, the
#      per-op evidence behind predict's `generic` kernel counts.
#   3. issue 15: `ceiling env` on a CUDA machine and its fatbin reader vs torch's arch list.
# Run from the repo root with .whl carried (bash experiments/gpu/gpu_wheels.sh):
#     run(kind="nvidia-h200-x2", carry=[".whl"], command="bash experiments/gpu/gpu_followup_session.sh")
# Files back (<= 8): ingest_rate.json, census.json, profile_ops_tp2.json, calibrate_ops_tp2.json,
# env.tgz, session.log.
set -u
export PYTHONUNBUFFERED=1 COLUMNS=${COLUMNS:-160} NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-experiments/results/gpu_followup}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
LOG="$OUT/session.log"
step() { echo; echo "== $* ($(date -u +%T))"; }
{
  step "machine"; nproc; nvidia-smi -L
  step "issue 16: ingest rate (CPU only, before any wheel is installed: the bare image)"
  timeout 280 $PY experiments/validation/ingest_rate.py --out "$OUT/ingest_rate.json"
  if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      && export PYTHONPATH=/tmp/site
  fi
  export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
  step "issues 10/11: kernel census of one plain-PyTorch decode step (TP=1)"
  timeout 150 $PY experiments/gpu/tp_decode.py --model llama-3.1-8b,qwen3-30b-a3b --tp 1 --census --iters 10 \
    --timeout 100 --out "$OUT/census.json"
  step "issues 10/11: calibrate --ops at the MoE's TP=2 shapes"
  timeout 120 $PY -m ceiling calibrate --ops --model qwen3-30b-a3b --model llama-3.1-70b --tp 2 \
    --out "$OUT/profile_ops_tp2.json" --results "$OUT/calibrate_ops_tp2.json"
  step "issue 15: ceiling env on the GPU host"
  mkdir -p /tmp/envout
  OUT=/tmp/envout timeout 120 bash experiments/gpu/env_gpu_check.sh
  step "done"
} 2>&1 | tee "$LOG"
tar -czf "$OUT/env.tgz" -C /tmp/envout . 2>/dev/null
