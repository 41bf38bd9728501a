"""predict's public surface names its types: no public function or method signature, and no
public model field, mentions ``Any`` (issue 22: "0 Any in predict's public and step-model
signatures"). Private helpers (``_name``) may still read raw JSON loosely; what a caller sees
is typed. Read with ``ast``, so code no test runs is checked too."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

PREDICT = Path(str(resources.files("ceiling"))) / "predict"


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _mentions_any(node: ast.AST | None) -> bool:
    if node is None:
        return False
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and n.id == "Any":
            return True
        if isinstance(n, ast.Attribute) and n.attr == "Any":
            return True
        if isinstance(n, ast.Constant) and isinstance(n.value, str):  # a quoted annotation
            try:
                if _mentions_any(ast.parse(n.value, mode="eval")):
                    return True
            except SyntaxError:
                continue
    return False


def _public_any(body: list[ast.stmt], where: str, in_class: bool) -> Iterator[str]:
    """Public defs (and, in a class, public annotated fields) whose annotations name Any; a
    private def or class is not walked (nothing in it is public)."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not _private(node.name):
            a = node.args
            params = [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]
            annotations = [p.annotation for p in params if p is not None] + [node.returns]
            if any(_mentions_any(x) for x in annotations):
                yield f"{where}{node.name}()"
        elif isinstance(node, ast.ClassDef) and not _private(node.name):
            yield from _public_any(node.body, f"{where}{node.name}.", in_class=True)
        elif (
            in_class
            and isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and not _private(node.target.id)
            and _mentions_any(node.annotation)
        ):
            yield f"{where}{node.target.id}"


def _offenders() -> list[str]:
    out = []
    for path in sorted(PREDICT.rglob("*.py")):
        rel = path.relative_to(PREDICT.parent).with_suffix("")
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        out += list(_public_any(tree.body, ".".join(rel.parts) + ":", in_class=False))
    return out


def test_no_public_signature_or_field_in_predict_mentions_any():
    assert not _offenders(), "Any in predict's public surface (type it: e.g. pydantic JsonValue)"


def test_the_scan_sees_what_it_must():
    """The scan flags each shape it looks for (so an empty result means something)."""
    src = """
def f(x: Any) -> int: ...
def g(x: int) -> dict[str, typing.Any]: ...
def _h(x: Any) -> Any: ...
class M:
    a: list["Any"]
    _b: Any
    def m(self, *, k: Any = None) -> None: ...
    def __init__(self, **kw: Any) -> None: ...
class _P:
    c: Any
"""
    found = list(_public_any(ast.parse(src).body, "", in_class=False))
    assert found == ["f()", "g()", "M.a", "M.m()", "M.__init__()"]
