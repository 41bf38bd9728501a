"""`ceiling predict` CLI: the JSON contract other tools rely on, catalogs, and clean errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ceiling.cli import main

FOUNDING = [
    "predict", "--model", "kimi-k2.5", "--gpu", "rtx-pro-6000", "--gpus", "8",
    "--link", "pcie5-switch", "--tp", "8", "--engine", "vllm",
]  # fmt: skip


def _json(capsys, argv):
    rc = main(argv)
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    return json.loads(cap.out)


def test_json_contract(capsys):
    d = _json(capsys, [*FOUNDING, "--what-if", "--json"])
    assert d["schema_version"] == 1
    for key in ("decode_ms_per_token", "decode_tok_s_per_stream", "components_ms",
                "fits_in_memory", "assumptions", "what_if", "batch_curve", "prefill"):  # fmt: skip
        assert key in d, key
    assert set(d["components_ms"]) >= {"weights", "kv", "collectives", "launch", "host"}
    assert d["decode_tok_s_per_stream"] == pytest.approx(1000 / d["decode_ms_per_token"], rel=1e-3)
    assert d["what_if"] and all(
        {"change", "decode_tok_s_per_stream", "delta_pct"} <= set(w) for w in d["what_if"]
    )
    assert isinstance(d["assumptions"], list) and d["assumptions"]


def test_options_change_the_prediction(capsys):
    base = _json(capsys, [*FOUNDING, "--json"])
    eager = _json(capsys, [*FOUNDING, "--no-cuda-graphs", "--json"])
    oneshot = _json(capsys, [*FOUNDING, "--allreduce", "oneshot", "--json"])
    fp8kv = _json(capsys, [*FOUNDING, "--kv-dtype", "fp8", "--context", "65536", "--json"])
    long = _json(capsys, [*FOUNDING, "--context", "65536", "--json"])
    assert eager["decode_ms_per_token"] > base["decode_ms_per_token"]
    assert oneshot["components_ms"]["collectives"] < base["components_ms"]["collectives"]
    assert fp8kv["components_ms"]["kv"] == pytest.approx(long["components_ms"]["kv"] / 2, rel=1e-3)
    assert "what_if" in base and base["what_if"] == []


def test_catalog_lists(capsys):
    d = _json(capsys, ["predict", "--list-gpus", "--list-links", "--list-models", "--json"])
    assert "rtx-pro-6000" in {g["name"] for g in d["gpus"]}
    assert "pcie5-switch" in {lk["name"] for lk in d["links"]}
    assert "kimi-k2.5" in {m["name"] for m in d["models"]}


def test_human_output_has_tables(capsys):
    assert main([*FOUNDING, "--what-if"]) == 0
    out = capsys.readouterr().out
    assert "decode step breakdown" in out and "what if" in out and "collectives" in out


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["predict", "--model", "nope-1b", "--gpu", "h200"], "unknown model"),
        (["predict", "--model", "llama-3.1-8b", "--gpu", "tpu"], "unknown GPU"),
        (
            ["predict", "--model", "llama-3.1-8b", "--gpu", "h200", "--tp", "2", "--link", "x"],
            "unknown link",
        ),
        (["predict", "--model", "kimi-k2.5", "--gpu", "rtx-pro-6000", "--tp", "2"], "does not fit"),
        (["predict", "--gpu", "h200"], "--model"),
    ],
)
def test_errors_are_one_line_with_fix(capsys, argv, needle):
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("error:") and needle in err and "fix:" in err
    assert "Traceback" not in err


def test_an_unknown_engine_is_refused_naming_the_choices(capsys):
    """--engine is a choice (docs/cli.md): Click refuses a value outside it, with the list."""
    assert main(["predict", "--model", "llama-3.1-8b", "--gpu", "h200", "--engine", "foo"]) == 2
    err = capsys.readouterr().err
    assert "Invalid value for '--engine'" in err and "'trtllm'" in err and "Traceback" not in err


def test_subprocess_no_traceback():
    proc = subprocess.run(
        [sys.executable, "-m", "ceiling", "predict", "--model", "x", "--gpu", "h200"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
