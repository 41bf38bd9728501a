"""scripts/pip_settings_for_uv.py: uv is told pip's own package sources, so that the venv uv
installs comes from where pip's would (a local wheel of torch, not a multi-GB CUDA build)."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

from script_module import load_script

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "pip_settings_for_uv.py"
mod = load_script(SCRIPT)

LISTED = """\
:env:.default-timeout='180'
:env:.find-links='/opt/wheels'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/opt/wheels /srv/more-wheels'
global.cert='/etc/ssl/certs/ca-certificates.crt'
"""


def test_pip_sources_become_uvs_variables_and_the_rest_is_left():
    settings = mod.pip_settings(LISTED)
    # the later (more specific) line wins, values split on whitespace as pip splits them
    assert settings == {
        "find-links": ["/opt/wheels", "/srv/more-wheels"],
        "constraint": ["/etc/xdg/pip/constraints.txt"],
        "extra-index-url": ["file:///opt/pypi/simple", "file:///opt/pypi-more/simple"],
    }
    lines = mod.exports(settings, {})
    env = dict(shlex.split(ln.removeprefix("export "))[0].split("=", 1) for ln in lines)
    assert env == {
        "UV_FIND_LINKS": "/opt/wheels,/srv/more-wheels",  # uv: comma-separated
        "UV_CONSTRAINT": "/etc/xdg/pip/constraints.txt",
        "UV_EXTRA_INDEX_URL": "file:///opt/pypi/simple file:///opt/pypi-more/simple",
        "UV_INDEX_STRATEGY": "unsafe-best-match",  # pip treats every index alike
    }


def test_what_the_user_set_for_uv_wins_and_no_settings_say_nothing():
    settings = mod.pip_settings(LISTED)
    lines = mod.exports(settings, {"UV_FIND_LINKS": "/mine", "UV_INDEX_STRATEGY": "first-index"})
    assert not any("UV_FIND_LINKS" in ln or "UV_INDEX_STRATEGY" in ln for ln in lines)
    assert mod.exports(mod.pip_settings(""), {}) == []


def test_the_script_reads_this_pip_and_prints_shell_a_shell_can_eval():
    proc = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, check=True)
    for line in proc.stdout.splitlines():
        assert line.startswith("export UV_"), line
        subprocess.run(["bash", "-n", "-c", line], check=True)
