"""The layering contract of src/ceiling, read from the source (no import is executed).

The graph has an edge A -> B for every ``import`` of B in A, function-local and TYPE_CHECKING
imports included: a lazy import hides a dependency from ``python -X importtime``, not from the
design. ``from pkg import name`` is an edge to ``pkg`` and, when ``pkg.name`` is a module, to it
too (the team's ``import_cycles.py`` counts the same way). Rules (issue 14):

- no import cycle between modules;
- ``ceiling.engines`` never imports ``ceiling.diagnose`` (engines are data the diagnosis reads);
- ``ceiling.diagnose`` never imports ``ceiling.report`` (a report renders a diagnosis);
- the flow layer (issue 22): ``ceiling.flows`` may import any library; no library imports
  ``ceiling.flows`` or ``ceiling.cli`` (only ``ceiling.cli`` and ``ceiling.__main__`` sit above);
- ``ceiling.diagnose`` is pure: it imports none of the modules that do I/O (:data:`IO_MODULES`:
  HTTP clients, process launchers, hardware probes, the sanity checks' requests, preflight's
  engine calls, envcheck, the flows) nor the standard library's process/network modules;
- ``ceiling.sweep`` never imports ``ceiling.report`` and the report reads only the sweep's nouns
  (``ceiling.sweep.schema``): the flow imports both;
- no ``# fmt: skip`` / ``# fmt: off`` in src/ceiling (issue 40): a module's length is what the
  formatter lays out, never statements packed by hand to pass a line count;
- a line cap (:data:`MAX_LINES`) as a backstop only: what bounds a module is the purity closure
  below and a cohesion review (one concept a module), not a count;
- the purity closure (issue 40): the whole import closure of every module of ``ceiling.diagnose``
  and of every ``*schema*`` / ``*_model`` module reaches no module that opens a socket or starts
  a process (:data:`IO_MODULES`, or a module importing :data:`IO_STDLIB` / :data:`IO_THIRD_PARTY`).
  Reading and writing the user's files (``ceiling.inputs``, ``ceiling.outputs``, the packaged data
  through ``spec._data``) is not counted: those are the one place each of them happens;
- what the diagnosis reads of an engine (log grammars, fixes, streaming) is data
  (``ceiling.engines.diagnosis_data``): no pure module reaches an engine adapter;
- one way to talk to a server (issue 40): no package but ``ceiling.bench`` imports the bench's
  client modules (:data:`BENCH_CLIENT`); the server's nouns and the calls that are no timed
  stream come from ``ceiling.server``;
- the package never imports nor names in code a path under ``experiments/`` (issue 40: a pip
  install has no experiments; docstrings and comments may cite them as provenance).

What is broken today is listed below as KNOWN_*: a new violation fails, and so does a known one
that is gone (delete its entry), so these lists are always exactly what is left to fix.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
#: The backstop (issue 40 replaced the 500-line cap by the closure rule and a cohesion review).
#: Set where the modules land once nothing is packed by ``# fmt: skip``; over the old 500:
#: - ``ceiling.predict.ops`` (539): one concept, the decode step as a list of ops with shapes;
#:   each layer kind (GQA, MLA, DCP, GDN, MoE, collectives) is one small function of the same
#:   list, as each variant of nccl-tests is a small slice over one harness. Splitting the kinds
#:   out would be a split by length: ``build_ops`` would import its own pieces back.
#: - ``ceiling.predict.llamacpp`` (524): the llama.cpp predictor, pure: the decode step of a
#:   GGUF and the kernel profile it is priced with (its noun, read from test-backend-ops' SQL).
#:   At 528 unpacked it also read and wrote files; that was split by concept instead
#:   (``predict.llamacpp_files`` reads, ``flows.calibrate_llamacpp`` writes,
#:   ``probe.llamacpp_calibrate`` runs the process). The profile beside ``llamacpp_fit`` is the
#:   next candidate if the step grows.
MAX_LINES = 540

# Cycles that exist today (issue 14, phase B removes them).
KNOWN_CYCLES: set[frozenset[str]] = set()
# Layering breaks that exist today: (importer, imported).
KNOWN_LAYER_BREAKS: set[tuple[str, str]] = set()
#: Over :data:`MAX_LINES` and not one concept: split by concept (issue 40 point 3).
KNOWN_LONG_MODULES: set[str] = set()
FORBIDDEN = (
    ("ceiling.engines", "ceiling.diagnose"),
    ("ceiling.diagnose", "ceiling.report"),
    ("ceiling.sweep", "ceiling.report"),
)
#: The layers above the libraries: a library never imports these.
TOP = ("ceiling.flows", "ceiling.cli", "ceiling.__main__")
#: Modules (or packages) that do I/O: network, processes, hardware, the engines' installs.
IO_MODULES = (
    "ceiling.bench.runner",
    "ceiling.bench.client",
    "ceiling.bench.http",
    "ceiling.bench.pool",
    "ceiling.bench.workers",
    "ceiling.bench.rayworkers",
    "ceiling.bench.load",
    "ceiling.bench.telemetry",
    "ceiling.server.policy",
    "ceiling.server.sync",
    "ceiling.server.aio",
    "ceiling.run",
    "ceiling.probe.topology",
    "ceiling.probe.telemetry",
    "ceiling.probe.nvml",
    "ceiling.probe.commbench",
    "ceiling.probe.commbench_worker",
    "ceiling.probe.calibrate",
    "ceiling.probe.calibrate_ops",
    "ceiling.probe.commands",
    "ceiling.probe.cpu_host",
    "ceiling.probe.ranks",
    "ceiling.probe.rankstage",
    "ceiling.sanity.gate",
    "ceiling.sanity.checks",
    "ceiling.sanity.reference",
    "ceiling.engines.preflight",
    "ceiling.envcheck",
    "ceiling.deploy",
    *TOP,
)
#: The bench's own HTTP client: only ``ceiling.bench`` imports it (``bench.served``, the
#: ``/v1/models`` wrapper other packages imported, is gone: ``ceiling.server.sync``).
BENCH_CLIENT = ("ceiling.bench.client", "ceiling.bench.served")
#: Standard-library modules that talk to processes or the network.
IO_STDLIB = ("subprocess", "socket", "http", "urllib.request", "asyncio", "multiprocessing")
#: Third-party libraries that talk to the network, to processes or to the hardware.
IO_THIRD_PARTY = ("aiohttp", "requests", "httpx", "urllib3", "psutil", "pynvml", "ray", "torch")
#: I/O modules the purity closure still reaches (none: ``diagnose.logs`` reads the engines' log
#: grammars as data, ``engines.diagnosis_data``, not through the adapters any more).
KNOWN_IMPURE_CLOSURE: set[str] = set()
#: What the diagnosis reads of an engine is data (``ceiling.engines.diagnosis_data``): it never
#: reaches an adapter (they find, probe and launch engines) nor ``ceiling.engines`` itself (whose
#: ``get_engine`` imports the adapters by name, which the graph cannot see).
ADAPTER_MODULES = (
    "ceiling.engines",
    "ceiling.engines.base",
    "ceiling.engines.install",
    "ceiling.engines.vllm",
    "ceiling.engines.sglang",
    "ceiling.engines.llamacpp",
    "ceiling.engines.llamacpp_server",
)


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted((SRC / "ceiling").rglob("*.py")):
        name = ".".join(path.relative_to(SRC).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def _targets(node: ast.AST, module: str, is_package: bool) -> Iterator[str]:
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:  # relative: from the module's package upwards
            package = module.split(".") if is_package else module.split(".")[:-1]
            parts = package[: len(package) - node.level + 1]
            base = ".".join([*parts, base] if base else parts)
        yield base
        yield from (f"{base}.{alias.name}" for alias in node.names)


def build_graph() -> dict[str, set[str]]:
    """Module -> the ceiling modules it imports (anywhere in its body)."""
    mods = _modules()
    graph: dict[str, set[str]] = {name: set() for name in mods}
    for name, path in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            for target in _targets(node, name, path.name == "__init__.py"):
                while target and target not in mods:  # ceiling.x.y.Name -> ceiling.x.y
                    target = target.rpartition(".")[0]
                if target and target not in (name, "ceiling"):
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.add(frozenset(comp))
    return found


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _fmt(items: set) -> str:
    return "\n  ".join(
        sorted(" <-> ".join(sorted(i)) if isinstance(i, frozenset) else str(i) for i in items)
    )


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return build_graph()


def test_the_graph_sees_function_local_and_relative_imports(graph):
    # flows.sweep imports report and bench.stats: both edges count
    assert "ceiling.report" in graph["ceiling.flows.sweep"]
    assert "ceiling.bench.stats" in graph["ceiling.flows.sweep"]
    assert "ceiling.sanity.reference" in graph["ceiling.sanity.checks"]  # a function-local import
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == {frozenset("abc")}
    assert cycles({"a": {"b"}, "b": set()}) == set()


def test_no_new_import_cycle(graph):
    found = cycles(graph)
    new, gone = found - KNOWN_CYCLES, KNOWN_CYCLES - found
    assert not new, f"new import cycle(s) (function-local imports counted):\n  {_fmt(new)}"
    assert not gone, f"fixed, remove from KNOWN_CYCLES:\n  {_fmt(gone)}"


def test_layers_engines_never_import_diagnose_and_diagnose_never_imports_report(graph):
    breaks = {
        (a, b)
        for a, targets in graph.items()
        for b in targets
        for low, high in FORBIDDEN
        if _within(a, low) and _within(b, high)
    }
    new, gone = breaks - KNOWN_LAYER_BREAKS, KNOWN_LAYER_BREAKS - breaks
    assert not new, f"new layering break(s), importer -> imported:\n  {_fmt(new)}"
    assert not gone, f"fixed, remove from KNOWN_LAYER_BREAKS:\n  {_fmt(gone)}"


def test_no_module_over_the_line_cap():
    long = {
        name
        for name, path in _modules().items()
        if path.read_text(encoding="utf-8").count("\n") > MAX_LINES
    }
    new, gone = long - KNOWN_LONG_MODULES, KNOWN_LONG_MODULES - long
    assert not new, f"module(s) over {MAX_LINES} lines: split them:\n  {_fmt(new)}"
    assert not gone, f"now short, remove from KNOWN_LONG_MODULES:\n  {_fmt(gone)}"


def test_no_fmt_skip_in_the_package():
    """Issue 40: 137 ``# fmt: skip`` lines packed statements to stay under a line cap."""
    marks = ("# fmt: skip", "# fmt: off", "# fmt:skip", "# fmt:off")
    found = sorted(
        f"{path.relative_to(SRC)}:{n}"
        for path in _modules().values()
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if any(mark in line for mark in marks)
    )
    assert not found, "let the formatter lay these out:\n  " + "\n  ".join(found)


