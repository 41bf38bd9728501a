# Sourced by the GPU-host session scripts (bench/*session*.sh, env_gpu_check.sh, gpu_smoke.sh):
# the environment every one of them needs on the device machine. Sets PY; installs the wheels
# the image lacks (.whl/, from experiments/gpu/gpu_wheels.sh, carried with run(..., carry=[".whl"])) into
# /tmp/site; puts this checkout's src/ first on PYTHONPATH; NVLink multicast off in every process.
export COLUMNS=${COLUMNS:-160} PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PY=${PYTHON:-python3}
WHL_DIR=${WHL_DIR:-.whl}  # the llama.cpp calls carry theirs in .gpu/gpu/whl (llamacpp_cuda.sh prepare)
if [ -d "$WHL_DIR" ] && ls "$WHL_DIR"/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHL_DIR"/*.whl \
    && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
