#!/usr/bin/env bash
# llama.cpp with CUDA on the lent H200, in one call of the device tool per mode (issue 27).
#
#   bash experiments/gpu/llamacpp_cuda.sh prepare   # here: fill /work/main/.gpu/gpu (git-ignored)
#   run(command="bash .gpu/gpu/llamacpp_cuda.sh build", carry=[".gpu/gpu"])   # call 1 (~9 min)
#   run(command="DEADLINE=150 bash .gpu/gpu/llamacpp_cuda.sh doctor", carry=[".gpu/gpu"])
#     # call 2 (~2.5 min): the doctor end to end + the known-answer runs on the carried binaries
#
# Everything it needs travels in .gpu/gpu/ (git-ignored; `bash experiments/gpu/llamacpp_cuda.sh
# prepare` fills it here): llama-src.tar.xz (llama-cpp-python 0.3.36's vendored llama.cpp,
# trimmed to what the CUDA build of llama-server, llama-bench, test-backend-ops and
# test-export-graph-ops needs: ggml/ with the CPU and CUDA backends, src/, common/, include/,
# tools/, tests/, vendor/, cmake/; no models, docs, web UI or other backends), whl/ (gguf and, for
# the doctor, ceiling and its dependencies), this script and random_gguf.py, and after the
# first call bin.tar.gz (the binaries, so later calls do not rebuild).
# Each stage appends "stage<TAB>ok|fail|skip<TAB>seconds<TAB>note" to $OUT/stages.tsv, so a
# failed call still says which stage failed; the results go back as <= 8 files under $OUT.
set -uo pipefail
MODE=${1:?usage: llamacpp_cuda.sh prepare|build|doctor}
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/llamacpp-out}
WORK=${WORK:-/tmp/lc}
GPU_DIR=${GPU_DIR:-.gpu/gpu}
DEADLINE=${DEADLINE:-560}  # seconds: no stage starts after this (the tool's limit is 600)
T0=$(date +%s)
mkdir -p "$OUT" "$WORK"
RES="$WORK/results"
mkdir -p "$RES"

elapsed() { echo $(($(date +%s) - T0)); }
record() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${4:-}" >>"$OUT/stages.tsv"; }
# stage NAME MIN_SECONDS_LEFT CMD...: runs CMD unless the deadline is near; records the outcome
stage() {
  local name=$1 need=$2
  shift 2
  local left=$((DEADLINE - $(elapsed)))
  if [ "$left" -lt "$need" ]; then
    record "$name" skip 0 "only ${left}s left, needs ${need}s"
    return 1
  fi
  local s
  s=$(date +%s)
  echo "== $name ($(elapsed)s)"
  "$@" >"$RES/$name.log" 2>&1
  local rc=$?
  if [ $rc -eq 0 ]; then
    record "$name" ok $(($(date +%s) - s))
  else
    record "$name" fail $(($(date +%s) - s)) "rc=$rc: $(tail -c 300 "$RES/$name.log" | tr '\n\t' '  ')"
  fi
  return $rc
}
pack() {  # the results folder as one file (<= 16 MiB), written again after each stage group
  tar -C "$WORK" -czf "$OUT/results.tar.gz" results 2>/dev/null || true
}

BIN="$WORK/bin"
GGUF="$WORK/gguf"
mkdir -p "$GGUF"
GG() { "${GG_PY:-python3}" "$HERE/random_gguf.py" "$@"; }
SITE=${SITE:-/tmp/site}
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"

