#!/usr/bin/env bash
# Multi-GPU evidence run (issues 7 and 10), for nvidia-h200-x2 / -x4 / -x8. Each part < 10 min:
#
#   bash experiments/gpu/multi_gpu_session.sh all
#       one call for a 2-GPU machine: tp (canary first), comm, then trace; predictions are made
#       afterwards on any machine with `tp_decode.py --repredict RESULT --profile profile.json`.
#   bash experiments/gpu/multi_gpu_session.sh comm
#       probe (how the GPUs are linked), calibrate, commbench at world sizes 2,4,8 (as many as
#       the machine has) x sizes 1K..64M x variants of data/commbench.yaml group `issue7`
#       (default; NCCL_ALGO=Ring/Tree; NCCL_PROTO=LL/LL128/Simple; NCCL_P2P_DISABLE=1;
#       NCCL_MAX_NCHANNELS=16 + NCCL_BUFFSIZE=16777216), eager and in CUDA graphs, with the
#       Llama-3.1-70B per-token cost; writes profile.json = calibrate + commbench fits.
#   bash experiments/gpu/multi_gpu_session.sh tp [PROFILE.json]   (no profile: predict with datasheet numbers)
#       a canary (Llama-3.1-8B shape at TP 2, 90 s limit, stops at the first failure with every
#       rank's stage and stack), then TP decode steps: dense (Llama-3.1-8B, Qwen3-32B at TP 1 and
#       the machine's TP sizes; Llama-3.1-70B at those TP sizes) and MoE (Qwen3-30B-A3B at TP and
#       EP), CUDA graph and eager, default and NCCL_P2P_DISABLE=1, each with the same step timed
#       without its collectives (the in-step allreduce cost), beside predict's number.
# Every tp_decode run saves its rows after each configuration and names the one in flight, and a
# failed or hung configuration leaves each rank's stage, exit code and last words (stacks) in
# the row; full rank logs are packed into extras.tgz. At most 8 files come back per call.
#   bash experiments/gpu/multi_gpu_session.sh issue28      (nvidia-h200-x2; docs/trace.md "Several GPUs")
#       1. tp_decode --trace at TP=2, Llama-3.1-8B and Qwen3-30B-A3B shapes, CUDA graphs and eager,
#       default and NCCL_P2P_DISABLE=1, every rank recorded by torch.profiler; commbench at world
#       size 2 (default, p2p-off) as the allreduce class's reference; 2. llamacpp-split below;
#       then experiments/gpu/trace_report.py on the machine (report_trace.md, trace_report.json).
#   bash experiments/gpu/multi_gpu_session.sh issue29      (nvidia-h200-x4 / -x8)
#       probe; tp_decode --trace at TP 4 and 8 (as many GPUs as there are; TRACE29_WS="8" for
#       one): Llama-3.1-70B, Qwen3-30B-A3B with TP-sharded experts and EP, graphs and eager,
#       default and p2p-off; commbench at those world sizes (group issue7, 1K..64M), then each
#       traced row re-predicted with the measured fits; the trace report.
#   bash experiments/gpu/multi_gpu_session.sh trace        both PyTorch halves (trace28 + trace29)
#   bash experiments/gpu/multi_gpu_session.sh llamacpp-split
#       llama-bench (single stream) and llama-server (1, 2, 4 concurrent requests) with every
#       --split-mode the pinned llama.cpp has (layer, row; tensor where present) on 2 GPUs, the
#       dense and MoE GGUFs (random weights, q4_k_m), beside `predict --engine llamacpp --gguf`
#       at TP 1 and 2 (predict has no split-mode input); LC_PROFILE=FILE adds the llama.cpp-kernel
#       profile. Needs .gpu/gpu/bin.tar.xz and .gpu/gpu/whl (experiments/gpu/llamacpp_cuda.sh prepare
#       + build). TODO(issue 28): the doctor on the slowest split mode is not run yet.
#   Path check on a CPU: TINY=1 WORLD_SIZES=2 TRACE29_WS=2 PYTHON=.venv/bin/python \
#       OUT=/tmp/x WORK=/tmp/w bash experiments/gpu/multi_gpu_session.sh trace  (gloo ranks, tiny shapes)
#   DEADLINE (s, default 560) bounds the trace/llama.cpp parts: no stage starts past it.
# Device tool: run(kind="nvidia-h200-x2", carry=[".whl"], command="bash experiments/gpu/multi_gpu_session.sh all")
# Issue 28: run(kind="nvidia-h200-x2", carry=[".gpu/gpu/bin.tar.xz", ".gpu/gpu/whl"],
#               command="WHL_DIR=.gpu/gpu/whl bash experiments/gpu/multi_gpu_session.sh issue28")
# Issue 29: run(kind="nvidia-h200-x8", carry=[".gpu/gpu/whl"],
#               command="WHL_DIR=.gpu/gpu/whl bash experiments/gpu/multi_gpu_session.sh issue29")
#
# NVLink multicast stays off in every process (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
# NVSHMEM_DISABLE_NVLS=1): the device README says why. Carry .whl (pydantic & co.: experiments/gpu/gpu_wheels.sh).
set -u
PART=${1:-comm}
OUT=${OUT:-experiments/results/multi_gpu_session}
mkdir -p "$OUT"
. "$(dirname "$0")/gpu_env.sh"  # PY, wheels, PYTHONPATH, NVLS off
N=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
WS=$(for w in 2 4 8; do [ "$w" -le "${N:-0}" ] && printf '%s,' "$w"; done | sed 's/,$//')
WS=${WORLD_SIZES:-$WS}
if [ -z "$WS" ]; then
  echo "only ${N:-0} GPU(s): multi-GPU runs need 2 or more (set WORLD_SIZES=1 for a path check)" >&2
  WS=1
