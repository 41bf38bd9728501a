# Sourced by llamacpp_cuda.sh doctor (its stage/record/pack helpers): the doctor end to end on
# llama-server CUDA and the known-answer runs, each beside the unchanged variant, then
# test-backend-ops perf at the models' decode shapes (SQL: the CSV printer has no timings) and
# llama-bench on weight types held out of every fit. The binaries come from the first call
# (bin.tar.gz.* carried in .gpu/gpu/); ceiling runs from .gpu/gpu/src with the carried wheels.
# shellcheck shell=bash
VARIANTS=${VARIANTS:-$HERE/variants}
CEIL=("${PY:-python3}" -m ceiling)
export PYTHONPATH="$GPU_DIR/src:$SITE" COLUMNS=160
REASON="random weights (experiments/gpu/random_gguf.py): the run times llama.cpp's kernels, not answers"
# one setting for the unchanged variant and every change beside it (short: one device call)
TRUTH=(--model-path llama-3.1-8b --gpu h200 --max-tokens 96 --input-len 32 --repeat 2
  --concurrency 1,4 --concurrency-max-tokens 32 --launch-timeout 120)
doctor_run() {  # doctor_run VARIANT
  local v=$1
  timeout 60 "${CEIL[@]}" doctor --variant "$VARIANTS/h200-llamacpp-$v.yaml" "${TRUTH[@]}" \
    --accept-broken-output "$REASON" --out-dir "$RES/doctor-$v" --json >"$RES/doctor-$v.json.out"
  local rc=$?
  # exit 1 = "no request completed / broken output": a known-answer change may cause it
  [ -f "$RES/doctor-$v/doctor.json" ] || return 9
  echo "doctor exit $rc"
  return 0
}
perf_sql() {  # perf_sql NAME OPS_FILE: test-backend-ops perf at the exported shapes, as SQL
  "$BIN/test-backend-ops" perf -b CUDA0 --test-file "$2" --output sql >"$RES/perf-$1.sql"
}
perf_types_sql() {
  "$BIN/test-backend-ops" perf -b CUDA0 -o MUL_MAT --output sql \
    -p 'type_a=(f16|q8_0|q6_K|q5_K|q4_K|iq4_xs),type_b=f32,m=4096,n=1,k=14336,' \
    >"$RES/perf-types.sql"
}
decode_ops() {  # the call-1 decode ops (mat-vec, MoE mat-vec, flash attention) of one model
  awk '$1==29 || $1==30 || $1==74' "$GPU_DIR/ops/ops-$1.txt" >"$RES/ops-$1-matvec.txt"
  wc -l "$RES/ops-$1-matvec.txt"
}

stage env 0 env_facts
stage wheels 0 install_wheels
stage unpack_bins 0 unpack_bins
D=llama3.1-8b
stage gguf_q4km 30 write_gguf $D q4_k_m
pack
stage doctor_8b-q4km 40 doctor_run 8b-q4km
for v in ngl28 fa-off no-graphs one-slot small-ctx; do
  stage "doctor_8b-q4km-$v" 30 doctor_run "8b-q4km-$v"
done
pack
stage ops_q4km 0 decode_ops $D-q4_k_m && stage perf_q4km 30 perf_sql q4km "$RES/ops-$D-q4_k_m-matvec.txt"
stage ops_moe 0 decode_ops qwen3-30b-a3b-q4_k_m && stage perf_moe 30 perf_sql moe "$RES/ops-qwen3-30b-a3b-q4_k_m-matvec.txt"
stage perf_types 25 perf_types_sql
pack
rm -f "$GGUF/$D-q4_k_m.gguf"
# held out of every fit: other weight types (llama-bench, the same settings as call 1)
stage gguf_q8 25 write_gguf $D q8_0 && stage bench_q8 15 bench_tg $D-q8_0 -fa 1
rm -f "$GGUF/$D-q8_0.gguf"
stage gguf_iq4xs 25 write_gguf $D iq4_xs && stage bench_iq4xs 15 bench_tg $D-iq4_xs -fa 1
rm -f "$GGUF/$D-iq4_xs.gguf"
stage gguf_q5km 25 write_gguf $D q5_k_m && stage bench_q5km 15 bench_tg $D-q5_k_m -fa 1
