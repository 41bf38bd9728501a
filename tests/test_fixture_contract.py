"""Tests read fixtures, not the lab's dated folders (issue 40, point 5).

``experiments/results/<date>_...`` is the lab's record: folders get renamed, pruned or re-run, and
a test that reads one by path follows it silently (or breaks for a reason that has nothing to do
with the code). What a test asserts on a recorded run is copied into ``tests/fixtures/<topic>/``,
with a README naming the experiments path and date it came from.

The rule: no test module builds a path into ``experiments/results`` in code, whether as one string
(``"experiments/results/..."``, f-strings included) or as joined parts
(``ROOT / "experiments" / "results"``). Docstrings and comments may cite the lab folder as
provenance.

Tests of the lab's own scripts are another matter: tests/test_commbench_tp_decode.py runs
experiments/gpu/tp_decode.py, test_llamacpp_fit.py runs experiments/gpu/fake_llamacpp.sh, several
load experiments/validation scripts. Those test the scripts themselves, read no dated folder, and
this rule leaves them alone. :data:`LAB_SCRIPT_ON_ITS_RUN` is the one exception that does read one.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

TESTS = Path(__file__).resolve().parent

# test module -> why it may read experiments/results in place
LAB_SCRIPT_ON_ITS_RUN = {
    # runs the lab's analysis script (experiments/validation/llamacpp_kernels.py) on the profiler
    # traces it analysed (calls 5 and 6 of 2026-12-02_h200-llamacpp): 2.3 MB of ncu/CUPTI dumps,
    # too big to copy, and the point is that the script recomputes its recorded kernels.json
    "test_llamacpp_kernels.py": "lab analysis script on 2.3 MB of its own traces",
}


def _docstrings(tree: ast.AST) -> set[int]:
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }


def _div_parts(node: ast.expr) -> list[str]:
    """The string parts of an ``a / "b" / "c"`` chain, left to right ("?" for a non-string)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        return _div_parts(node.left) + _div_parts(node.right)
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value.strip("/")]
    return ["?"]


def lab_paths(source: str) -> Iterator[tuple[int, str]]:
    """(line, text) for each place the code builds a path into experiments/results."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            if "experiments/results" in node.value:
                yield node.lineno, node.value[:60]
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            joined = "/".join(_div_parts(node))
            if "experiments/results" in joined:
                yield node.lineno, joined[:60]


def test_the_rule_sees_each_way_of_building_the_path() -> None:
    src = '''"""Docstring: experiments/results/2026-12-02_x is provenance."""
A = ROOT / "experiments/results/2026-12-02_x"
B = Path(__file__).parents[1] / "experiments" / "results"
C = f"{ROOT}/experiments/results/{name}"
D = ROOT / "tests/fixtures/x"  # experiments/results/2026-12-02_x, a comment
def f():
    """experiments/results in a docstring."""
'''
    assert sorted({line for line, _ in lab_paths(src)}) == [2, 3, 4]


def test_no_test_module_reads_a_dated_lab_folder() -> None:
    found = {
        f"{path.relative_to(TESTS)}:{line} builds {text!r}"
        for path in sorted(TESTS.rglob("*.py"))
        if path.name not in LAB_SCRIPT_ON_ITS_RUN and path.name != Path(__file__).name
        for line, text in lab_paths(path.read_text(encoding="utf-8"))
    }
    assert not found, (
        "copy what the test reads into tests/fixtures/<topic>/ (README: source path and date):\n  "
        + "\n  ".join(sorted(found))
    )


def test_each_exception_still_reads_the_lab() -> None:
    """An exception that no longer reads experiments/results is stale: delete its entry."""
    for name in LAB_SCRIPT_ON_ITS_RUN:
        assert list(lab_paths((TESTS / name).read_text(encoding="utf-8"))), name