#: Readers and writers of files: the llama.cpp predictor takes what they return, never calls them.
FILE_READERS = {
    "ceiling.inputs": None,
    "ceiling.outputs": None,
    "ceiling.predict.gguf": {"read_gguf", "is_gguf", "gguf_error"},
    "ceiling.spec.profile": {"load_profile", "save_profile"},
}


def test_the_llamacpp_predictor_starts_no_process_and_opens_no_file(graph):
    """Issue 40: ``predict.llamacpp`` was a predictor, a subprocess runner and a CLI body that
    wrote files. The predictor behind ``predict.api``'s engine dispatch now reaches no process or
    network module through its whole closure, and imports no file reader or writer (its GGUF
    header and kernels come from ``predict.llamacpp_files``)."""
    mod = "ceiling.predict.llamacpp"
    assert not set(_reached(graph, mod)) & _io_modules()
    tree = ast.parse(_modules()[mod].read_text(encoding="utf-8"))
    reads = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in FILE_READERS:
            names = FILE_READERS[node.module]
            reads |= {f"{node.module}.{a.name}" for a in node.names if not names or a.name in names}
        elif isinstance(node, ast.Import):
            reads |= {a.name for a in node.names if a.name in FILE_READERS}
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "open":
            reads.add("open()")
        elif isinstance(node, ast.Attribute) and node.attr in {"read_text", "write_text", "open"}:
            reads.add(f".{node.attr}")
    assert not reads, f"{mod} does file I/O: {sorted(reads)}"
    assert "ceiling.predict.llamacpp_files" in graph["ceiling.predict.api"]  # the dispatch