prepare() {  # here, not on the GPU machine: fill .gpu/gpu/ (source, wheels, scripts)
  local root
  root=$(git -C "$HERE" rev-parse --show-toplevel)
  local main
  main=$(git -C "$root" rev-parse --path-format=absolute --git-common-dir)/..
  local dst="$main/$GPU_DIR"
  mkdir -p "$dst/whl"
  local sdist
  sdist=$(mktemp -d)
  "${PIP:-python3 -m pip}" download -q --no-deps --no-binary :all: -d "$sdist" llama-cpp-python==0.3.36
  tar -xzf "$sdist"/llama_cpp_python-*.tar.gz -C "$sdist"
  local src="$sdist/trim/llama.cpp"
  mkdir -p "$sdist/trim"
  cp -a "$sdist"/llama_cpp_python-*/vendor/llama.cpp "$src"
  (cd "$src" && rm -rf docs models media examples pocs benches gguf-py conversion .github \
    tests/snapshots tools/ui/src tools/ui/tests tools/ui/static tools/ui/package-lock.json)
  (cd "$src/ggml/src" && rm -rf ggml-vulkan ggml-sycl ggml-opencl ggml-metal ggml-hexagon \
    ggml-cann ggml-et ggml-webgpu ggml-openvino ggml-virtgpu ggml-zdnn ggml-zendnn ggml-musa \
    ggml-hip ggml-blas)
  tar -C "$sdist/trim" -cJf "$dst/llama-src.tar.xz" llama.cpp
  rm -rf "$sdist"
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$dst/whl" gguf==0.19.0
  # the doctor call: ceiling's own wheels (experiments/gpu/gpu_wheels.sh's list), this checkout's src,
  # the variants, the decode ops exported in call 1; bin.tar.xz comes from call 1's bin.tar.gz.*
  # (recompressed: `cat bin.tar.gz.* | gunzip | xz -9 > $dst/bin.tar.xz` keeps the tree < 64 MiB)
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$dst/whl" pydantic==2.14.4 pydantic_core==2.50.5 \
    annotated-types==0.8.0 typing-inspection==0.4.5 typing_extensions==4.16.0 typer==0.29.2 \
    pyelftools==0.33 psutil==7.2.2 prometheus_client==0.26.0 markdown-it-py==4.3.0 mdurl==0.1.2
  cp "$HERE/llamacpp_cuda.sh" "$HERE/llamacpp_doctor.sh" "$HERE/random_gguf.py" "$dst/"
  rm -rf "$dst/variants" "$dst/src" "$dst/ops" && cp -a "$HERE/variants" "$root/src" "$dst/"
  mkdir -p "$dst/ops" && cp "$root"/experiments/results/2026-12-02_h200-llamacpp/call1/ops-*.txt "$dst/ops/"
  find "$dst/src" -name __pycache__ -prune -exec rm -rf {} +
  du -sh "$dst"
}

