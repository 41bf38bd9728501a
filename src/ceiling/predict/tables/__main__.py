"""``python -m ceiling.predict.tables [system ...]``: build the JSON cache of the tables."""

from __future__ import annotations

import sys

from ceiling.predict.tables.core import FAMILIES, info
from ceiling.predict.tables.store import _system_dir, system_fits


def main() -> int:
    ti = info()
    if ti is None:
        print(
            "aiconfigurator-core is not installed: pip install 'ceiling[tables]'", file=sys.stderr
        )
        return 2
    for s in sys.argv[1:] or ti.systems:
        d = system_fits(s)
        n = sum(len(d.family(f)) for f in FAMILIES) if d else 0
        print(f"{s}: {n} kernel fits, cache {_system_dir(s)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
