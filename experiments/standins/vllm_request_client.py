"""`vllm bench serve`'s client loop without the rest of vLLM: for machines where vLLM cannot be
installed (the GPU hosts here have no network), to measure its chunk ingest rate there.

It imports vLLM's own request function (``vllm/benchmarks/lib/endpoint_request_func.py``, taken
unchanged from an installed vLLM by ``bash experiments/gpu/gpu_wheels.sh --vllm-client``: it needs only
aiohttp, regex and tqdm) and drives it the way ``vllm bench serve`` does
(``vllm/benchmarks/serve.py`` ``benchmark``: a TCPConnector limited to the concurrency, one
warm-up request, then every request under an ``asyncio.Semaphore(max_concurrency)``, plain
``asyncio.run``). Prints one JSON object with the keys ``client_vs_vllm.run_vllm`` returns, so
``ingest_rate.py`` scores it like the real command. What it leaves out (dataset sampling,
tokenizer, result bookkeeping) happens before or after the timed streams.

    python3 experiments/standins/vllm_request_client.py --lib .whl/vllm_lib --url URL --n 1024 --tokens 100
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from typing import Any


async def _run(erf: Any, url: str, n: int, tokens: int) -> dict[str, Any]:
    import aiohttp

    connector = aiohttp.TCPConnector(
        limit=n,
        limit_per_host=n,
        ttl_dns_cache=300,
        use_dns_cache=True,
        keepalive_timeout=60,
        enable_cleanup_closed=True,
        force_close=False,
    )
    session = aiohttp.ClientSession(
        connector=connector, trust_env=True, timeout=aiohttp.ClientTimeout(total=6 * 60 * 60)
    )

    def req(i: int) -> Any:
        return erf.RequestFuncInput(
            prompt=f"p{i} a b c d e f",
            api_url=url.rstrip("/") + "/v1/completions",
            prompt_len=8,
            output_len=tokens,
            model="synthetic",
            ignore_eos=True,
        )

    fn = erf.async_request_openai_completions
    try:
        warm = await fn(request_func_input=req(0), session=session)
        if not warm.success:
            return {"error": f"warm-up request failed: {warm.error[:300]}"}
        sem = asyncio.Semaphore(n)

        async def limited(i: int) -> Any:
            async with sem:
                return await fn(request_func_input=req(i), session=session)

        t0 = time.monotonic()
        outs = await asyncio.gather(*(limited(i) for i in range(n)))
        wall = time.monotonic() - t0
    finally:
        await session.close()
    ok = [o for o in outs if o.success]
    # vLLM's TPOT: (latency - ttft) / (output tokens - 1), per request, then the mean
    tpots = [(o.latency - o.ttft) / (o.output_tokens - 1) * 1000 for o in ok if o.output_tokens > 1]
    gaps = [g * 1000 for o in ok for g in o.itl]
    return {
        "completed": len(ok),
        "failed": len(outs) - len(ok),
        "mean_tpot_ms": statistics.fmean(tpots) if tpots else None,
        "median_tpot_ms": statistics.median(tpots) if tpots else None,
        "mean_ttft_ms": statistics.fmean(o.ttft * 1000 for o in ok) if ok else None,
        "itls_ms": [[g * 1000 for g in o.itl] for o in ok],
        "close_gap_n": len(gaps),
        "wall_s": wall,
        "warmups": 1,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--lib", required=True, help="folder holding endpoint_request_func.py")
    ap.add_argument("--url", required=True)
    ap.add_argument("--n", type=int, required=True, help="requests = concurrency")
    ap.add_argument("--tokens", type=int, default=100)
    args = ap.parse_args()
    sys.path.insert(0, args.lib)
    import endpoint_request_func as erf  # vLLM's file, unchanged (see the module docstring)

    print(json.dumps(asyncio.run(_run(erf, args.url, args.n, args.tokens))))


if __name__ == "__main__":
    main()
