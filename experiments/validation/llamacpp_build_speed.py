"""Do two builds of llama-server serve at the same speed? (unity build vs file by file)

    python3 experiments/validation/llamacpp_build_speed.py \
        --server unity=.engines/llamacpp/bin/llama-server \
        --server file-by-file=/tmp/llb/build/bin/llama-server \
        --model /tmp/mid.gguf --json experiments/results/llamacpp_build_speed-DATE_MACHINE.json

scripts/install-llamacpp.sh compiles llama-server as a CMake unity build to save compile time
in CI; this checks that the binary it yields is no slower. Each server is started in turn on
the same GGUF (rounds alternate the order, so a drift of the box's load falls on both), given
one warm-up request and then `--requests` completions of `--tokens` tokens with ignore_eos; the
figures are llama-server's own `timings` (prompt and predicted tokens per second). A model
large enough that compute, not per-token overhead, dominates makes the check mean something:
the tiny test GGUF with its hidden size raised to 1024 and 8 layers (415 MB f32) was used.
Standard library only, so it runs with any python3.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import time
import urllib.request


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _post(url: str, body: dict[str, object], timeout: float) -> dict[str, object]:
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        out: dict[str, object] = json.load(r)
    return out


def one_launch(
    binary: str, model: str, threads: int, requests: int, tokens: int
) -> list[dict[str, float]]:
    port = _free_port()
    proc = subprocess.Popen(
        [binary, "-m", model, "-t", str(threads), "-c", "2048", "-np", "1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(
                        f"{binary} did not become healthy (exit code {proc.poll()})"
                    ) from None
                time.sleep(0.2)
        out = []
        for i in range(requests + 1):  # the first one warms up and is not kept
            r = _post(
                f"http://127.0.0.1:{port}/completion",
                {
                    "prompt": "the quick brown fox " * 40 + str(i),
                    "n_predict": tokens,
                    "ignore_eos": True,
                    "temperature": 0,
                    "cache_prompt": False,
                },
                timeout=600,
            )
            t = r["timings"]
            assert isinstance(t, dict)
            if i:
                out.append(
                    {
                        "decode_tok_s": float(t["predicted_per_second"]),
                        "prefill_tok_s": float(t["prompt_per_second"]),
                    }
                )
        return out
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--server",
        action="append",
        required=True,
        metavar="NAME=PATH",
        help="a llama-server binary to compare (give two or more)",
    )
    ap.add_argument("--model", required=True, help="GGUF file both serve")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--requests", type=int, default=2, help="kept requests per launch")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", help="write the figures to this file")
    a = ap.parse_args(argv)
    servers = dict(s.split("=", 1) for s in a.server)
    if len(servers) < 2:
        ap.error("give --server NAME=PATH at least twice")
    tries: dict[str, list[dict[str, float]]] = {k: [] for k in servers}
    for rnd in range(a.rounds):
        order = list(servers) if rnd % 2 == 0 else list(servers)[::-1]
        for name in order:
            print(f"round {rnd + 1}/{a.rounds}: {name}", file=sys.stderr)
            tries[name] += one_launch(servers[name], a.model, a.threads, a.requests, a.tokens)
    summary = {}
    for name, ts in tries.items():
        dec = [t["decode_tok_s"] for t in ts]
        pre = [t["prefill_tok_s"] for t in ts]
        summary[name] = {
            "decode_tok_s_median": statistics.median(dec),
            "decode_tok_s_min": min(dec),
            "decode_tok_s_max": max(dec),
            "prefill_tok_s_median": statistics.median(pre),
            "tries": ts,
        }
        print(
            f"{name:>14}: decode median {statistics.median(dec):7.2f} tok/s (range {min(dec):.2f}-"
            f"{max(dec):.2f}), prefill median {statistics.median(pre):7.1f} tok/s, {len(ts)} tries"
        )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(
                {
                    "model": a.model,
                    "threads": a.threads,
                    "tokens": a.tokens,
                    "servers": servers,
                    "results": summary,
                },
                f,
                indent=2,
            )
            f.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
