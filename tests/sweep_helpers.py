"""A synthetic trial for sweep tests: no engine, deterministic rates per variant name.

The ledger, resume and early-stop logic are what these tests check, so the trial itself is a
generator that yields repeats with known rates (and can be slowed down to be killed mid-run).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

from ceiling.flows.sweep import Event, TrialSpec

# name -> per-repeat tok/s cycle: "same" is within noise of "base", "fast" clearly faster.
RATES = {
    "base": [100.0, 100.4, 99.6, 100.2, 99.8],
    "same": [99.9, 100.1, 100.0, 99.8, 100.2],
    "slow": [90.0, 90.5, 89.5, 90.2, 89.8],
    "fast": [120.0, 121.0, 119.0, 120.5, 119.5],
}


def synthetic_trial(spec: TrialSpec) -> Iterator[Event]:
    """Yield one repeat per planned index; log each call to $SWEEP_CALLS if set."""
    from ceiling.sweep.early_stop import decide

    delay = float(os.environ.get("SWEEP_DELAY_S", "0"))
    calls = os.environ.get("SWEEP_CALLS")
    yield {"type": "launched", "log_path": f"/logs/{spec.name}.log"}
    samples = list(spec.samples_done)
    for idx in range(spec.repeats_done, spec.repeats_total):
        time.sleep(delay)
        tok = RATES[spec.name][idx % len(RATES[spec.name])]
        if calls:
            with Path(calls).open("a") as fh:
                fh.write(f"{spec.name} {idx}\n")
        yield {
            "type": "repeat",
            "idx": idx,
            "tok_s": tok,
            "result": {"decode_tok_s_per_stream": tok},
        }
        samples.append(tok)
        if spec.baseline_samples is not None:
            d = decide(spec.baseline_samples, samples, spec.early_stop)
            if d.stop:
                yield {"type": "stopped_early", "reason": d.reason}
                return
    yield {"type": "done"}


def write_plan(tmp: Path, names: list[str], repeats: int = 5, min_repeats: int = 3) -> Path:
    """A plan whose variants are valid variant files (never launched by the synthetic trial)."""
    (tmp / "base.yaml").write_text("engine: vllm\nmodel: /nonexistent/model\n")
    lines = [
        "name: synthetic",
        f"repeats: {repeats}",
        "bench: {mode: single, max_tokens: 16}",
        f"early_stop: {{min_repeats: {min_repeats}, min_gain_pct: 1.0}}",
        "variants:",
    ]
    for i, n in enumerate(names):
        lines += [f"  - name: {n}", "    extends: base.yaml", f"    env: {{SYNTH_ID: '{i}'}}"]
    p = tmp / "plan.yaml"
    p.write_text("\n".join(lines) + "\n")
    return p
