#!/usr/bin/env bash
# Stand-in for llama-bench, test-backend-ops and llama-server (called by those names through
# links) for the CPU dry run of experiments/gpu/llamacpp_heldout.sh: the same arguments, output of the
# same shape (llama-bench JSON, test-backend-ops SQL), invented timings. Never a measurement.
set -u
case "$(basename "$0")" in
llama-server) echo "version: 0 (fake)" ;;
llama-bench)
  if [ "${1:-}" = "--list-devices" ]; then
    printf 'Available devices:\n  CUDA0: FAKE GPU (1000 MiB, 1000 MiB free)\n'
    exit 0
  fi
  m=""
  while [ $# -gt 0 ]; do [ "$1" = "-m" ] && m=$2; shift; done
  [ -s "$m" ] || { echo "fake llama-bench: no model $m" >&2; exit 1; }
  sz=$(stat -c %s "$m")
  python3 - "$m" "$sz" <<'EOF'
import json, sys
ns = 128 * (2e5 + int(sys.argv[2]) / 2.0)  # invented: 0.2 ms + bytes / 2 GB/s per token
print(json.dumps([{"build_commit": "fake", "gpu_info": "FAKE GPU", "model_filename": sys.argv[1],
    "model_size": int(sys.argv[2]), "n_gpu_layers": 99, "flash_attn": 1, "n_prompt": 0,
    "n_gen": 128, "n_depth": 0, "avg_ns": ns, "stddev_ns": 0, "avg_ts": 128e9 / ns,
    "samples_ns": [ns] * 3, "samples_ts": [128e9 / ns] * 3}], indent=2))
EOF
  ;;
test-backend-ops)
  f=""
  while [ $# -gt 0 ]; do [ "$1" = "--test-file" ] && f=$2; shift; done
  [ -s "$f" ] || { echo "fake test-backend-ops: no test file" >&2; exit 1; }
  python3 - "$f" <<'EOF'
import sys
TYPES = {"0": "f32", "1": "f16", "8": "q8_0", "12": "q4_K", "13": "q5_K", "14": "q6_K",
         "23": "iq4_xs", "26": "i32"}
print("CREATE TABLE IF NOT EXISTS test_backend_ops (\n  test_time TEXT\n);\n")
cols = ("test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, "
        "passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, "
        "device_description, backend_reg_name")
for line in open(sys.argv[1]):
    f = line.split()
    op, nsrc = {"29": "MUL_MAT", "30": "MUL_MAT_ID"}[f[0]], int(f[23])
    srcs, i = [], 24
    for _ in range(nsrc):
        srcs.append(f"{TYPES[f[i]]}[{','.join(f[i + 1:i + 5])}]")
        i += 9
    params = (f"name={f[-1]},type=f32,ne=[{','.join(f[2:6])}],op_params=[],"
              f"sources={','.join(srcs)}")
    t = 2.0 + int(f[31]) / 2e6  # invented
    print(f"INSERT INTO test_backend_ops ({cols}) VALUES ('2026-01-01T00:00:00Z', 'fake', "
          f"'CUDA0', '{op}', '{params}', 'perf', '1', '1', '', '{t:.6f}', '0', '0', '0', "
          f"'1000', 'FAKE GPU', 'CUDA');")
EOF
  ;;
*) echo "fake_llamacpp.sh: called as $(basename "$0")" >&2; exit 2 ;;
esac
