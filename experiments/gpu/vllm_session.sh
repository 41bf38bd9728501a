#!/usr/bin/env bash
# vLLM 0.25.0 (CUDA) on one lent Hopper GPU, with dummy weights (issue 37). Run from the repo
# root on the GPU machine, one device call per line, back to back (a warm machine keeps /tmp
# 30 s after a call; a `setsid` runner outlives its call):
#
#   here:   bash experiments/gpu/vllm_session.sh prepare   # .vchunks/ (pack + split), .whl/
#   device: bash experiments/gpu/vllm_session.sh stage      # carry [".vparts"] (one chunk per call;
#                                                           #  `next` here moves the next one in)
#   device: bash experiments/gpu/vllm_session.sh start [SHAPE...]   # carry [".whl"]: the runner
#   device: bash experiments/gpu/vllm_session.sh collect [SECONDS]  # waits, packs $OUT
#
# The runner (`plan`) serves each shape in turn: the start-up log, `ceiling bench` decode at
# concurrency 1, 8, 32, 64, a profiler window (--profiler-config torch, CUDA graphs on) through
# /start_profile and /stop_profile, /metrics, then `ceiling doctor --url ... --trace` against
# the same server; after the shapes, `ceiling doctor --variant ... --trace` (the variant names
# the staged Python and its PYTHONPATH) and the known-answer sweep. Every stage appends a line
# to $RUN/STAGES, so each call's collect says how far the run got.
set -u
cmd=${1:-help}; shift || true
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
SITE=/tmp/vsite            # vLLM and its closure (stage.sh)
RUN=/tmp/vrun              # the runner's results
CHUNK_MB=46                # + the working tree (~13 MiB) stays under a call's 64 MiB
SHAPES_ALL="llama8b variant qwen30a3b qwen32fp8 sweep qwen30a3bfp8"  # shapes and phases, in order

model_json() {  # shape -> config under src/ceiling/data/models (the catalog the tool ships)
  case $1 in
    llama8b) echo llama-3.1-8b ;;
    qwen30a3b) echo qwen3-30b-a3b ;;
    qwen32fp8) echo qwen3-32b-fp8 ;;
    qwen30a3bfp8) echo qwen3-30b-a3b-fp8 ;;
    *) echo "unknown shape $1" >&2; return 1 ;;
  esac
}

device_env() {
  export COLUMNS=160 PYTHONUNBUFFERED=1
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  export PYTHONPATH="$REPO/src:$SITE:/tmp/site"
  export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
  # FlashInfer is left out of the staged parts; the sampler imports it unless told not to
  export VLLM_USE_FLASHINFER_SAMPLER=0
  # DeepGEMM compiles ~1,155 FP8 GEMM shapes at start-up (~1 s each on the H200: the FP8 shape
  # never got ready in a session); skipped, they compile at first use, inside the warm-up requests
  export VLLM_DEEP_GEMM_WARMUP=skip
  PY=python3
}

case $cmd in
prepare)
  # here, before the session: vLLM's parts (pack.sh of the shared tools), split into chunks
  cd "$REPO"
  PACK=${PACK:-/tmp/vpack}
  [ -s "$PACK/d.tar" ] || bash "${VLLM_TOOLS:-$REPO/../shared/tools/vllm-h200}/pack.sh" "$PACK"
  rm -rf .vchunks && mkdir -p .vchunks
  tar -cf - -C "$PACK" a.tar b.tar c.tar d.tar | split -b ${CHUNK_MB}m -d - .vchunks/vllm.part-
  (cd .vchunks && sha256sum vllm.part-* > SHA256SUMS)
  cp "${VLLM_TOOLS:-$REPO/../shared/tools/vllm-h200}/stage.sh" .vchunks/
  cp "${VLLM_TOOLS:-$REPO/../shared/tools/vllm-h200}/dummy_model.py" .vchunks/
  [ -d .whl ] || bash experiments/gpu/gpu_wheels.sh
  ls -la .vchunks; du -sh .whl
  ;;
next)
  # here: move the next unsent chunk into .vparts (the one path a stage call carries)
  cd "$REPO"; mkdir -p .vparts .vchunks/sent
  rm -f .vparts/vllm.part-*
  n=$(ls .vchunks/vllm.part-* 2>/dev/null | head -1)
  [ -n "$n" ] || { echo "all chunks sent"; exit 0; }
  cp .vchunks/SHA256SUMS .vchunks/stage.sh .vchunks/dummy_model.py .vparts/
  mv "$n" .vparts/ && cp .vparts/"$(basename "$n")" .vchunks/sent/
  echo "next: $(basename "$n") ($(du -m .vparts | cut -f1) MiB in .vparts)"
  ;;
