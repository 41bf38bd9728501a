#!/usr/bin/env bash
# Multi-GPU evidence run (issue 7), for nvidia-h200-x2 / -x4 / -x8. Two calls, each < 10 min:
#
#   bash bench/multi_gpu_session.sh comm
#       probe (how the GPUs are linked), calibrate, commbench at world sizes 2,4,8 (as many as
#       the machine has) x sizes 1K..64M x variants of data/commbench.yaml group `issue7`
#       (default; NCCL_ALGO=Ring/Tree; NCCL_PROTO=LL/LL128/Simple; NCCL_P2P_DISABLE=1;
#       NCCL_MAX_NCHANNELS=16 + NCCL_BUFFSIZE=16777216), eager and in CUDA graphs, with the
#       Llama-3.1-70B per-token cost; writes profile.json = calibrate + commbench fits.
#   bash bench/multi_gpu_session.sh tp PROFILE.json
#       TP decode steps (Llama-3.1-70B at TP 2/4/8, Qwen3-30B-A3B MoE stack at TP 2/4/8), CUDA
#       graph and eager, default and NCCL_P2P_DISABLE=1, each beside predict's number with
#       PROFILE.json (the profile.json the `comm` call brought back, committed under bench/results/).
# Each part ends with bench/multi_gpu_report.py's Markdown summary (report_<part>.md); at most 7
# files come back per part (the device tool returns 8).
# Device tool: run(kind="nvidia-h200-x8", carry=[".whl"], command="bash bench/multi_gpu_session.sh comm")
#              then commit $OUT's files under bench/results/<date>_h200-x8/ and
#              run(kind="nvidia-h200-x8", carry=[".whl"],
#                  command="bash bench/multi_gpu_session.sh tp bench/results/<date>_h200-x8/profile.json")
#
# NVLink multicast stays off in every process (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
# NVSHMEM_DISABLE_NVLS=1): the device README says why. Carry .whl (pydantic & co.) if needed.
set -u
export COLUMNS=${COLUMNS:-160} PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PART=${1:-comm}
OUT=${OUT:-bench/results/multi_gpu_session}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
N=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
WS=$(for w in 2 4 8; do [ "$w" -le "${N:-0}" ] && printf '%s,' "$w"; done | sed 's/,$//')
WS=${WORLD_SIZES:-$WS}
if [ -z "$WS" ]; then
  echo "only ${N:-0} GPU(s): multi-GPU runs need 2 or more (set WORLD_SIZES=1 for a path check)" >&2
  WS=1
fi
LOG="$OUT/session_$PART.log"
step() { echo; echo "== $*"; }
{
  step "machine ($N GPUs, world sizes $WS)"; date -u; nvidia-smi -L; nvidia-smi topo -m
  $PY -c "import torch; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version(), 'gpus', torch.cuda.device_count())"
  if [ "$PART" = comm ]; then
    step "probe"; timeout 120 $PY -m ceiling probe --out "$OUT/probe.json"
    step "calibrate (GPU 0)"; timeout 240 $PY -m ceiling calibrate --results "$OUT/calibrate.json" --out "$OUT/profile_calibrate.json"
    step "commbench"
    # results and profile are rewritten after every (variant, world size): a cut-off keeps them
    timeout 480 $PY -m ceiling commbench --world-sizes "$WS" --sizes 1K..64M --variant issue7 \
      --model llama-3.1-70b --budget-ms 5 --reps 3 --timeout 120 \
      --merge "$OUT/profile_calibrate.json" --out "$OUT/profile.json" --results "$OUT/commbench.json"
    $PY bench/multi_gpu_report.py "$OUT/commbench.json" > "$OUT/report_comm.md"
  elif [ "$PART" = tp ]; then
    PROFILE=${2:-$OUT/profile.json}
    LAYERS_ARG=${LAYERS:+--layers $LAYERS}   # LAYERS=40: a 70B shape that fits one GPU (path check)
    step "TP decode, dense (Llama-3.1-70B shape)"
    timeout 330 $PY bench/tp_decode.py --model llama-3.1-70b --tp "$WS" --variant default,p2p-off \
      --iters 20 --timeout 120 $LAYERS_ARG --profile "$PROFILE" --out "$OUT/tp_decode_dense.json"
    step "TP decode, MoE (Qwen3-30B-A3B shape)"
    timeout 230 $PY bench/tp_decode.py --model qwen3-30b-a3b --tp "$WS" --variant default,p2p-off \
      --iters 20 --timeout 120 --profile "$PROFILE" --out "$OUT/tp_decode_moe.json"
    $PY bench/multi_gpu_report.py "$OUT"/tp_decode_*.json > "$OUT/report_tp.md"
  else
    echo "usage: multi_gpu_session.sh comm | tp PROFILE.json" >&2
  fi
  step "done"; date -u
} 2>&1 | tee "$LOG"
