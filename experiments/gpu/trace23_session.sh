#!/usr/bin/env bash
# Issue 23's one-GPU trace evidence through the current path (experiments/gpu/tp_decode.py --tp 1
# --trace, read by experiments/gpu/trace_report.py), the configurations of the 2026-12-02 record
# (experiments/results/2026-12-02_h200-trace-decode/, recorded by the retired trace_decode.py):
# Llama-3.1-8B and Qwen3-30B-A3B shapes, plus the larger dense Qwen3-32B shape, batch 1 and 8,
# context 1024, each in a CUDA graph and eagerly, TRACE_STEPS (default 6) steps recorded.
#
# Device tool: run(kind="nvidia-h200", carry=[".whl"], timeout_s=600,
#                  command="bash experiments/gpu/trace23_session.sh")
# Path check on a CPU: TINY=1 PYTHON=.venv/bin/python OUT=/tmp/t23 W=/tmp/t23w \
#     bash experiments/gpu/trace23_session.sh       (tiny shapes, gloo, eager only)
# Into $OUT: report.md (trace_report.py's output), reports.tgz (trace_report.json, the
# tp_decode results, every configuration's config.json and steps_rank0.json, the log),
# traces.tgz (every trace, when under 15 MiB, else the graph ones).
set -u
OUT=${OUT:-experiments/results/trace23_session}
W=${W:-/tmp/trace23}
mkdir -p "$OUT" "$W"
. "$(dirname "$0")/gpu_env.sh"  # PY, wheels, PYTHONPATH, NVLink multicast off
DEADLINE=${DEADLINE:-500}; T0=$(date +%s)
left() { echo $((DEADLINE - ($(date +%s) - T0))); }
TINY_ARGS=${TINY:+--tiny --backend gloo}
MODELS=${MODELS:-llama-3.1-8b,qwen3-30b-a3b,qwen3-32b}
TR=$W/traces
{
  echo "== machine"; date -u; nvidia-smi -L 2>/dev/null
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu')"
  for b in ${BATCHES:-1 8}; do
    t=$(( $(left) - 60 ))
    if [ "$t" -lt 60 ]; then echo "skipped batch $b: ${t}s left"; continue; fi
    echo "== batch $b ($MODELS), ${t}s allowed"
    timeout "$t" $PY experiments/gpu/tp_decode.py --model "$MODELS" --tp 1 --batch "$b" \
      --context 1024 --iters 30 --timeout 200 --trace "$TR" --trace-steps "${TRACE_STEPS:-6}" \
      --logs "$W/logs" $TINY_ARGS --out "$TR/tp_decode_b$b.json"
    echo "rc=$?"
  done
  echo "== trace report"
  $PY experiments/gpu/trace_report.py "$TR" --json "$TR/trace_report.json" > "$OUT/report.md"
  echo "rc=$?"
  du -a "$TR" | sort -n | tail -30
} 2>&1 | tee "$W/session.log"
cp "$W/session.log" "$OUT/"
(cd "$W" && find traces logs session.log -name '*.json' -o -name '*.log' -o -name 'session.log' 2>/dev/null \
  | tar -czf "$OUT/reports.tgz" -T -)
(cd "$W" && tar -czf "$W/traces.tgz" traces)
if [ "$(stat -c %s "$W/traces.tgz")" -gt $((15 * 1024 * 1024)) ]; then
  echo "traces over 15 MiB: graph traces only" | tee -a "$OUT/session.log"
  (cd "$W" && find traces -path '*/graph/*' -name '*.gz' | tar -czf "$W/traces.tgz" -T -)
fi
[ "$(stat -c %s "$W/traces.tgz")" -le $((15 * 1024 * 1024)) ] && cp "$W/traces.tgz" "$OUT/"
ls -la "$OUT"
