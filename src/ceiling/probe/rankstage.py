"""What a rank process says about itself, so that a hung or failed rank leaves a record.

Imported by the rank workers (``commbench_worker``, ``experiments/gpu/tp_decode.py``); standard library
only, since a worker must start fast and may run under another interpreter than ceiling's.

- :func:`stage` prints ``CEILING_STAGE <name>`` to stderr (the rank's log) before each step that
  can block (process-group init, the first collective, graph capture, replay, the final barrier).
  :mod:`ceiling.probe.ranks` reads the last one back: "rank 1 was in 'graph capture'".
- :func:`arm` makes the process dump every thread's Python stack to stderr on ``SIGUSR1``
  (sent by the parent just before it kills a rank that ran out of time) and on a fatal signal.
  ``faulthandler`` writes from the signal handler itself, so the dump arrives even while the
  main thread sits inside a CUDA or NCCL call holding the GIL.
"""

from __future__ import annotations

import faulthandler
import signal
import sys
import time

PREFIX = "CEILING_STAGE "
DUMP_SIGNAL = signal.SIGUSR1
_T0 = time.monotonic()


def arm() -> None:
    faulthandler.enable(file=sys.stderr, all_threads=True)
    faulthandler.register(DUMP_SIGNAL, file=sys.stderr, all_threads=True, chain=False)


def stage(name: str) -> None:
    """Mark the start of a step; the name is what a report shows for a rank that stops here."""
    print(f"{PREFIX}{name} t={time.monotonic() - _T0:.1f}s", file=sys.stderr, flush=True)
