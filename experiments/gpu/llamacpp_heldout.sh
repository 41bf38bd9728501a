#!/usr/bin/env bash
# One device call (issue 27): llama.cpp's CUDA binaries built on the dev box start on the H200,
# its mat-vec kernels run at the models' decode shapes (test-backend-ops perf, SQL: the per-op
# evidence a kernel profile is fitted to), then llama-bench tg128 runs on GGUFs that were held
# out of every fit (their predictions are committed before the call:
# experiments/results/2026-12-02_h200-llamacpp/heldout_preregistered.json).
#
#   bash experiments/gpu/llamacpp_local_build.sh pack      # here: .gpu/gpu27/ (bins, wheel, scripts)
#   run(command="DEADLINE=175 bash .gpu/gpu27/llamacpp_heldout.sh", carry=[".gpu/gpu27"],
#       timeout_s=195)
#   FAKE=1 bash experiments/gpu/llamacpp_heldout.sh        # dry run here: fake binaries, tiny GGUFs
# Or with the source only (llamacpp_local_build.sh pack-source): the call builds llama-bench
# first (static, sm_90, ~4 min on 16 cores; UNPACK_S=360 gives the stage its time) and brings the
# binary back as $OUT/bin.tar.xz; MATVEC="" then (test-backend-ops is not built).
# NCU=1 also times every kernel of a short decode run of each file inside llama.cpp's CUDA graph
# (Nsight Compute, $RES/ncu-FILE.csv.gz: experiments/validation/llamacpp_kernels.py reads them);
# TRACE=1 records them with CUPTI instead, not serialised (kernel_times.cpp, $RES/cupti-FILE.tsv.gz).
#
# Every stage appends "stage<TAB>ok|fail|timeout|skip<TAB>seconds<TAB>note" to $OUT/stages.tsv
# and runs under its own time limit, so a failed or cut call says which stage it reached. The
# GGUF writer runs beside the kernel timing (CPU and disk only; at most two files on the disk)
# so the held-out files are ready when the mat-vecs end. Results: $OUT/stages.tsv,
# $OUT/matvec.sql.gz, $OUT/results.tar.gz (llama-bench JSON, logs, env, written files).
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
D=${GPU_DIR:-$HERE}
W=${WORK:-/tmp/lcho}
OUT=${OUT:-/tmp/lcho-out}
DEADLINE=${DEADLINE:-175}  # seconds: no stage runs past this (the call's timeout is above it)
SITE=${SITE:-/tmp/site}  # the carried wheels (gguf) install here
# held out of every fit, cheapest-most-valuable first (shape:ftype of random_gguf.py); the last
# is a fitted file measured again (the previous machine's 3.644 ms), for repeatability
HELDOUT=${HELDOUT:-"llama3.1-8b:q8_0 mistral-nemo-12b:q5_k_m mixtral-8x7b:q4_k_m qwen3-32b:q4_k_m llama3.1-8b:iq4_xs llama3.1-8b:q6_k llama3.1-8b:q4_k_m"}
MATVEC=${MATVEC-"matvec-qwen3-30b-a3b matvec-llama3.1-8b matvec-extra-llama3.1-8b"}
# test-backend-ops' perf loop measures >= 1 s per case; 0.2 s (>= 10^4 kernels here) is plenty
export GGML_PERF_MIN_US=${GGML_PERF_MIN_US:-200000}
T0=$(date +%s)
RES=$W/results
GG=$W/gguf
BIN=$W/bin
rm -rf "$GG" "$RES"
mkdir -p "$GG" "$RES" "$OUT"

left() { echo $((DEADLINE - ($(date +%s) - T0))); }
record() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${4:-}" >>"$OUT/stages.tsv"; }
# stage NAME NEED_S LIMIT_S CMD...: skipped when fewer than NEED_S seconds are left, else CMD
# under min(LIMIT_S, what is left); its output in $RES/NAME.log
stage() {
  local name=$1 need=$2 lim=$3
  shift 3
  local l
  l=$(left)
  if [ "$l" -lt "$need" ]; then
    record "$name" skip 0 "only ${l}s left, needs ${need}s"
    return 1
  fi
  [ "$lim" -gt "$l" ] && lim=$l
  local s rc
  s=$(date +%s)
  echo "== $name (t=$(($(date +%s) - T0))s, limit ${lim}s)"
  # the stage's shell functions run in a child bash (timeout runs programs, not functions)
  timeout -k 2 "$lim" bash -c '"$@"' _ "$@" >"$RES/$name.log" 2>&1
  rc=$?
  local st=ok
  [ $rc -ne 0 ] && st=fail
  [ $rc -eq 124 ] || [ $rc -eq 137 ] && st=timeout
  record "$name" $st $(($(date +%s) - s)) \
    "$([ $st = ok ] || echo "rc=$rc: $(tail -c 240 "$RES/$name.log" | tr '\n\t' '  ')")"
  return $rc
}
pack() {
  cp "$OUT/stages.tsv" "$RES/" 2>/dev/null
  tar -C "$W" -czf "$OUT/results.tar.gz" results 2>/dev/null || true
  cat "$RES"/matvec-*.sql 2>/dev/null | gzip -9 >"$OUT/matvec.sql.gz"
}

