#!/usr/bin/env bash
# test-backend-ops perf of llama.cpp's decode mat-vecs (MUL_MAT / MUL_MAT_ID at one token) at the
# shapes of Llama-3.1-8B and Qwen3-30B-A3B, each in Q4_K, Q6_K, Q8_0 and F16, SQL output (its CSV
# printer drops the timings). One device call, after llamacpp_cuda.sh build made the binaries:
#
#   mkdir -p .gpu/gpu2 && cp experiments/gpu/llamacpp_matvec.sh experiments/gpu/ops/matvec-*.txt .gpu/gpu2/
#   ln .gpu/gpu/bin.tar.xz .gpu/gpu2/       # carry [".gpu/gpu2"]; command:
#   bash .gpu/gpu2/llamacpp_matvec.sh       # -> $OUT/matvec.sql.gz, $OUT/stages.tsv
#
# The op lines (experiments/gpu/ops/matvec-*.txt) are the exported decode graphs' mat-vec lines
# (experiments/results/2026-12-02_h200-llamacpp/call1/ops-*.txt) with the weight's type and strides
# rewritten per type. Each model's run has its own time limit so a slow one leaves the other's.
# Its cases ran (2026-12-02, call 3) through experiments/gpu/llamacpp_heldout.sh, which runs the same op
# files with the locally built binaries: experiments/results/2026-12-02_h200-llamacpp/call3/matvec.sql.
set -u
D=${GPU_DIR:-.gpu/gpu2}
W=${WORK:-/tmp/lcmv}
OUT=${OUT:-/tmp/lcmv-out}
mkdir -p "$W" "$OUT"
t0=$(date +%s)
stage() {  # stage NAME LIMIT_S CMD...: runs CMD under a limit, one line in stages.tsv
  local name=$1 lim=$2 s=$(date +%s); shift 2
  timeout "$lim" "$@"; local rc=$?
  printf '%s\t%s\t%s\n' "$name" "$rc" "$(( $(date +%s) - s ))" >>"$OUT/stages.tsv"
}
stage unpack 20 tar -xJf "$D/bin.tar.xz" -C "$W"
export LD_LIBRARY_PATH="$W/bin:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,clocks.max.mem,clocks.max.sm --format=csv >"$OUT/gpu.csv" 2>&1
for m in llama3.1-8b qwen3-30b-a3b; do
  # line-buffered: what a timeout cuts keeps every finished row
  stage "perf-$m" 45 stdbuf -oL "$W/bin/test-backend-ops" perf -b CUDA0 \
    --test-file "$D/matvec-$m.txt" --output sql >"$W/matvec-$m.sql" 2>"$W/matvec-$m.err"
  tail -3 "$W/matvec-$m.err" >>"$OUT/stages.tsv"
done
cat "$W"/matvec-*.sql | gzip -9 >"$OUT/matvec.sql.gz"
printf 'total\t0\t%s\n' "$(( $(date +%s) - t0 ))" >>"$OUT/stages.tsv"
