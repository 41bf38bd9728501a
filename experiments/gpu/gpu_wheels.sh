#!/usr/bin/env bash
# Download the Python wheels the GPU machine's image lacks for ceiling (pydantic & co.; its
# python is 3.12 with torch, numpy, pyyaml, rich, aiohttp already there; scipy and matplotlib are
# imported lazily by bench statistics and report plots only) into .whl/ (git-ignored).
# The session scripts install them to /tmp/site when .whl/ is carried: run(..., carry=[".whl"]).
set -euo pipefail
cd "$(dirname "$0")/../.."
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
  typing_extensions==4.16.0 typer==0.29.2 pyelftools==0.33 psutil==7.2.2 prometheus_client==0.26.0 \
  markdown-it-py==4.3.0 mdurl==0.1.2
# --vllm-client: also vLLM's request function (unchanged, from .engines/vllm) and its two
# imports, for experiments/validation/ingest_rate.py --vllm-lib .whl/vllm_lib on a host without vLLM
if [ "${1:-}" = "--vllm-client" ]; then
  mkdir -p .whl/vllm_lib
  cp .engines/vllm/lib/python3*/site-packages/vllm/benchmarks/lib/endpoint_request_func.py .whl/vllm_lib/
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl regex tqdm
fi
ls .whl
