#!/usr/bin/env bash
# Per-operation evidence on one GPU (issue 11): calibrate + `calibrate --ops` at the decode
# shapes of a dense GQA model, a bf16 MoE and an MLA MoE, then predict with the measured profile
# beside the priors-only prediction. One call of the device tool, sized for < 6 minutes on one
# H200. Run from the repo root on the GPU machine:
#
#     bash experiments/gpu/gpu_ops_session.sh          # results in $OUT (device tool) or experiments/results/gpu_ops/
#
# Writes: profile_ops.json (HardwareProfile with `ops`), calibrate_ops.json (every point),
# predictions.tgz (predict_*.json with and without the profile), session.log. Carry .whl (pydantic & co., see
# docs/probe.md) when the machine lacks them.
set -u
OUT=${OUT:-experiments/results/gpu_ops}
mkdir -p "$OUT"
. "$(dirname "$0")/gpu_env.sh"  # PY, wheels, PYTHONPATH, NVLS off
MODELS=${MODELS:-"llama-3.1-8b qwen3-30b-a3b deepseek-v3"}
CAL_FLAGS=${CAL_FLAGS:-}   # CAL_FLAGS=--cpu: a path check on a machine without a GPU
margs=""; for m in $MODELS; do margs="$margs --model $m"; done
LOG="$OUT/session.log"
step() { echo; echo "== $*"; }
{
  step "machine"; date -u; hostname
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,power.limit --format=csv
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  step "calibrate + per-op microbenchmarks ($MODELS, TP=1)"
  timeout 300 $PY -m ceiling calibrate $CAL_FLAGS --ops $margs --tp 1 \
    --out "$OUT/profile_ops.json" --results "$OUT/calibrate_ops.json"
  step "predict: priors only vs with the measured profile"
  for m in $MODELS; do
    tp=1; case "$m" in deepseek-v3|kimi-k2*) tp=8;; esac   # too large for one GPU: 8 x H200
    CEILING_NO_TABLES=1 timeout 60 $PY -m ceiling predict --model "$m" --gpu h200 --tp $tp --json \
      > "$OUT/predict_${m}_priors.json" || true
    CEILING_NO_TABLES=1 timeout 60 $PY -m ceiling predict --model "$m" --gpu h200 --tp $tp \
      --profile "$OUT/profile_ops.json" --json > "$OUT/predict_${m}_profile.json" || true
    $PY - "$OUT/predict_${m}_priors.json" "$OUT/predict_${m}_profile.json" <<'EOF'
import json, sys
try:
    a, b = (json.load(open(p)) for p in sys.argv[1:3])
except (OSError, ValueError):
    sys.exit(f"{sys.argv[1]}: no prediction (see the error above: e.g. the model does not fit one GPU)")
print(f"{a['model']['name']}: expected {a['decode_ms_per_token']:.3f} ms (priors) -> "
      f"{b['decode_ms_per_token']:.3f} ms (profile); bound {b['bound']['decode_ms_per_token']:.3f} ms; "
      f"profile share {b['evidence']['share_of_expected_by_source'].get('profile', 0):.0%}")
EOF
  done
  step "done"; date -u
} 2>&1 | tee "$LOG"
# the device tool returns at most 8 files: the predictions travel as one archive
(cd "$OUT" && tar -czf predictions.tgz predict_*.json 2>/dev/null && rm -f predict_*.json)