fi
W=${WORK:-/tmp/mg_work}; mkdir -p "$W/logs"
LOG="$OUT/session_$PART.log"
step() { echo; echo "== $* ($(date -u +%T))"; }

comm() {
  step "probe"; timeout 60 $PY -m ceiling probe --out "$W/probe.json"
  step "calibrate (GPU 0)"; timeout 150 $PY -m ceiling calibrate --results "$W/calibrate.json" --out "$W/profile_calibrate.json"
  step "commbench"
  # results and profile are rewritten after every (variant, world size): a cut-off keeps them
  timeout 300 $PY -m ceiling commbench --world-sizes "$WS" --sizes 1K..64M --preset issue7 \
    --model llama-3.1-70b --budget-ms 5 --reps 3 --rank-timeout 120 --quiet \
    --merge "$W/profile_calibrate.json" --out "$OUT/profile.json" --results "$OUT/commbench.json"
}

tp() {
  local prof=${1:-}
  local PROF_ARG=${prof:+--profile $prof}
  local LAYERS_ARG=${LAYERS:+--layers $LAYERS}   # LAYERS=40: a 70B shape that fits one GPU (path check)
  local TP1="1,$WS"
  step "canary: Llama-3.1-8B shape at TP ${WS%%,*} (stops at the first failure)"
  if ! NCCL_DEBUG=WARN timeout 150 $PY experiments/gpu/tp_decode.py --model llama-3.1-8b --tp "${WS%%,*}" --variant default \
      --iters 10 --timeout 90 --stop-on-error --logs "$W/logs/canary" $PROF_ARG --out "$OUT/tp_canary.json"; then
    echo "canary failed: the TP matrix is skipped; the row above has every rank's stage and last words"
    return 1
  fi
  step "TP decode, dense (Llama-3.1-8B, Qwen3-32B at TP $TP1; Llama-3.1-70B at TP $WS)"
  timeout 200 $PY experiments/gpu/tp_decode.py --model llama-3.1-8b,qwen3-32b --tp "$TP1" --variant default,p2p-off \
    --iters 20 --timeout 90 --logs "$W/logs/dense" $LAYERS_ARG $PROF_ARG --out "$OUT/tp_decode_dense.json"
  timeout 150 $PY experiments/gpu/tp_decode.py --model llama-3.1-70b --tp "$WS" --variant default,p2p-off \
    --iters 20 --timeout 120 --logs "$W/logs/dense70" $LAYERS_ARG $PROF_ARG --out "$OUT/tp_decode_dense70.json"
  step "TP decode, MoE (Qwen3-30B-A3B shape, TP and EP)"
  timeout 200 $PY experiments/gpu/tp_decode.py --model qwen3-30b-a3b --tp "$TP1" --parallel tp,ep --variant default,p2p-off \
    --iters 20 --timeout 90 --logs "$W/logs/moe" $PROF_ARG --out "$OUT/tp_decode_moe.json"
}