if [ "${FAKE:-0}" = 1 ]; then  # the dry run: the same flow on fake binaries and tiny shapes
  HELDOUT=${FAKE_HELDOUT:-"tiny-llama:q8_0 tiny-moe:q4_k_m tiny-llama:iq4_xs"}
  unpack() { mkdir -p "$BIN" && cp "$HERE/fake_llamacpp.sh" "$BIN/fake" && chmod +x "$BIN/fake" && for b in llama-bench test-backend-ops llama-server; do ln -sf fake "$BIN/$b"; done; }
elif [ -e "$D/bin.tar.xz" ]; then
  unpack() { tar -xJf "$D/bin.tar.xz" -C "$W"; }
else  # only the source was carried (llamacpp_local_build.sh pack-source): build llama-bench here
  unpack() {
    rm -rf "$W/src" "$W/build" && mkdir -p "$W/src" && tar -xJf "$D/llama-src.tar.xz" -C "$W/src" &&
      cmake -S "$W/src/llama.cpp" -B "$W/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real -DBUILD_SHARED_LIBS=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON \
        -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
        -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF &&
      ninja -C "$W/build" -j "$(nproc)" llama-bench &&
      mkdir -p "$BIN" && cp "$W/build/bin/llama-bench" "$BIN/" && rm -rf "$W/build" "$W/src" &&
      { tar -C "$W" -cf - bin | xz -T0 -6 >"$OUT/bin.tar.xz" || rm -f "$OUT/bin.tar.xz"; }
  }
fi

# cuBLAS is loaded at run time: the image's CUDA toolkit or its pip wheels (nvidia-cublas)
libpath() {
  local d p=""
  for d in /usr/local/cuda*/lib64 /usr/local/cuda*/targets/*/lib \
    /opt/torch/.venv/lib/python3.12/site-packages/nvidia/*/lib \
    /opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib /usr/lib/x86_64-linux-gnu; do
    [ -e "$d/libcublas.so.13" ] && p="$p${p:+:}$d"
  done
  if [ -z "$p" ]; then  # not where the image was seen to keep it: look (bounded)
    d=$(timeout 10 find / -xdev -name libcublas.so.13 -print -quit 2>/dev/null)
    [ -n "$d" ] && p=$(dirname "$d")
  fi
  echo "$p"
}
env_facts() {
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem \
    --format=csv
  uname -a
  grep PRETTY /etc/os-release
  ldd --version | head -1
  nproc
  free -g | head -2
  df -h "$W" | tail -1
  python3 -c 'import numpy; print("numpy", numpy.__version__)'
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
}
smoke() {  # the carried binaries find their libraries and the GPU
  ldd "$BIN/llama-bench" | grep -E 'cublas|cuda|not found'
  "$BIN/llama-bench" --list-devices | tee /dev/stderr | grep -q CUDA0 || return 1
  [ ! -e "$BIN/llama-server" ] || "$BIN/llama-server" --version  # not needed by this call
}
wheels() {
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "$D"/whl/*.whl && PYTHONPATH=$SITE python3 -c 'import gguf'
}
matvec() {  # matvec NAME: line-buffered, so what a time limit cuts keeps every finished row
  stdbuf -oL "$BIN/test-backend-ops" perf -b CUDA0 --test-file "$D/$1.txt" --output sql \
    >"$RES/$1.sql"
  local rc=$?
  grep -c '^INSERT' "$RES/$1.sql"
  return $rc
}
writer() {  # the held-out files in order, at most two on the disk at a time (64 GB)
  local spec name n
  for spec in $HELDOUT; do
    name=${spec%%:*}-${spec##*:}
    while n=$(find "$GG" -name '*.gguf' | wc -l) && [ "$n" -ge 2 ]; do sleep 0.3; done
    if [ "$(left)" -lt 20 ]; then
      touch "$GG/$name.failed"
      continue
    fi
    PYTHONPATH=$SITE timeout -k 2 "$(left)" python3 "$D/random_gguf.py" \
      --shape "${spec%%:*}" --ftype "${spec##*:}" --out "$GG/$name.gguf" \
      >>"$RES/gguf_files.jsonl" 2>>"$RES/writer.log" || touch "$GG/$name.failed"
  done
}
bench() {  # llama-bench tg128 at depth 0, all layers on the GPU, flash attention on, 3 runs
  "$BIN/llama-bench" -m "$GG/$1.gguf" -ngl 99 -fa 1 -p 0 -n 128 -d 0 -r 3 -o json \
    >"$RES/bench-$1.json"
}
kernels() {  # with NCU=1: every kernel of a short decode run timed inside llama.cpp's graph
  # (Nsight Compute; nsys cannot make a report on these machines). --cache-control none keeps
  # the L2 as the graph leaves it, --clock-control none the clocks as they run (METHOD.md)
  local ncu
  ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
  [ -n "$ncu" ] || { echo "no ncu"; return 1; }
  "$ncu" --clock-control none --cache-control none --metrics gpu__time_duration.sum -f \
    -o "$W/ncu-$1" "$BIN/llama-bench" -m "$GG/$1.gguf" -ngl 99 -fa 1 -p 0 -n "${NCU_TOKENS:-3}" \
    -d 0 -r 1 -o json >"$RES/ncu-bench-$1.json" || return 1
  "$ncu" -i "$W/ncu-$1.ncu-rep" --csv --page raw --print-units base | gzip -9 >"$RES/ncu-$1.csv.gz"
  rm -f "$W/ncu-$1.ncu-rep"
  zcat "$RES/ncu-$1.csv.gz" | wc -l
}
cupti_lib() {  # with TRACE=1: the CUPTI kernel trace (kernel_times.cpp), built here
  local lib
  lib=$(ls /usr/local/cuda*/lib64/libcupti.so /usr/local/cuda*/lib/libcupti.so \
    /usr/local/cuda*/extras/CUPTI/lib64/libcupti.so 2>/dev/null | head -1)
  [ -n "$lib" ] || lib=$(timeout 10 find / -xdev -name 'libcupti.so*' -print -quit 2>/dev/null)
  [ -n "$lib" ] || { echo "no libcupti"; return 1; }
  echo "cupti: $lib"
  g++ -O2 -shared -fPIC -I/usr/local/cuda/include "$D/kernel_times.cpp" -o "$W/libkernel_times.so" \
    "$lib" -Wl,-rpath,"$(dirname "$lib")"
}
trace() {  # with TRACE=1: every kernel of a decode run, start and end on the GPU, not serialised
  CUDA_INJECTION64_PATH="$W/libkernel_times.so" KERNEL_TIMES_OUT="$W/cupti-$1.tsv" \
    "$BIN/llama-bench" -m "$GG/$1.gguf" -ngl 99 -fa 1 -p 0 -n "${TRACE_TOKENS:-32}" -d 0 -r 1 \
    -o json >"$RES/cupti-bench-$1.json" || return 1
  tail -1 "$W/cupti-$1.tsv"
  wc -l <"$W/cupti-$1.tsv"
  gzip -9 -c "$W/cupti-$1.tsv" >"$RES/cupti-$1.tsv.gz"
}

