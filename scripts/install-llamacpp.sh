#!/usr/bin/env bash
# Install llama.cpp into its own environment (default .engines/llamacpp), in two flavours that
# share ONE compile of llama.cpp:
#   - the real `llama-server` binary (ceiling's default llama.cpp flavour, engine `llamacpp`),
#     built with CMake from the llama.cpp source that llama-cpp-python vendors (its sdist), as
#     shared libraries: bin/llama-server -> lib/llama-server/ (binary + libllama/libggml*/libmtmd);
#   - llama-cpp-python's OpenAI server (engine `llamacpp-python`), installed WITHOUT its own
#     compile (CMAKE_ARGS=-DLLAMA_BUILD=OFF) and given the same shared libraries: one llama.cpp,
#     two servers. No PyPI, Debian or npm package ships the real llama-server for Linux (the
#     PyPI ones that claim to build it from source: see docs/engines.md).
# `gguf` is installed beside it: src/ceiling/demo/tiny_gguf.py uses it to write the tiny model.
# About 3.5-6 minutes on 2 cores the first time (CMake + Ninja, llama-server target only, a unity
# build: scripts/llamacpp-unity.cmake says why and what it leaves out of the batches).
set -euo pipefail
VENV=${1:-.engines/llamacpp}
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
GGUF_VERSION=${GGUF_VERSION:-0.19.0}
PY=${PYTHON:-python3}
JOBS=${JOBS:-$(nproc)}
PIPQ=(-q --disable-pip-version-check)
# built once per pin into the cache outside the clone, linked to $VENV (scripts/engine-cache.sh)
. "$(dirname "$0")/engine-cache.sh"
UNITY=$(cd "$(dirname "$0")" && pwd)/llamacpp-unity.cmake
engine_cache_begin llamacpp "$VERSION" "$0" "$VENV" "gguf==$GGUF_VERSION" \
  "$(cmake --version 2>/dev/null | head -1)" "$(grep -v '^[[:space:]]*#' "$UNITY")"
VENV=$ENGINE_TARGET  # a cached entry passes the checks below in seconds
LIBDIR="$VENV/lib/llama-server"

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
if [ -x "$VENV/bin/llama-server" ] && "$VENV/bin/llama-server" --version >/dev/null 2>&1; then
  echo "llama-server already installed in $VENV"
else
  SRC=$(mktemp -d)
  trap 'rm -rf "$SRC"' EXIT
  echo "building llama-server from llama-cpp-python $VERSION's llama.cpp (about 3.5-6 minutes the first time)"
  "$VENV/bin/pip" download "${PIPQ[@]}" --no-deps --no-binary :all: -d "$SRC" \
    "llama-cpp-python==$VERSION" 2>&1 | { grep -v "^WARNING: Location" || true; }
  tar -xzf "$SRC"/llama_cpp_python-*.tar.gz -C "$SRC"
  LLAMA_SRC=$(echo "$SRC"/llama_cpp_python-*/vendor/llama.cpp)
  GEN=(); command -v ninja >/dev/null && GEN=(-G Ninja)
  # the unity build's exclusions need cmake_language(DEFER): CMake 3.19 or newer
  UNITY_ARGS=(-DCMAKE_UNITY_BUILD=ON "-DCMAKE_PROJECT_INCLUDE=$UNITY")
  CMAKE_VER=$(cmake --version | sed -n '1s/[^0-9]*\([0-9][0-9.]*\).*/\1/p')
  printf '%s\n' 3.19 "$CMAKE_VER" | sort -V -C || UNITY_ARGS=()
  # no network at build time: no prebuilt web UI download, no curl/openssl
  cmake -S "$LLAMA_SRC" -B "$SRC/build" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release \
    "${UNITY_ARGS[@]}" \
    -DBUILD_SHARED_LIBS=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
    -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON '-DCMAKE_INSTALL_RPATH=$ORIGIN' >"$SRC/cmake.log" 2>&1 \
    || { tail -30 "$SRC/cmake.log"; exit 1; }
  cmake --build "$SRC/build" --target llama-server -j "$JOBS" >"$SRC/build.log" 2>&1 \
    || { grep -E "FAILED:|error:|fatal|Killed|internal compiler error" "$SRC/build.log" | head -20
         echo "..."; tail -15 "$SRC/build.log"; exit 1; }  # a parallel job's warnings can bury the error
  rm -rf "$LIBDIR"
  mkdir -p "$LIBDIR"
  cp -a "$SRC/build/bin/llama-server" "$SRC"/build/bin/lib*.so* "$LIBDIR/"
  ln -sf ../lib/llama-server/llama-server "$VENV/bin/llama-server"
fi
if "$VENV/bin/python" -c "import llama_cpp.server.app, gguf" >/dev/null 2>&1; then
  echo "llama-cpp-python already installed in $VENV"
else
  echo "installing llama-cpp-python[server]==$VERSION into $VENV (no compile: it gets llama-server's libraries)"
  # --no-cache-dir: a wheel built without libraries must never be reused by another install
  CMAKE_ARGS="-DLLAMA_BUILD=OFF" "$VENV/bin/pip" install "${PIPQ[@]}" --no-cache-dir \
    "llama-cpp-python[server]==$VERSION" "gguf==$GGUF_VERSION" 2>&1 | { grep -v "^WARNING: Location" || true; }
  PKG=$("$VENV/bin/python" -c "import importlib.util as u; print(u.find_spec('llama_cpp').submodule_search_locations[0])")
  mkdir -p "$PKG/lib"
  cp -a "$LIBDIR"/lib*.so* "$PKG/lib/"
fi
"$VENV/bin/llama-server" --version 2>&1 | grep -m1 version
"$VENV/bin/python" -c "import llama_cpp, llama_cpp.server.app, gguf; print('llama_cpp', llama_cpp.__version__, 'ok')"
engine_cache_end
