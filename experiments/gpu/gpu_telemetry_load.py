"""Run the NVML telemetry sampler over known GPU loads and check that it sees them.

Phases (each a window of the same series): idle; host->device copies from pinned memory (PCIe
RX at a rate this script also measures itself, so the NVML counter can be checked against it);
a decode-like loop of GEMVs over 4 GB of bf16 weights (HBM busy, PCIe idle: the
"latency-bound, not bandwidth-bound" case). Writes the series and per-phase summaries.

    python experiments/gpu/gpu_telemetry_load.py --out telemetry.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--phase-s", type=float, default=3.0)
    ap.add_argument("--interval-ms", type=float, default=20.0)
    args = ap.parse_args()

    import torch

    from ceiling.probe.telemetry import TelemetrySampler

    if not torch.cuda.is_available():
        print("no CUDA GPU: nothing to load", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    host = torch.empty(2**30, dtype=torch.uint8).pin_memory()
    dbuf = torch.empty(2**30, dtype=torch.uint8, device=dev)
    weights = [torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev) for _ in range(32)]
    x = torch.randn(1, 8192, dtype=torch.bfloat16, device=dev)
    torch.cuda.synchronize()
    phases: dict[str, tuple[float, float]] = {}
    facts: dict[str, float] = {}
    sampler = TelemetrySampler(args.interval_ms / 1000).start()
    t0 = time.time()
    time.sleep(args.phase_s)
    phases["idle"] = (t0, time.time())

    t0, n = time.time(), 0
    while time.time() - t0 < args.phase_s:
        dbuf.copy_(host, non_blocking=True)
        n += 1
        if n % 8 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    phases["h2d_copy"] = (t0, time.time())
    facts["h2d_GBps_measured_by_script"] = n * 2**30 / (phases["h2d_copy"][1] - t0) / 1e9

    t0, n = time.time(), 0
    while time.time() - t0 < args.phase_s:
        for w in weights:
            torch.nn.functional.linear(x, w)
        n += 1
        if n % 4 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    phases["decode_like_gemv"] = (t0, time.time())
    facts["gemv_GBps_measured_by_script"] = (
        n * sum(w.numel() * 2 for w in weights) / (phases["decode_like_gemv"][1] - t0) / 1e9
    )
    series = sampler.stop()
    # trim the phase edges by one interval so that windows do not bleed into each other
    pad = args.interval_ms / 1000
    summaries = {
        name: series.summary(a + pad, b - pad, label=name.replace("_", " "))
        for name, (a, b) in phases.items()
    }
    for name, s in summaries.items():
        print(f"{name}: {s['verdict']}")
        for g in s["gpus"]:
            print(
                f"  GPU{g['index']}: tx {g['pcie_tx_GBps_mean']} rx {g['pcie_rx_GBps_mean']} GB/s, "
                f"SM {g['sm_util_pct_mean']} %, mem {g['mem_util_pct_mean']} %, "
                f"SM clock {g['sm_clock_MHz_mean']} MHz, power {g['power_W_mean']} W"
            )
    print(json.dumps(facts))
    args.out.write_text(
        json.dumps(
            {
                "facts": facts,
                "phases": phases,
                "summaries": summaries,
                "series": series.model_dump(),
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
