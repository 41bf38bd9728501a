"""The doctor truth tests rerun only on BoxTooNoisy, never on a library or test assertion.

Each case runs a small test module in a pytest of its own (pytester) with the marker the truth
modules use, and reads how often its test ran."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from box_noise import RERUN_WHEN_SWAMPED, BoxTooNoisy, CpuTimes, RunQueueWait
from script_module import load_script

pytest_plugins = ["pytester"]

TESTS = Path(__file__).resolve().parent

MODULE = """
from pathlib import Path
import sys
sys.path.insert(0, {tests!r})
from box_noise import RERUN_WHEN_SWAMPED, BoxTooNoisy, swamped_if

pytestmark = [RERUN_WHEN_SWAMPED]
RUNS = Path({runs!r})

def test_it():
    with RUNS.open("a") as f:
        f.write("run\\n")
    first = len(RUNS.read_text().splitlines()) == 1
    if first:
        {raise_first}
"""


def run_once_failing(pytester: pytest.Pytester, raise_first: str) -> tuple[int, int, int]:
    """(runs, passed, reruns) of a test that raises ``raise_first`` on its first run only."""
    runs = pytester.path / "runs.txt"
    pytester.makepyfile(
        test_mod=MODULE.format(tests=str(TESTS), runs=str(runs), raise_first=raise_first)
    )
    result = pytester.runpytest_subprocess("-q")
    outcomes = result.parseoutcomes()
    return len(runs.read_text().splitlines()), outcomes.get("passed", 0), outcomes.get("rerun", 0)


def test_box_too_noisy_is_rerun(pytester):
    assert run_once_failing(pytester, "swamped_if(True, 'the box was busy')") == (2, 1, 1)


@pytest.mark.parametrize(
    "raise_first",
    [
        "assert False, 'the library said so'",
        "raise AssertionError('BoxTooNoisy: a message that names it is still an assertion')",
        "raise KeyError('a missing key')",
        "import json; json.loads('{{')",  # any other exception from the library
    ],
)
def test_any_other_failure_is_not_rerun(pytester, raise_first):
    assert run_once_failing(pytester, raise_first) == (1, 0, 0)


def test_the_truth_modules_rerun_only_on_box_too_noisy():
    """Every module that reruns anything (real-engine truth tests, the bench's timing test)
    reruns BoxTooNoisy only."""
    seen = 0
    paths = [*sorted(TESTS.glob("test_*.py")), *sorted((TESTS / "engine").glob("test_*.py"))]
    for path in paths:
        text = path.read_text()
        if path.name == Path(__file__).name:
            continue  # this module names the markers without using them
        if "mark.flaky" not in text and "RERUN_WHEN_SWAMPED" not in text:
            continue
        mod = load_script(path, f"_policy_{path.stem}")
        marks = [m for m in getattr(mod, "pytestmark", []) if m.name == "flaky"]
        for obj in vars(mod).values():
            marks += [m for m in getattr(obj, "pytestmark", []) if m.name == "flaky"]
        assert marks, path.name
        for mark in marks:
            assert mark.kwargs.get("only_rerun") == [BoxTooNoisy], (path.name, mark.kwargs)
        seen += 1
    assert seen >= 3  # test_bench_timing.py, test_doctor_vllm.py, test_doctor_truth_vllm.py
    assert RERUN_WHEN_SWAMPED.kwargs == {"reruns": 1, "only_rerun": [BoxTooNoisy]}


def test_cpu_times_read_the_box():
    before = CpuTimes.now()
    # CPU time of our own until the box's busy counter moves (it counts in ticks: a short loop
    # can finish inside one); 10 s at most, far past any tick
    deadline = time.monotonic() + 10.0
    while CpuTimes.now().busy == before.busy and time.monotonic() < deadline:
        sum(i * i for i in range(50_000))
    share = CpuTimes.now().busy_share_since(before)
    assert 0.0 < share <= 1.0
    assert before.busy_share_since(before) == 0.0  # no time passed: nothing to divide


def test_run_queue_wait_reads_each_process():
    import os

    before = RunQueueWait.now(os.getpid(), 2**22 + 1)  # this process, and no process at all
    sum(i * i for i in range(200_000))
    waited = RunQueueWait.now(os.getpid(), 2**22 + 1).ms_since(before)
    assert waited[os.getpid()] >= 0.0 and waited[2**22 + 1] == 0.0
