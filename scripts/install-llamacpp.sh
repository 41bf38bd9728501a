#!/usr/bin/env bash
# Install llama-cpp-python's OpenAI-compatible server into its own virtual environment (default
# .engines/llamacpp), the way ../shared/engines-on-cpu.md measured it: the package compiles
# llama.cpp from source (about 8.5 minutes on an idle 2-core machine; pip caches the built wheel
# afterwards). LLAVA is not built (not needed, and it is the slowest part). `gguf` is installed
# beside it: src/ceiling/demo/tiny_gguf.py uses it to write the tiny test model.
# ceiling itself does not need llama.cpp in its own environment: it launches the server as a process.
set -euo pipefail
VENV=${1:-.engines/llamacpp}
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
GGUF_VERSION=${GGUF_VERSION:-0.19.0}
PY=${PYTHON:-python3}
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import llama_cpp.server.app, gguf" >/dev/null 2>&1; then
  echo "llama-cpp-python already installed in $VENV"
else
  echo "installing llama-cpp-python[server]==$VERSION into $VENV (compiles llama.cpp: about 9 minutes the first time)"
  "$PY" -m venv "$VENV"
  CMAKE_ARGS="${CMAKE_ARGS:--DLLAVA_BUILD=OFF}" "$VENV/bin/pip" install -q --disable-pip-version-check \
    "llama-cpp-python[server]==$VERSION" "gguf==$GGUF_VERSION" 2>&1 | { grep -v "^WARNING: Location" || true; }
fi
"$VENV/bin/python" -c "import llama_cpp, llama_cpp.server.app, gguf; print('llama_cpp', llama_cpp.__version__, 'ok')"
