"""The test sessions of scripts/test.sh: the tests outside tests/engine/ run while llama.cpp may
still be compiling on a new machine, so none of them may use its environment (a test that needs
llama.cpp lives in tests/engine/ and uses the llamacpp fixtures, which mark it ``llamacpp``)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def test_no_test_outside_tests_engine_uses_the_llamacpp_environment():
    uses = re.compile(r"""\.engines[/\\"' ,]+llamacpp""")
    offenders = [
        p.name
        for p in sorted(TESTS.glob("*.py"))
        if p.name != Path(__file__).name and uses.search(p.read_text(encoding="utf-8"))
    ]
    assert not offenders, f"these run before llama.cpp is built: {offenders}"


def test_the_tests_that_need_llamacpp_are_marked_llamacpp():
    """`pytest -m llamacpp` (what a change to the llama.cpp adapter needs to rerun) selects the
    llama.cpp engine tests, and no vLLM test."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider",
         "-m", "engine and llamacpp", str(TESTS / "engine")],
        capture_output=True, text=True, check=False, cwd=TESTS.parent,
    )  # fmt: skip
    ids = [ln for ln in proc.stdout.splitlines() if "::" in ln]
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert any("test_engines_llamacpp.py" in i for i in ids), ids
    assert any("test_doctor_llamacpp.py" in i for i in ids), ids
    assert not any("vllm" in i.split("::")[0] for i in ids), ids