# ---------------------------------------------------------------- traced TP decode (issues 28, 29)
# DEADLINE (s, default 560): no stage starts once too little is left; each gets what is left.
DEADLINE=${DEADLINE:-560}; T0=$(date +%s)
left() { echo $((DEADLINE - ($(date +%s) - T0))); }
# TINY=1: the same commands on tiny shapes with gloo ranks (a path check on a CPU box)
TINY_ARGS=${TINY:+--tiny --backend gloo}
CB_ARGS=${TINY:+--backend gloo --no-graph}
[ -n "${TINY:-}" ] && { CB_SIZES=${CB_SIZES:-128,1K}; CB_PRESET=${CB_PRESET:-default}; }
TR=$W/traces
# run_for NEED_S RESERVE_S CMD...: CMD under `timeout` of what is left minus RESERVE, if >= NEED
run_for() {
  local need=$1 reserve=$2; shift 2
  local t=$(( $(left) - reserve ))
  if [ "$t" -lt "$need" ]; then echo "skipped (only ${t}s left, needs ${need}s): $*"; return 1; fi
  timeout "$t" "$@"
}
traced() {  # traced NAME TP_DECODE_ARGS...: one tp_decode run recorded by the profiler
  local name=$1; shift
  run_for 60 "${RESERVE:-60}" $PY experiments/gpu/tp_decode.py "$@" --trace "$TR" \
    --trace-steps "${TRACE_STEPS:-6}" --iters 20 --timeout 120 --logs "$W/logs/$name" \
    $TINY_ARGS ${PROF:+--profile $PROF} --out "$TR/tp_trace_$name.json"
}
trace28() {  # issue 28 run 1: TP=2, dense + MoE shape, CUDA graphs (and eager), default / P2P off
  mkdir -p "$TR"
  step "issue 28: traced TP=2 decode, Llama-3.1-8B and Qwen3-30B-A3B shapes, default + p2p-off"
  RESERVE=${RESERVE28:-120} traced tp2 --model llama-3.1-8b,qwen3-30b-a3b --tp 2 --variant default,p2p-off
  step "commbench at world size 2 (the allreduce class's reference: default, p2p-off)"
  run_for 30 "$(( ${RESERVE28:-100} - 40 ))" $PY -m ceiling commbench --world-sizes 2 --sizes "${CB_SIZES:-1K..1M}" \
    --preset default --preset p2p-off --budget-ms 5 --reps 3 --rank-timeout 90 --quiet $CB_ARGS \
    --results "$TR/commbench_ws2.json"
}
trace29() {  # issue 29's tp_decode part at TP 4 and 8: 70B dense; MoE TP-sharded and EP
  mkdir -p "$TR"
  local ws29=${TRACE29_WS:-$(for w in 4 8; do [ "$w" -le "${N:-0}" ] && printf '%s ' "$w"; done)}
  if [ -z "$ws29" ]; then echo "issue 29 needs 4 or 8 GPUs (${N:-0} here): skipped"; return 0; fi
  step "probe"; run_for 10 0 $PY -m ceiling probe --out "$TR/probe.json" >/dev/null
  for w in $ws29; do
    step "issue 29: traced TP=$w decode, Llama-3.1-70B, graphs + eager, default + p2p-off"
    traced "dense70_tp$w" --model llama-3.1-70b --tp "$w" --variant default,p2p-off
    step "issue 29: traced TP=$w decode, Qwen3-30B-A3B, TP-sharded experts and EP=$w"
    traced "moe_tp$w" --model qwen3-30b-a3b --tp "$w" --parallel tp,ep --variant default,p2p-off
  done
  step "commbench at world sizes ${ws29% } (variant group issue7: the allreduce class's reference)"
  run_for 60 "${RESERVE:-45}" $PY -m ceiling commbench --world-sizes "$(echo $ws29 | tr ' ' ,)" \
    --sizes "${CB_SIZES:-1K..64M}" --preset "${CB_PRESET:-issue7}" --model llama-3.1-70b \
    --budget-ms 3 --reps 3 --rank-timeout 120 --quiet $CB_ARGS \
    --out "$TR/profile.json" --results "$TR/commbench_ws$(echo $ws29 | tr ' ' _).json" || return 0
  step "predict beside each traced row, with the collective fits just measured"
  for f in "$TR"/tp_trace_*.json; do
    [ -z "${TINY:-}" ] && [ -f "$TR/profile.json" ] && \
      run_for 5 20 $PY experiments/gpu/tp_decode.py --repredict "$f" --profile "$TR/profile.json" >/dev/null
  done
}
llamacpp_split() {  # issue 28 run 2: llama.cpp's split modes on 2 GPUs, beside predict
  # Needs what `bash experiments/gpu/llamacpp_cuda.sh prepare` + its `build` call leave in $GPU_DIR
  # (.gpu/gpu): bin.tar.xz (llama-server, llama-bench) and whl/ (gguf for random_gguf.py).
  local GD=${GPU_DIR:-.gpu/gpu} L=$W/llamacpp
  mkdir -p "$L/res" "$L/gguf"
  if [ -f "$GD/bin.tar.xz" ]; then tar -xJf "$GD/bin.tar.xz" -C "$L"
  elif ls "$GD"/bin.tar.gz.* >/dev/null 2>&1; then cat "$GD"/bin.tar.gz.* | tar -xz -C "$L"
  else echo "llamacpp-split: no llama.cpp binaries in $GD (llamacpp_cuda.sh build makes them): skipped"; return 0; fi
  local BIN=$L/bin
  "$BIN/llama-server" --version 2>&1 | tail -2
  # the split modes this pinned llama.cpp has (layer, row; tensor where present), from its help
  local modes
  modes=$("$BIN/llama-server" --help 2>&1 | grep -A4 -- '--split-mode' | grep -oE '\b(layer|row|tensor)\b' | sort -u | tr '\n' ' ')
  [ -z "$modes" ] && { echo "no split modes read from --help: trying layer row"; modes="layer row"; }
  echo "split modes: $modes"
  local port=18190 shape sm c i f
  for shape in ${LC_SHAPES:-llama3.1-8b qwen3-30b-a3b}; do
    f=$L/gguf/$shape-q4_k_m.gguf
    step "llama.cpp split modes: $shape q4_k_m ($modes)"
    run_for 60 60 $PY experiments/gpu/random_gguf.py --shape "$shape" --ftype q4_k_m --out "$f" \
      > "$L/res/gguf-$shape.json" || { echo "no GGUF for $shape"; continue; }
    local cat=${shape/llama3.1/llama-3.1}
    for tp in 1 2; do  # predict has no split-mode input: TP=2 and one GPU bracket the modes
      $PY -m ceiling predict --model "$cat" --gpu h200 --tp $tp --engine llamacpp --gguf "$f" \
        ${LC_PROFILE:+--profile $LC_PROFILE} --json > "$L/res/predict-$shape-tp$tp.json" 2>&1
    done
    for sm in $modes; do
      # single stream: llama-bench decode (tg64) at depth 0 on both GPUs
      run_for 30 45 "$BIN/llama-bench" -m "$f" -ngl 99 -sm "$sm" -fa 1 -p 0 -n 64 -r 2 -o json \
        > "$L/res/bench-$shape-$sm.json" 2> "$L/res/bench-$shape-$sm.log"
      # a small concurrency sweep through llama-server (4 slots), each request's own timings
      [ "$(left)" -lt 60 ] && { echo "server sweep skipped: $(left)s left"; continue; }
      "$BIN/llama-server" -m "$f" -ngl 99 -sm "$sm" -fa on -c 8192 -np 4 --metrics \
        --port $port > "$L/res/server-$shape-$sm.log" 2>&1 &
      local pid=$!
      for _ in $(seq 120); do  # until healthy, or the server has exited (its log says why)
        curl -sf localhost:$port/health >/dev/null && break
        kill -0 $pid 2>/dev/null || { echo "llama-server -sm $sm exited: see server-$shape-$sm.log"; break; }
        sleep 0.5
      done
      kill -0 $pid 2>/dev/null || continue
      for c in 1 2 4; do
        local reqs=()
        for i in $(seq "$c"); do
          curl -s -m 60 localhost:$port/completion -d '{"prompt":"hello world","n_predict":64,"ignore_eos":true,"cache_prompt":false}' \
            > "$L/res/server-$shape-$sm-c$c-$i.json" &
          reqs+=($!)
        done
        wait "${reqs[@]}"
      done
      curl -s localhost:$port/metrics > "$L/res/server-$shape-$sm-metrics.txt"
      kill $pid 2>/dev/null; wait $pid 2>/dev/null
      port=$((port + 1))
    done
    rm -f "$f"  # disk: the MoE file is ~17 GB
  done
  # TODO(issue 28): `ceiling doctor --engine llamacpp` on the slowest split mode (experiments/gpu/
  # llamacpp_doctor.sh runs the doctor on one GPU; its two-GPU form is not written yet).
  (cd "$W" && tar -czf "$OUT/llamacpp_split.tgz" llamacpp/res)
}
trace_report() {  # the figures and the goals (on the machine: every rank's trace is read there)
  step "trace report"
  $PY experiments/gpu/trace_report.py "$TR" --json "$TR/trace_report.json" > "$OUT/report_trace.md"
  cp "$TR/trace_report.json" "$OUT/" 2>/dev/null
  # the traces themselves: <= 3 files of 15 MiB (the tool returns 8 files, 64 MiB in all);
  # when they do not fit, ranks 0 and 1 of each configuration (the report read every rank)
  (cd "$W" && tar -czf "$W/traces.tgz" traces)
  local keep lim=$(( ${TRACE_TAR_MB:-45} * 1024 * 1024 ))
  for keep in 'rank[01].pt.trace.json.gz' 'rank0.pt.trace.json.gz'; do
    [ "$(stat -c %s "$W/traces.tgz")" -le "$lim" ] && break
    echo "traces over ${TRACE_TAR_MB:-45} MiB: keeping only $keep of each (the report above read all ranks)"
    (cd "$W" && find traces -name '*.json' -o -name "$keep" | tar -czf "$W/traces.tgz" -T -)
  done
  [ "$(stat -c %s "$W/traces.tgz")" -le "$lim" ] || \
    (cd "$W" && find traces -name '*.json' | tar -czf "$W/traces.tgz" -T -)  # figures only
  split -b 15M -d "$W/traces.tgz" "$OUT/traces.tgz."
  ls -la "$OUT"
}

