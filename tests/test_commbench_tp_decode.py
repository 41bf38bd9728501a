"""bench/tp_decode.py (issue 7's TP decode step) runs end to end with gloo at TP=2 on the CPU,
dense and MoE, and its ranks agree on the hidden state after the allreduces."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
SCRIPT = Path(__file__).parents[1] / "bench" / "tp_decode.py"


@pytest.mark.parametrize("model", ["dense", "moe"])
def test_tiny_tp2_on_gloo(tmp_path, model):
    out = tmp_path / "r.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--tiny",
            "--model",
            model,
            "--tp",
            "2",
            "--backend",
            "gloo",
            "--variant",
            "default",
            "--iters",
            "3",
            "--timeout",
            "120",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (row,) = json.loads(out.read_text())["rows"]
    assert row["tp"] == 2 and row["backend"] == "gloo"
    assert row["finite"] and row["ranks_consistent"]
    assert row["eager_ms"] > 0 and row["graph_ms"] is None
    assert row["allreduces_per_step"] == 2 * row["layers"] + 1
    assert (row["moe_impl"] is not None) == (model == "moe")
