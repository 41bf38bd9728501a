"""How long reading a 100 MB torch-profiler trace takes, per parser (issue 23: < 10 s on the
2-core box). Prints one line per parser; the shipped path is ``read_trace`` (orjson on the
whole decompressed file, then one pass in Python) + ``split``.

    PYTHONPATH=src python experiments/validation/trace_parse.py [--mb 100] [--trace FILE]

Each figure is the best of ``--repeat`` runs (wall clock). Measured on the 2-core dev box
(2026-12-02, other work running): decompress 0.2-0.5 s, orjson.loads 2.0-6.2 s, stdlib
json.loads 2.5-8.4 s, ijson (yajl2_c) items 1.7-2.2 s over bytes in memory; read_trace 3.9-5.0 s
and split 0.5 s for 152,576 GPU events. Peak memory, whole file in orjson: 756 MB; ijson
streamed from the gzip file: 22 MB, but 8-17 s with float numbers: orjson is kept for speed
(memory ~7x the JSON size, docs/trace.md says so).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests.trace_synth: the generator

from tests.trace_synth import big_trace

from ceiling.trace import read_trace, split


def _best(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=int, default=100, help="JSON size to generate (MiB)")
    ap.add_argument("--trace", help="time this trace instead of a generated one")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.trace) if args.trace else Path(tmp) / "big.json.gz"
        if not args.trace:
            t0 = time.perf_counter()
            big_trace(path, args.mb * 2**20)
            print(f"generated {path.stat().st_size / 2**20:.1f} MiB gzipped "
                  f"({args.mb} MiB JSON) in {time.perf_counter() - t0:.1f} s")  # fmt: skip
        raw = path.read_bytes()
        data = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
        print(f"decompress: {_best(lambda: gzip.decompress(raw), args.repeat):.2f} s "
              f"({len(data) / 2**20:.0f} MiB)")  # fmt: skip
        try:
            import orjson

            print(
                f"orjson.loads (whole file): {_best(lambda: orjson.loads(data), args.repeat):.2f} s"
            )
        except ImportError:
            print("orjson: not installed")
        print(f"json.loads (stdlib): {_best(lambda: json.loads(data), args.repeat):.2f} s")
        try:
            import ijson

            def stream() -> int:
                n = 0
                for _ in ijson.items(data, "traceEvents.item"):
                    n += 1
                return n

            print(f"ijson.items ({ijson.backend}, events only, no work): "
                  f"{_best(stream, args.repeat):.2f} s")  # fmt: skip
        except ImportError:
            print("ijson: not installed")
        holder = {}
        t_read = _best(lambda: holder.update(t=read_trace(path)), args.repeat)
        t_split = _best(lambda: split([holder["t"]], None), args.repeat)
        n = len(holder["t"].events)
        print(f"read_trace (shipped, incl. decompress): {t_read:.2f} s, {n} GPU events")
        print(f"split: {t_split:.2f} s; read + split: {t_read + t_split:.2f} s (goal < 10 s)")


if __name__ == "__main__":
    main()
