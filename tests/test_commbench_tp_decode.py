"""bench/gpu/tp_decode.py (issue 7's TP decode step) runs end to end with gloo at TP=2 on the CPU,
dense and MoE, and its ranks agree on the hidden state after the allreduces."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
SCRIPT = Path(__file__).parents[1] / "bench" / "gpu" / "tp_decode.py"


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


def _tp_decode(*extra: str) -> list[str]:
    return [
        sys.executable,
        str(SCRIPT),
        "--tiny",
        "--model",
        "dense",
        "--backend",
        "gloo",
        "--iters",
        "3",
        *extra,
    ]


def test_a_hung_rank_leaves_its_configuration_stage_and_stack_and_earlier_rows(tmp_path):
    out = tmp_path / "r.json"
    cmd = _tp_decode("--tp", "1,2", "--timeout", "10", "--debug-hang", "1:eager timing")
    proc = subprocess.run([*cmd, "--out", str(out)], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    ok, hung = doc["rows"]
    assert ok["tp"] == 1 and ok["eager_ms"] > 0 and "error" not in ok  # measured before: kept
    assert hung["tp"] == 2 and "timed out" in hung["error"]
    r0, r1 = hung["ranks"]["ranks"]
    assert r1["stage"] == "eager timing" and r1["stopped"]
    assert r0["stage"] == "eager timing" and any("all_reduce" in ln for ln in r0["last_words"])
    assert doc["running"] is None
    assert "rank1 last words" in proc.stdout


def test_numbers_measured_before_a_teardown_hang_are_kept(tmp_path):
    out = tmp_path / "r.json"
    cmd = _tp_decode("--tp", "2", "--timeout", "10", "--debug-hang", "1:destroy_process_group")
    subprocess.run([*cmd, "--out", str(out)], capture_output=True, text=True, timeout=180)
    (row,) = json.loads(out.read_text())["rows"]
    assert row["eager_ms"] > 0 and "error" not in row
    assert "destroy_process_group" in row["teardown_error"]


def test_sigterm_keeps_the_record_and_leaves_no_rank_running(tmp_path):
    import signal
    import time

    out = tmp_path / "r.json"
    cmd = _tp_decode("--tp", "2", "--timeout", "300", "--debug-hang", "1:eager timing")
    proc = subprocess.Popen([*cmd, "--out", str(out)], stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # wait until the ranks sit in the hang
        if out.is_file() and json.loads(out.read_text()).get("running"):
            time.sleep(8)
            break
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(timeout=30)
    assert rc == 130
    (row,) = json.loads(out.read_text())["rows"]
    assert row["error"].startswith("ranks failed (interrupted")
    # each rank's stage and last words are on record (on a loaded machine it may not have
    # reached the injected hang yet: where it stood is what matters)
    assert all(r["stage"] and r["last_words"] for r in row["ranks"]["ranks"])
    left = subprocess.run(["pgrep", "-f", f"{SCRIPT} --worker"], capture_output=True, text=True)
    assert left.stdout.strip() == ""
