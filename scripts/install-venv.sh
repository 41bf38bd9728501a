#!/usr/bin/env bash
# Create a virtual environment (default .venv) and install ceiling into it, editable, with the
# extras given (default none): scripts/install-venv.sh .venv '.[dev,torch,tables]'
# uv installs it when uv can be had (a few seconds from uv's cache, which later clones on the
# machine share; pip took 75-110 s for the same set on the 2-core box), pip otherwise or when uv
# fails. uv is told pip's own package sources (scripts/pip_settings_for_uv.py), so both install
# from the same places. CEILING_INSTALLER=pip skips uv.
set -euo pipefail
VENV=${1:-.venv}
SPEC=${2:-.}
PY=${PYTHON:-python3}
PIPQ=(-q --disable-pip-version-check)
# pip names every local index folder that lacks a package: noise, not a problem
quiet() { grep -v "^WARNING: Location" || true; }
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
if [ "${CEILING_INSTALLER:-uv}" = uv ]; then
  if [ -x "$VENV/bin/uv" ] || "$VENV/bin/pip" install "${PIPQ[@]}" uv 2>&1 | quiet; then
    if (eval "$("$VENV/bin/python" "$(dirname "$0")/pip_settings_for_uv.py")" &&
        "$VENV/bin/uv" pip install --quiet --python "$VENV/bin/python" -e "$SPEC"); then
      exit 0
    fi
  fi
  echo "uv could not install $SPEC: pip does (CEILING_INSTALLER=pip skips uv)" >&2
fi
"$VENV/bin/pip" install "${PIPQ[@]}" -e "$SPEC" 2>&1 | quiet