{
  step "machine ($N GPUs, world sizes $WS)"; date -u; nvidia-smi -L; nvidia-smi topo -m
  $PY -c "import torch; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version(), 'gpus', torch.cuda.device_count())"
  case "$PART" in
    comm) comm; $PY experiments/gpu/multi_gpu_report.py "$OUT/commbench.json" > "$OUT/report_comm.md" ;;
    tp) tp "${2:-}"
        $PY experiments/gpu/multi_gpu_report.py "$OUT"/tp_canary.json "$OUT"/tp_decode_*.json > "$OUT/report_tp.md" ;;
    issue28) RESERVE28=${RESERVE28:-260} trace28; llamacpp_split; trace_report ;;
    trace28) trace28; trace_report ;;
    llamacpp-split) llamacpp_split ;;
    issue29|trace29) PROF=${PROF:-}; trace29; trace_report ;;
    trace) trace28; trace29; trace_report ;;  # issue 28's and 29's PyTorch halves
    all) tp ""; comm; trace28; trace29; trace_report
         $PY experiments/gpu/multi_gpu_report.py "$OUT"/tp_canary.json "$OUT"/tp_decode_*.json \
           "$OUT/commbench.json" > "$OUT/report_all.md" ;;
    *) echo "usage: multi_gpu_session.sh all | comm | tp [PROFILE.json] | issue28 | issue29 | trace | trace28 | llamacpp-split" >&2 ;;
  esac
  step "done"; date -u
} 2>&1 | tee "$LOG"
# full rank logs and the smaller files in one archive (the device tool returns at most 8 files)
tar -czf "$OUT/extras.tgz" -C "$W" --exclude=./traces --exclude=./traces.tgz . 2>/dev/null
