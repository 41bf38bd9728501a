#!/usr/bin/env bash
# The GPU paths of the CLI, as a user runs them, on a GPU host (one device-tool call, ~3 min):
# after a refactor that moved their printing into ceiling.render and their imports to the top of
# modules, each command must still run on real GPUs and NVML and write what it says.
#     bash experiments/gpu/gpu_wheels.sh   # once: the wheels the GPU image lacks, into .whl/
#     run(kind="nvidia-h200-x2", carry=[".whl"], command="bash experiments/gpu/gpu_smoke.sh")
# Prints one line per command (rc, seconds) and a summary; files under $OUT (smoke.tgz, smoke.log).
set -u
OUT=${OUT:-experiments/results/gpu_smoke}
W=/tmp/smoke
mkdir -p "$OUT" "$W"
. "$(dirname "$0")/gpu_env.sh"  # PY, wheels, PYTHONPATH, NVLS off
C="$PY -m ceiling"
fails=0
check() {  # check NAME LIMIT_S CMD...: run, record rc and time, keep stdout+stderr
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s%N)
  timeout "$limit" "$@" > "$W/$name.out" 2> "$W/$name.err"
  local rc=$? ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  [ $rc -eq 0 ] || fails=$((fails + 1))
  printf '%-16s rc=%-3s %7s ms  %s\n' "$name" "$rc" "$ms" "$(tail -c 300 "$W/$name.err" | tr '\n' ' ' | cut -c1-150)"
}
{
  nvidia-smi -L
  check help 30 $C --help
  check probe 60 $C probe --json --out "$W/probe.json"
  check telemetry 30 $C telemetry --duration 3 --interval-ms 100 --json --out "$W/telemetry.json"
  check calibrate 150 $C calibrate --dtype bf16 --out "$W/profile.json" --results "$W/calibrate.json"
  check commbench 150 $C commbench --world-sizes 2 --sizes 8K,16K,1M --variant default --reps 3 \
    --model llama-3.1-70b --merge "$W/profile.json" --out "$W/profile.json" --results "$W/commbench.json"
  check predict_profile 60 $C predict --model llama-3.1-70b --gpu h200 --gpus 2 --tp 2 --link nvlink4 \
    --profile "$W/profile.json" --json
  check env 120 $C env --tp 2 --json
  check shm 30 $C shm --json
  $PY - "$W" <<'PY'
import json, sys, pathlib
w = pathlib.Path(sys.argv[1])
def load(n):
    try:
        return json.loads((w / n).read_text())
    except Exception as e:
        return {"error": str(e)}
p = load("predict_profile.out")
print("predict with the fresh profile:", p.get("decode_ms_per_token"), "ms/token;",
      "expected", (p.get("expected") or {}).get("decode_tok_s_per_stream"), "tok/s")
t = load("telemetry.json")
print("telemetry samples:", len(t.get("series", t.get("samples", [])) or []), "keys", list(t)[:6])
pr = load("probe.json")
print("probe gpus:", [g.get("name") for g in pr.get("gpus", [])], "links:", pr.get("link") or pr.get("links"))
PY
  echo "failed commands: $fails"
} 2>&1 | tee "$W/smoke.log"
tar czf "$OUT/smoke.tgz" -C "$W" . && cp "$W/smoke.log" "$OUT/"