export -f left record unpack libpath env_facts smoke wheels matvec bench kernels cupti_lib trace
export HERE D W OUT DEADLINE T0 RES GG BIN HELDOUT SITE
record start ok 0 "deadline ${DEADLINE}s, held out: $HELDOUT"
stage unpack 0 "${UNPACK_S:-30}" unpack || { pack; exit 1; }
export LD_LIBRARY_PATH="$(libpath)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
stage env 0 15 env_facts
stage wheels 0 30 wheels
if ! stage smoke 0 30 smoke; then  # nothing else can run: say why, and stop
  { ldd "$BIN/llama-bench"; ls -la /usr/local/ /opt/torch/.venv/lib/python3.12/site-packages/nvidia; } \
    >"$RES/smoke-why.log" 2>&1
  pack
  exit 1
fi
[ "${TRACE:-0}" = 1 ] && stage cupti 0 60 cupti_lib
writer &
WPID=$!
for m in $MATVEC; do stage "$m" 20 60 matvec "$m"; done
pack
for spec in $HELDOUT; do
  name=${spec%%:*}-${spec##*:}
  s=$(date +%s)
  while [ ! -s "$GG/$name.gguf" ] && [ ! -e "$GG/$name.failed" ] && [ "$(left)" -gt 12 ]; do
    sleep 0.3
  done
  if [ -s "$GG/$name.gguf" ]; then
    record "wait_$name" ok $(($(date +%s) - s))
    stage "bench_$name" 12 60 bench "$name"
    [ "${NCU:-0}" = 1 ] && stage "kernels_$name" 30 "${NCU_S:-120}" kernels "$name"
    [ "${TRACE:-0}" = 1 ] && [ -e "$W/libkernel_times.so" ] && stage "trace_$name" 15 60 trace "$name"
  else
    record "bench_$name" skip 0 "no file (writer failed or deadline)"
  fi
  rm -f "$GG/$name.gguf"
done
pkill -TERM -P "$WPID" 2>/dev/null  # the writer's timeout (it passes TERM on to python)
kill "$WPID" 2>/dev/null
wait "$WPID" 2>/dev/null
rm -rf "$GG"
record done ok $(($(date +%s) - T0))
pack
