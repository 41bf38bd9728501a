"""Print, as shell `export` lines, pip's own package-source settings in the variables uv reads.

uv reads neither pip.conf nor PIP_* variables, so on a machine whose pip is configured (local
wheel folders, mirrors, a constraints file capping a big package) a plain `uv pip install`
would fetch something else than pip would. The settings come from `pip config list`, which
merges every configuration file and PIP_* variable as pip itself would; variables uv already
has (UV_*) are left alone. pip treats all indexes as equal, hence uv's unsafe-best-match.
Written by hand: neither pip nor uv ships this translation.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

# pip's key -> (uv's variable, the separator uv expects between values)
UV_VARIABLES = {
    "index-url": ("UV_INDEX_URL", " "),
    "extra-index-url": ("UV_EXTRA_INDEX_URL", " "),
    "find-links": ("UV_FIND_LINKS", ","),
    "constraint": ("UV_CONSTRAINT", " "),
}


def pip_settings(text: str) -> dict[str, list[str]]:
    """``key -> values`` from `pip config list` lines such as ``global.find-links='/opt/w'``
    (``:env:.find-links`` for a PIP_* variable); later lines override earlier ones, as pip
    lists them from the least to the most specific scope."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        m = re.match(r"^[^=]*?\.([a-z-]+)=(.*)$", line.strip())
        if m and m.group(1) in UV_VARIABLES:
            value = m.group(2).strip()
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
            out[m.group(1)] = value.split()
    return out


def exports(settings: dict[str, list[str]], env: dict[str, str]) -> list[str]:
    lines = []
    for key, values in settings.items():
        var, sep = UV_VARIABLES[key]
        if values and var not in env:
            lines.append(f"export {var}={shlex.quote(sep.join(values))}")
    extra = settings.get("extra-index-url") or settings.get("find-links")
    if extra and "UV_INDEX_STRATEGY" not in env:
        lines.append("export UV_INDEX_STRATEGY=unsafe-best-match")
    return lines


def main() -> int:
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"],
        capture_output=True,
        text=True,
        check=False,
    )
    print("\n".join(exports(pip_settings(proc.stdout), dict(os.environ))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