build_llama() {
  rm -rf "$WORK/src" && mkdir -p "$WORK/src"
  tar -xJf "$GPU_DIR/llama-src.tar.xz" -C "$WORK/src"
  cmake -S "$WORK/src/llama.cpp" -B "$WORK/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=ON \
    -DBUILD_SHARED_LIBS=ON -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
    -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON '-DCMAKE_INSTALL_RPATH=$ORIGIN' || return 1
  local s
  s=$(date +%s)
  ninja -C "$WORK/build" -j 16 llama-server llama-bench test-backend-ops test-export-graph-ops \
    || return 1
  echo "ninja seconds: $(($(date +%s) - s))" | tee "$RES/build_seconds.txt"
  mkdir -p "$BIN"
  cp -a "$WORK"/build/bin/{llama-server,llama-bench,test-backend-ops,test-export-graph-ops} \
    "$WORK"/build/bin/lib*.so* "$BIN/"
  "$BIN/llama-server" --version
}
pack_bins() {
  tar -C "$WORK" -czf "$WORK/bin.tar.gz" bin || return 1
  ls -la "$WORK/bin.tar.gz" "$BIN"
  # the tool brings back files of <= 16 MiB: split a larger archive
  split -b 15M -d "$WORK/bin.tar.gz" "$OUT/bin.tar.gz."
  ls -la "$OUT"
}
unpack_bins() {  # carried from the first call
  if [ -f "$GPU_DIR/bin.tar.xz" ]; then tar -xJf "$GPU_DIR/bin.tar.xz" -C "$WORK"; else cat "$GPU_DIR"/bin.tar.gz.* | tar -xz -C "$WORK"; fi && "$BIN/llama-server" --version
}
env_facts() {
  nvidia-smi; nvcc --version; cmake --version; ninja --version; nproc; free -g; df -h /tmp
  python3 -c 'import numpy, yaml; print("numpy", numpy.__version__)'
}
install_wheels() {
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "$GPU_DIR"/whl/*.whl && python3 -c 'import gguf; print("gguf ok")'
}
write_gguf() {  # write_gguf SHAPE FTYPE: $GGUF/SHAPE-FTYPE.gguf (kept when it is there)
  [ -s "$GGUF/$1-$2.gguf" ] && return 0
  GG --shape "$1" --ftype "$2" --out "$GGUF/$1-$2.gguf" | tee -a "$RES/gguf_files.jsonl"
}
# the ops of one decode step at the model's shapes (llama.cpp's own exporter), without the
# prompt graph's: -ub 384 makes every prompt op carry a 384 that no decode op of these shapes has
# ONLY: ggml_op values to keep (ggml.h's enum in this version: 29 MUL_MAT, 30 MUL_MAT_ID,
# 74 FLASH_ATTN_EXT); empty keeps every decode op
export_ops() {  # export_ops NAME [ONLY]
  "$BIN/test-export-graph-ops" -m "$GGUF/$1.gguf" -c 1024 -ub 384 -b 384 -fa on \
    -o "$RES/ops-$1-all.txt" || return 1
  python3 - "$RES/ops-$1-all.txt" "$RES/ops-$1.txt" "${2:-}" <<'EOF'
import sys
src, dst, only = sys.argv[1], sys.argv[2], sys.argv[3]
keep = []
for line in open(src):
    f = line.split()
    if "384" in f[2:6]:
        continue  # a prompt-graph op
    if only and f[0] not in only.split(","):
        continue
    keep.append(line)
open(dst, "w").writelines(keep)
print(len(keep), "decode ops of", sum(1 for _ in open(src)))
EOF
}
perf_ops() {  # perf_ops NAME: test-backend-ops perf at the exported decode shapes, CSV
  "$BIN/test-backend-ops" perf -b CUDA0 --test-file "$RES/ops-$1.txt" --output csv \
    >"$RES/perf-$1.csv"
  local rc=$?
  wc -l "$RES/perf-$1.csv"
  return $rc
}
perf_types() {  # one mat-vec shape (4096 x 14336, one token) for every weight type
  "$BIN/test-backend-ops" perf -b CUDA0 -o MUL_MAT -p 'm=4096,n=1,k=14336,' --output csv \
    >"$RES/perf-types.csv"
}
bench_tg() {  # bench_tg NAME [extra llama-bench args]: decode at depth 0 and 1024
  local name=$1
  shift
  "$BIN/llama-bench" -m "$GGUF/$name.gguf" -ngl 99 -p 0 -n 128 -d 0,1024 -r 3 -o json "$@" \
    >"$RES/bench-$name${TAG:-}.json"
}
server_sample() {  # the CUDA start-up log, /props, /slots, /metrics of llama-server at -lv 4
  local port=18080
  "$BIN/llama-server" -m "$GGUF/$1.gguf" -ngl 99 -fa on -c 4096 -np 2 --metrics --slots \
    -lv 4 --port $port >"$RES/server-$1.log" 2>&1 &
  local pid=$!
  for _ in $(seq 120); do curl -sf localhost:$port/health >/dev/null && break; sleep 0.5; done
  curl -s localhost:$port/completion \
    -d '{"prompt":"hello world","n_predict":64,"ignore_eos":true}' >"$RES/server-completion.json"
  curl -s localhost:$port/props >"$RES/server-props.json"
  curl -s localhost:$port/slots >"$RES/server-slots.json"
  curl -s localhost:$port/metrics >"$RES/server-metrics.txt"
  kill $pid
  wait $pid
  grep -c . "$RES/server-$1.log"
}

case "$MODE" in
prepare)
  prepare
  ;;
build)
  stage env 0 env_facts
  stage wheels 0 install_wheels
  stage ceiling_import 0 env PYTHONPATH="$GPU_DIR/src:/tmp/site" python3 -m ceiling --help
  stage build 0 build_llama && stage pack_bins 0 pack_bins
  pack
  D=llama3.1-8b
  stage gguf_q4km 60 write_gguf $D q4_k_m
  stage server_sample 40 server_sample $D-q4_k_m
  stage export_q4km 40 export_ops $D-q4_k_m
  stage perf_q4km 60 perf_ops $D-q4_k_m
  stage bench_q4km 40 bench_tg $D-q4_k_m -fa 0,1
  pack
  stage gguf_moe 80 write_gguf qwen3-30b-a3b q4_k_m
  stage export_moe 40 export_ops qwen3-30b-a3b-q4_k_m 29,30,74
  stage perf_moe 60 perf_ops qwen3-30b-a3b-q4_k_m
  stage bench_moe 40 bench_tg qwen3-30b-a3b-q4_k_m -fa 1
  rm -f "$GGUF"/qwen3-30b-a3b-*.gguf
  pack
  stage gguf_f16 80 write_gguf $D f16
  stage export_f16 40 export_ops $D-f16 29,30,74
  stage perf_f16 40 perf_ops $D-f16
  stage bench_f16 40 bench_tg $D-f16 -fa 1
  rm -f "$GGUF/$D-f16.gguf"
  pack
  stage perf_types 50 perf_types
  # held out of every fit: other weight types and a 70B shape
  stage gguf_q8 40 write_gguf $D q8_0 && stage bench_q8 30 bench_tg $D-q8_0 -fa 1
  stage gguf_iq4xs 40 write_gguf $D iq4_xs && stage bench_iq4xs 30 bench_tg $D-iq4_xs -fa 1
  rm -f "$GGUF/$D-q8_0.gguf" "$GGUF/$D-iq4_xs.gguf"
  stage gguf_70b 100 write_gguf llama3.1-70b q4_k_m && stage bench_70b 50 bench_tg llama3.1-70b-q4_k_m -fa 1
  pack
  ;;
doctor)
  # shellcheck source=/dev/null
  source "$HERE/llamacpp_doctor.sh"
  ;;
*)
  echo "usage: llamacpp_cuda.sh prepare|build|doctor" >&2
  exit 2
  ;;
esac
record done ok "$(elapsed)"
cp "$OUT/stages.tsv" "$RES/" 2>/dev/null
pack