def _code_strings(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """The string constants of ``tree`` that are not docstrings: what the code compares to."""
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield node.lineno, node.value


@pytest.mark.parametrize("module", ["ceiling.diagnose.expect", "ceiling.diagnose.judge"])
def test_the_diagnosis_reads_a_trait_not_the_llamacpp_engine_name(module):
    """Issue 40: which servers are predicted from their GGUF, by which predictor, with which
    variant flags, is ``engines.diagnosis_data``'s (``FilePrediction``); the diagnosis compares
    no engine name to llama.cpp's."""
    tree = ast.parse(_modules()[module].read_text(encoding="utf-8"))
    named = [
        f"{module}:{n}: {text!r}"
        for n, text in _code_strings(tree)
        if any(word in text.lower() for word in ("llamacpp", "llama.cpp", "ggml_"))
    ]
    assert not named, "llama.cpp's knowledge belongs to engines/:\n  " + "\n  ".join(named)


def test_libraries_never_import_the_flows_or_the_cli(graph):
    up = {
        (a, b)
        for a, targets in graph.items()
        if not any(_within(a, top) for top in TOP)
        for b in targets
        if any(_within(b, top) for top in TOP)
    }
    assert not up, f"a library imports a flow or the CLI:\n  {_fmt(up)}"
    assert any(_within(b, "ceiling.run") for b in graph["ceiling.flows.doctor"])  # flows may


def test_diagnose_is_pure_it_imports_no_io(graph):
    io = {
        (a, b)
        for a, targets in graph.items()
        if _within(a, "ceiling.diagnose")
        for b in targets
        if any(_within(b, m) for m in IO_MODULES)
    }
    assert not io, f"ceiling.diagnose imports I/O (move it to ceiling.flows):\n  {_fmt(io)}"
    stdlib = set()
    for name, path in _modules().items():
        if not _within(name, "ceiling.diagnose"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            for target in _targets(node, name, path.name == "__init__.py"):
                if any(target == m or target.startswith(m + ".") for m in IO_STDLIB):
                    stdlib.add((name, target))
    assert not stdlib, f"ceiling.diagnose does process/network I/O:\n  {_fmt(stdlib)}"


def test_the_report_reads_only_the_sweeps_nouns(graph):
    reads = {
        b
        for a, targets in graph.items()
        if _within(a, "ceiling.report")
        for b in targets
        if _within(b, "ceiling.sweep")
    }
    assert reads == {"ceiling.sweep.schema"}


def _io_modules() -> set[str]:
    """IO_MODULES and every module that imports a process/network library (stdlib or not)."""
    out = set()
    for name, path in _modules().items():
        if any(_within(name, m) for m in IO_MODULES):
            out.add(name)
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            for target in _targets(node, name, path.name == "__init__.py"):
                if any(_within(target, m) for m in IO_STDLIB + IO_THIRD_PARTY):
                    out.add(name)
    return out


def _pure_roots(graph: dict[str, set[str]]) -> set[str]:
    """The diagnosis package and every schema/model module (the nouns). ``ceiling.demo``'s
    ``tiny_model`` writes a checkpoint (a model of weights, not of nouns): not one of them."""
    return {
        name
        for name in graph
        if not _within(name, "ceiling.demo")
        and (
            _within(name, "ceiling.diagnose")
            or "schema" in name.rpartition(".")[2]
            or name.rpartition(".")[2].endswith("_model")
        )
    }


def _reached(graph: dict[str, set[str]], root: str) -> dict[str, str | None]:
    """Breadth-first: every module ``root`` reaches -> the module it was reached from."""
    prev: dict[str, str | None] = {root: None}
    queue = [root]
    while queue:
        here = queue.pop(0)
        for nxt in sorted(graph[here]):
            if nxt not in prev:
                prev[nxt] = here
                queue.append(nxt)
    return prev


def test_the_nouns_and_the_diagnosis_reach_no_io_through_their_whole_closure(graph):
    io = _io_modules()
    assert "ceiling.bench.client" in io and "ceiling.trace.window_io" in io  # the rule sees them
    reached: dict[str, str] = {}
    for root in sorted(_pure_roots(graph)):
        prev = _reached(graph, root)
        for mod in sorted(set(prev) & io):
            chain: list[str] = []
            at: str | None = mod
            while at is not None:
                chain.append(at)
                at = prev[at]
            reached.setdefault(mod, " -> ".join(reversed(chain)))
    new = {f"{m}: {c}" for m, c in reached.items() if m not in KNOWN_IMPURE_CLOSURE}
    gone = KNOWN_IMPURE_CLOSURE - set(reached)
    assert not new, (
        f"a pure module reaches I/O (move the noun out of the I/O module):\n  {_fmt(new)}"
    )
    assert not gone, f"no longer reached, remove from KNOWN_IMPURE_CLOSURE:\n  {_fmt(gone)}"


def test_the_diagnosis_reads_engines_as_data_never_through_an_adapter(graph):
    """Issue 40: the log grammars were read through the adapters (``diagnose.logs`` ->
    ``engines.base`` -> ``engines.install``, a subprocess); now they are data apart from them."""
    io = _io_modules()
    assert {"ceiling.engines.base", "ceiling.engines.install"} <= io  # the closure rule sees them
    from ceiling.engines.names import ADAPTERS

    assert {m for m, _ in ADAPTERS.values()} <= set(ADAPTER_MODULES)  # every adapter is listed
    reached = {
        f"{root} reaches {mod}"
        for root in sorted(_pure_roots(graph))
        for mod in _reached(graph, root)
        if mod in ADAPTER_MODULES
    }
    assert not reached, f"a pure module reaches an engine adapter:\n  {_fmt(reached)}"


def test_only_the_bench_imports_the_bench_client(graph):
    """Server nouns (``ServedModel``) and ``/v1/models`` come from ``ceiling.server``: other
    packages used to import them through ``bench.served`` (issue 40: bench had become the client
    package in all but name)."""
    outside = {
        f"{a} imports {b}"
        for a, targets in graph.items()
        if not _within(a, "ceiling.bench")
        for b in targets
        if any(_within(b, m) for m in BENCH_CLIENT)
    }
    assert not outside, f"import the server's nouns/calls from ceiling.server:\n  {_fmt(outside)}"
    assert "ceiling.bench.client" in graph["ceiling.bench.runner"]  # the rule sees bench's own


def test_the_package_never_imports_nor_names_experiments():
    """A pip install has no ``experiments/``: code (not docstrings, not comments) never imports
    it, builds a path into it or tells the user to run a script from it."""
    found = set()
    for name, path in _modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            for target in _targets(node, name, path.name == "__init__.py"):
                if _within(target, "experiments") or _within(target, "validation"):
                    found.add(f"{name} imports {target}")
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in docstrings
                and "experiments/" in node.value
            ):
                found.add(f"{name}:{node.lineno} names {node.value[:60]!r}")
    assert not found, f"src/ceiling reaches into experiments/:\n  {_fmt(found)}"