reset)
  cd "$REPO"; mv .vchunks/sent/vllm.part-* .vchunks/ 2>/dev/null; rm -f .vparts/vllm.part-*; ls .vchunks
  ;;
stage)
  # device: keep the carried chunk; once every chunk is here, unpack vLLM into $SITE
  mkdir -p /tmp/vchunks "$RUN"
  cp "$REPO"/.vparts/* /tmp/vchunks/ 2>/dev/null
  echo "$(date -u +%T) stage: have $(ls /tmp/vchunks/vllm.part-* | wc -l) of $(wc -l < /tmp/vchunks/SHA256SUMS)" | tee -a "$RUN/STAGES"
  if [ "$(ls /tmp/vchunks/vllm.part-* | wc -l)" = "$(wc -l < /tmp/vchunks/SHA256SUMS)" ] && [ ! -e "$SITE/.staged" ]; then
    (cd /tmp/vchunks && sha256sum -c --quiet SHA256SUMS) || exit 1
    mkdir -p /tmp/vparts && cat /tmp/vchunks/vllm.part-* | tar -xf - -C /tmp/vparts && rm -f /tmp/vchunks/vllm.part-*
    bash /tmp/vchunks/stage.sh "$SITE" /tmp/vparts/a.tar /tmp/vparts/b.tar /tmp/vparts/c.tar /tmp/vparts/d.tar \
      && touch "$SITE/.staged" && rm -rf /tmp/vparts
    echo "$(date -u +%T) staged: $(du -sh "$SITE" | cut -f1)" | tee -a "$RUN/STAGES"
  fi
  ;;
start)
  # device: the wheels ceiling needs, then the runner in its own session (outlives the call)
  device_env
  if [ -d "$REPO/.whl" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$REPO"/.whl/*.whl
  fi
  cp -r /tmp/vchunks/dummy_model.py "$RUN/" 2>/dev/null
  mkdir -p "$RUN"
  setsid nohup bash "$0" plan "$@" > "$RUN/runner.log" 2>&1 < /dev/null &
  sleep 45; tail -20 "$RUN/runner.log"; cat "$RUN/STAGES"
  ;;
collect)
  # device: wait (up to SECONDS, or until the runner ends), then pack what there is into $OUT
  secs=${1:-500}; t=0
  while [ $t -lt "$secs" ] && [ ! -e "$RUN/DONE" ]; do sleep 10; t=$((t + 10)); done
  cat "$RUN/STAGES"
  tail -30 "$RUN/runner.log"
  out=${OUT:-/tmp/vout}; mkdir -p "$out"
  # small files (logs, json, reports) in one archive; traces apart, each trimmed below 15 MB
  (cd "$RUN" && find . -type f ! -name '*.pt.trace.json*' ! -name '*.safetensors' -size -20M -print0 \
     | tar --null -czf "$out/vrun-small.tgz" -T -)
  (cd "$RUN" && find . -name '*.pt.trace.json.gz' -size -15M | head -6 | tar -cf "$out/vrun-traces.tar" -T -) 2>/dev/null
  cp "$RUN/STAGES" "$out/STAGES.txt"; cp "$RUN/runner.log" "$out/runner.log" 2>/dev/null
  nvidia-smi --query-gpu=name,memory.used,utilization.gpu --format=csv
  ls -la "$out"
  ;;
plan)
  # device, in the background: every shape in turn
  device_env
  cd "$REPO"
  stage() { echo "$(date -u +%T) $*" | tee -a "$RUN/STAGES"; }
  shapes=${*:-$SHAPES_ALL}
  stage "runner: shapes $shapes; $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader)"
  $PY -c "import torch, vllm; print('torch', torch.__version__, torch.version.cuda, 'vllm', vllm.__version__, torch.cuda.get_device_name())" 2>&1 | tail -3
  port=8000
  for shape in $shapes; do
    if [ "$shape" = variant ]; then  # the doctor launching the staged engine itself
      stage "doctor --variant: start"
      timeout 560 $PY -m ceiling doctor --variant experiments/gpu/variants/h200-vllm-llama8b.yaml --trace \
        --concurrency 1,8 --max-tokens 256 --repeat 2 --out-dir "$RUN/doctor-variant" > "$RUN/doctor-variant.txt" 2>&1
      stage "doctor --variant rc=$?"
      continue
    fi
    if [ "$shape" = sweep ]; then  # the known answers, one launch per variant
      stage "sweep: start"
      timeout 1700 $PY -m ceiling sweep experiments/gpu/plans/h200-vllm-known-answers.yaml \
        --out-dir "$RUN/sweep" > "$RUN/sweep.txt" 2>&1
      stage "sweep rc=$?"
      continue
    fi
    D=$RUN/$shape; mkdir -p "$D/model" "$D/trace"
    cfg=src/ceiling/data/models/$(model_json "$shape").json
    $PY /tmp/vchunks/dummy_model.py "$cfg" "$D/model" > "$D/model.log" 2>&1 || { stage "$shape: dummy model failed"; cat "$D/model.log"; continue; }
    stage "$shape: launch"
    # the profiler is on from the start (--profiler-config): the window is opened later by
    # /start_profile; max_iterations bounds it, CUDA graphs stay on as served
    setsid $PY -m vllm.entrypoints.cli.main serve "$D/model" --load-format dummy --served-model-name "$shape" \
      --port $port --max-model-len 4096 --gpu-memory-utilization 0.90 \
      --profiler-config "{\"profiler\":\"torch\",\"torch_profiler_dir\":\"$D/trace\",\"ignore_frontend\":true,\"max_iterations\":48}" \
      > "$D/server.log" 2>&1 < /dev/null &
    spid=$!
    echo $spid > "$D/server.pid"
    ok=0
    for i in $(seq 1 240); do
      if curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; then ok=1; break; fi
      kill -0 $spid 2>/dev/null || break
      sleep 2
    done
    if [ $ok = 0 ]; then stage "$shape: server not ready (see $shape/server.log)"; tail -40 "$D/server.log"; kill -- -$spid 2>/dev/null; continue; fi
    stage "$shape: ready after ~$((i * 2)) s"
    curl -s "http://127.0.0.1:$port/v1/models" > "$D/models.json"
    curl -s "http://127.0.0.1:$port/version" > "$D/version.json"
    timeout 300 $PY -m ceiling bench --url "http://127.0.0.1:$port" --mode concurrency --concurrency 1,8,32,64 \
      --input-len 128 --max-tokens 256 --requests 64 --quiet --out "$D/bench.json" > "$D/bench.txt" 2>&1
    stage "$shape: bench rc=$?"
    # a profiler window of steady decode at concurrency 8, armed before the streams begin
    curl -s -X POST "http://127.0.0.1:$port/start_profile" -H 'Content-Type: application/json' \
      -d '{"profile_prefix":"win","delay_iterations":16,"max_iterations":48}' > "$D/start_profile.txt" 2>&1
    timeout 120 $PY -m ceiling bench --url "http://127.0.0.1:$port" --mode concurrency --concurrency 8 \
      --input-len 128 --max-tokens 256 --requests 8 --quiet --out "$D/bench_window.json" > "$D/bench_window.txt" 2>&1
    curl -s -X POST "http://127.0.0.1:$port/stop_profile" > "$D/stop_profile.txt" 2>&1
    sleep 5
    stage "$shape: trace files: $(ls "$D/trace" | tr '\n' ' ')"
    curl -s "http://127.0.0.1:$port/metrics" > "$D/metrics.txt"
    for f in "$D"/trace/*.pt.trace.json.gz; do
      [ -e "$f" ] && timeout 120 $PY -m ceiling trace read "$f" --model "$cfg" --gpu h200 --out "$D/trace_read.json" \
        --profile-out "$D/profile.json" > "$D/trace_read.txt" 2>&1
    done
    stage "$shape: trace read rc=$?"
    timeout 420 $PY -m ceiling doctor --url "http://127.0.0.1:$port" --log "$D/server.log" --model "$cfg" \
      --trace --concurrency 1,8 --max-tokens 256 --repeat 2 --out-dir "$D/doctor-url" > "$D/doctor-url.txt" 2>&1
    stage "$shape: doctor --url rc=$?"
    kill -- -$spid 2>/dev/null; sleep 3; kill -9 -- -$spid 2>/dev/null
    for i in $(seq 1 30); do nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -q . || break; sleep 1; done
  done
  stage "runner: done"
  touch "$RUN/DONE"
  ;;
*)
  sed -n 2,17p "$0"
  ;;
esac
