"""The import rules of DESIGN.md, checked on the source with ``ast`` (nothing is imported).

(a) No import cycle among conveyor's modules, not even one closed by an import under
    ``TYPE_CHECKING``: a type-only back-edge still ties the two modules into one.
(b) ``conveyor._workers`` never imports ``conveyor._iter``.
(c) ``conveyor._iter`` and ``conveyor.diagnostics`` never import ``conveyor.loader``.
(d) Nothing but ``conveyor/__init__.py`` imports ``conveyor.loader``. ``cli``, ``doctor`` and
    ``benchmark`` are applications of the public API: they take ``DataLoader`` from the
    package (``from conveyor import DataLoader``), as a user does, never from ``loader.py``.
(e) The task book and what decides beside it (its ledger and facts, the crash judge, the
    deadlines, the run-ahead, the skip records: :data:`BOOK`) import nothing of
    ``conveyor._workers`` or ``conveyor._transport``: they are pure.
(f) ``conveyor._iter`` reaches a kind of worker (a module of ``conveyor._workers`` other
    than the protocol, the core and what they share: :data:`SHARED_WORKERS`) only through
    ``conveyor._workers.kinds``.

What counts as an import of a conveyor module:

* Every ``import`` and ``from ... import`` statement, at module level or inside a function
  (it runs when the function is called; a cycle that works only because one import is
  deferred is still a cycle), and ``importlib.import_module`` / ``__import__`` of a
  literal name.
* Imports under ``if TYPE_CHECKING:`` never run, but they still tie a module to another
  (its types): (a) to (f) count them. Chains through other modules count imports that run.
* ``from package import name`` imports the submodule ``package.name`` when there is one,
  else ``package/__init__.py``.
* Importing ``a.b.c`` first runs the ``__init__`` of ``a`` and of ``a.b``: an edge to each,
  except to the packages that contain the importer. Python imports a package before any of
  its submodules, so that ``__init__`` has already run (or is running) when the importer
  runs: ``conveyor._iter.book`` importing ``conveyor._iter.messages`` does not depend on
  ``conveyor/_iter/__init__.py``. An explicit ``from conveyor._iter import X`` of a name
  that ``__init__`` defines does, and counts.

(b) and (c) are also checked through other modules, over imports that run:
``conveyor._iter.x`` importing the ``conveyor`` package, whose ``__init__`` imports
``loader``, breaks (c) just as a direct import does. Each violation is reported once, at
the first module of the chain that belongs to the layer.
"""

from __future__ import annotations

import ast
import collections
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
PACKAGE = "conveyor"

LOADER = "conveyor.loader"
LOADER_IMPORTERS = frozenset({"conveyor"})  # the package's __init__: the public API
BOOK = tuple(
    f"conveyor._iter.{name}"
    for name in ("book", "ledger", "facts", "steps", "crashes", "deadlines", "run_ahead", "skips")
)
KINDS = "conveyor._workers.kinds"
# What of conveyor._workers is every kind's: the pool protocol, the core and its spec,
# the start method, the fork gates, what the core reports errors with, the per-core
# scope (worker info, seeds, per_worker handles) with the draws it answers per thread,
# and Ctrl-C's handling (held back over steps that must not be cut in half; noted when
# it passes through a loader).
SHARED_WORKERS = frozenset(
    f"conveyor._workers{name}"
    for name in ("", ".api", ".core", ".spec", ".kinds", ".start_method", ".fork_gate",
                 ".remote_error", ".sources", ".scope", ".thread_draws", ".interrupts")
)  # fmt: skip


@dataclass(frozen=True)
class Edge:
    """``importer`` imports ``target`` at ``file:line``."""

    importer: str
    target: str
    file: str
    line: int
    type_only: bool = False  # under ``if TYPE_CHECKING:``
    deferred: bool = False  # inside a function: runs when it is called
    implicit: bool = False  # a package ``__init__`` that runs before the named module

    def where(self) -> str:
        notes = [
            note
            for flag, note in (
                (self.type_only, "under TYPE_CHECKING"),
                (self.deferred, "in a function"),
                (self.implicit, f"runs {self.target}/__init__ first"),
            )
            if flag
        ]
        return f"{self.file}:{self.line}" + (f" ({', '.join(notes)})" if notes else "")


@dataclass(frozen=True)
class Graph:
    modules: frozenset[str]
    edges: tuple[Edge, ...]
    unresolved: tuple[str, ...]  # imports of conveyor modules that do not exist

    def imports(self) -> dict[str, set[str]]:
        """Who imports whom, TYPE_CHECKING imports included."""
        graph: dict[str, set[str]] = {name: set() for name in self.modules}
        for edge in self.edges:
            graph[edge.importer].add(edge.target)
        return graph

    def runtime(self) -> dict[str, set[str]]:
        """Who imports whom when the code runs (TYPE_CHECKING imports left out)."""
        graph: dict[str, set[str]] = {name: set() for name in self.modules}
        for edge in self.edges:
            if not edge.type_only:
                graph[edge.importer].add(edge.target)
        return graph

    def edge(self, importer: str, target: str) -> Edge:
        """The edge to show for ``importer → target``: a runtime one, explicit first."""
        candidates = [e for e in self.edges if (e.importer, e.target) == (importer, target)]
        return min(candidates, key=lambda e: (e.type_only, e.implicit, e.deferred, e.line))


# --- reading the source ------------------------------------------------------------------


def discover(src: Path, package: str) -> dict[str, Path]:
    """``{module name: file}`` for every ``.py`` file of ``package`` under ``src``."""
    modules = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def _statements(
    node: ast.AST, type_only: bool = False, deferred: bool = False
) -> Iterator[tuple[ast.AST, bool, bool]]:
    """Every import statement and call below ``node``, with its context."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for stmt in child.body:
                yield from _statements_of(stmt, True, deferred)
            for stmt in child.orelse:
                yield from _statements_of(stmt, type_only, deferred)
        else:
            yield from _statements_of(child, type_only, deferred)


def _statements_of(
    node: ast.AST, type_only: bool, deferred: bool
) -> Iterator[tuple[ast.AST, bool, bool]]:
    if isinstance(node, (ast.Import, ast.ImportFrom, ast.Call)):
        yield node, type_only, deferred
    inner = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
    yield from _statements(node, type_only, deferred or inner)


def _absolute(module: str | None, level: int, importer: str, is_package: bool) -> str:
    """The absolute name of ``from <level dots><module> import ...`` in ``importer``."""
    if level == 0:
        return module or ""
    base = importer.split(".") if is_package else importer.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, module] if module else base)


def _literal_import(call: ast.Call) -> str | None:
    """``importlib.import_module("x")`` or ``__import__("x")``: ``"x"``."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name not in ("import_module", "__import__") or not call.args:
        return None
    first = call.args[0]
    if isinstance(first, ast.Constant) and isinstance(first.value, str):
        return first.value
    return None


def _named_targets(node: ast.AST, importer: str, is_package: bool) -> list[tuple[str, str]]:
    """``(module named, name imported from it or "")`` for one statement."""
    if isinstance(node, ast.Import):
        return [(alias.name, "") for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        base = _absolute(node.module, node.level, importer, is_package)
        return [(base, alias.name) for alias in node.names]
    if isinstance(node, ast.Call):
        literal = _literal_import(node)
        if literal is not None and not literal.startswith("."):
            return [(literal, "")]
    return []


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def build_graph(src: Path = SRC, package: str = PACKAGE) -> Graph:
    modules = discover(src, package)
    edges: set[Edge] = set()
    unresolved: list[str] = []
    for importer, path in modules.items():
        is_package = path.name == "__init__.py"
        file = str(path.relative_to(ROOT if ROOT in path.parents else src))
        tree = ast.parse(path.read_text(), filename=str(path))
        for node, type_only, deferred in _statements(tree):
            line = getattr(node, "lineno", 0)
            for base, name in _named_targets(node, importer, is_package):
                if not _within(base, package):
                    continue
                if f"{base}.{name}" in modules:
                    target = f"{base}.{name}"  # a submodule
                elif base in modules:
                    target = base  # a name its module (or package __init__) defines
                else:
                    unresolved.append(f"{file}:{line}: {importer} imports {base}: no such module")
                    continue
                if target == importer:
                    continue
                found = Edge(importer, target, file, line, type_only, deferred)
                edges.add(found)
                parts = target.split(".")
                for i in range(1, len(parts)):
                    ancestor = ".".join(parts[:i])
                    if not _within(importer, ancestor):
                        edges.add(Edge(importer, ancestor, file, line, type_only, deferred, True))
    ordered = sorted(edges, key=lambda e: (e.importer, e.target, e.line, e.implicit))
    return Graph(frozenset(modules), tuple(ordered), tuple(unresolved))


# --- cycles --------------------------------------------------------------------------------


def strongly_connected(graph: Mapping[str, Iterable[str]]) -> list[set[str]]:
    """Tarjan's strongly connected components of ``graph``."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def find_cycles(graph: Mapping[str, Iterable[str]]) -> list[tuple[list[str], set[str]]]:
    """One shortest cycle ``[a, b, ..., a]`` per tangle of mutually importing modules,
    with the tangle's other members (each of them is on some cycle through ``a``)."""
    found = []
    for component in strongly_connected(graph):
        start = min(component)
        if len(component) == 1 and start not in set(graph.get(start, ())):
            continue
        previous: dict[str, str] = {}
        queue = collections.deque([start])
        while queue:  # breadth first inside the component: the shortest way back to start
            node = queue.popleft()
            if start in set(graph.get(node, ())):
                cycle = [start]
                while node != start:
                    cycle.insert(1, node)
                    node = previous[node]
                found.append(([*cycle, start], component - set(cycle)))
                break
            for succ in sorted(graph.get(node, ())):
                if succ in component and succ not in previous and succ != start:
                    previous[succ] = node
                    queue.append(succ)
    return sorted(found, key=lambda item: item[0])


def describe_cycle(graph: Graph, cycle: list[str], others: set[str]) -> str:
    lines = [f"  {cycle[0]}"]
    for importer, target in itertools.pairwise(cycle):
        lines.append(f"    → {target}    [{graph.edge(importer, target).where()}]")
    if others:
        lines.append(f"    (the same tangle also holds: {', '.join(sorted(others))})")
    return "\n".join(lines)


# --- the rules -------------------------------------------------------------------------------


def _path(graph: Graph, chain: list[str]) -> str:
    steps = [
        f"{importer} → {target} [{graph.edge(importer, target).where()}]"
        for importer, target in itertools.pairwise(chain)
    ]
    return "; ".join(steps)


def _reached(
    graph: Graph,
    runtime: Mapping[str, Iterable[str]],
    start: str,
    wanted: Callable[[str], bool],
    passed_by: Callable[[str], bool],
) -> list[str]:
    """The first module ``wanted`` that ``start`` reaches over imports that run, through
    at least one other module and none ``passed_by``: its chain, said (or nothing)."""
    previous: dict[str, str] = {start: start}
    queue = collections.deque([start])
    while queue:
        node = queue.popleft()
        for succ in sorted(runtime[node]):
            if succ in previous or passed_by(succ):
                continue
            previous[succ] = node
            if wanted(succ):
                chain = [succ]
                while chain[0] != start:
                    chain.insert(0, previous[chain[0]])
                if len(chain) > 2:
                    return [f"{start} reaches {succ} through: {_path(graph, chain)}"]
                return []
            queue.append(succ)
    return []


def layer_violations(graph: Graph, layers: tuple[str, ...], forbidden: str) -> list[str]:
    """Modules of ``layers`` that import ``forbidden`` (a module or a package) directly
    (TYPE_CHECKING included) or through modules outside both (imports that run)."""
    in_layer = {m for m in graph.modules if any(_within(m, layer) for layer in layers)}
    out = []
    for edge in graph.edges:
        if edge.importer in in_layer and _within(edge.target, forbidden) and not edge.implicit:
            out.append(f"{edge.importer} imports {edge.target} [{edge.where()}]")
    runtime = graph.runtime()
    for start in sorted(in_layer):
        out += _reached(
            graph, runtime, start, lambda m: _within(m, forbidden), lambda m: m in in_layer
        )
    return out


def _is_kind(module: str) -> bool:
    return _within(module, "conveyor._workers") and module not in SHARED_WORKERS


def kind_violations(graph: Graph, layer: str = "conveyor._iter") -> list[str]:
    """Modules of ``layer`` that import a kind of worker's module (TYPE_CHECKING included),
    or reach one over imports that run other than through ``kinds.py``."""
    in_layer = sorted(m for m in graph.modules if _within(m, layer))
    out = [
        f"{e.importer} imports {e.target} [{e.where()}]"
        for e in graph.edges
        if e.importer in in_layer and _is_kind(e.target) and not e.implicit
    ]
    runtime = graph.runtime()
    for start in in_layer:
        out += _reached(graph, runtime, start, _is_kind, lambda m: m == KINDS)
    return out


def violations(graph: Graph) -> dict[str, list[str]]:
    cycles = find_cycles(graph.imports())
    return {
        "every conveyor import names an existing module": list(graph.unresolved),
        "(a) no import cycles (TYPE_CHECKING imports included)": [
            describe_cycle(graph, cycle, others) for cycle, others in cycles
        ],
        "(b) conveyor._workers never imports conveyor._iter": layer_violations(
            graph, ("conveyor._workers",), "conveyor._iter"
        ),
        "(c) conveyor._iter and conveyor.diagnostics never import conveyor.loader": (
            layer_violations(graph, ("conveyor._iter", "conveyor.diagnostics"), LOADER)
        ),
        "(d) only conveyor/__init__.py imports conveyor.loader": [
            f"{e.importer} imports {LOADER} [{e.where()}]"
            for e in graph.edges
            if e.target == LOADER and not e.implicit and e.importer not in LOADER_IMPORTERS
        ],
        "(e) the book, the judges and the run-ahead import nothing of _workers or _transport": [
            *layer_violations(graph, BOOK, "conveyor._workers"),
            *layer_violations(graph, BOOK, "conveyor._transport"),
        ],
        "(f) conveyor._iter reaches a kind of worker only through kinds.py": kind_violations(graph),
    }


def test_the_benchmark_harness_has_no_import_cycle() -> None:
    """The harness (benchmarks/conveyor_bench) is held to rule (a) too (issue 41)."""
    graph = build_graph(ROOT / "benchmarks", "conveyor_bench")
    assert len(graph.modules) > 10 and not graph.unresolved, graph.unresolved
    cycles = find_cycles(graph.imports())
    report = "\n".join(describe_cycle(graph, cycle, others) for cycle, others in cycles)
    assert not cycles, f"conveyor_bench's modules import each other:\n{report}"


def test_import_rules_hold() -> None:
    found = {rule: items for rule, items in violations(build_graph()).items() if items}
    report = "\n\n".join(f"{rule}:\n" + "\n".join(items) for rule, items in found.items())
    assert not found, f"conveyor's import rules are broken:\n\n{report}"


# --- the checker checks ------------------------------------------------------------------------


def test_the_graph_sees_conveyors_own_imports() -> None:
    graph = build_graph()
    assert len(graph.modules) > 30
    assert {"conveyor", LOADER, "conveyor._iter", "conveyor._workers.pool"} <= graph.modules
    public = {e.target for e in graph.edges if e.importer == "conveyor" and not e.implicit}
    assert {LOADER, "conveyor.errors", "conveyor.collate"} <= public  # relative, in __init__


def test_the_book_and_the_kinds_rules_name_real_modules() -> None:
    graph = build_graph()
    assert set(BOOK) <= graph.modules
    assert {KINDS, *SHARED_WORKERS} <= graph.modules
    # The loop does reach the kinds of worker, through kinds.py (the config asks it).
    assert KINDS in graph.runtime()["conveyor.config"]
    assert any(_is_kind(target) for target in graph.runtime()[KINDS])


def test_cycle_finder_on_a_synthetic_graph() -> None:
    graph = {
        "a": {"b"},
        "b": {"c"},
        "c": {"a", "d"},  # a → b → c → a
        "d": set(),
        "e": {"e"},  # imports itself
        "f": {"g", "h"},
        "g": {"f"},  # f → g → f; h → i → f is a longer way round the same tangle
        "h": {"i"},
        "i": {"f"},
        "j": {"a", "d"},  # leads into a cycle without being on one
    }
    assert find_cycles(graph) == [
        (["a", "b", "c", "a"], set()),
        (["e", "e"], set()),
        (["f", "g", "f"], {"h", "i"}),
    ]
    acyclic = {"a": {"b", "c"}, "b": {"c"}, "c": set(), "d": {"a"}}
    assert find_cycles(acyclic) == []


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_graph_and_rules_on_a_synthetic_package(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "from .loader import Loader\nfrom . import sub\n",
            "pkg/loader.py": "from pkg.sub.a import f\nLoader = f\n",
            "pkg/sub/__init__.py": "from . import b\n",
            "pkg/sub/a.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n"
                "    from ..loader import Loader\n"
                "def f():\n"
                "    from .. import loader\n"
            ),
            "pkg/sub/b.py": "from . import a\nfrom .a import f\n",  # siblings, not sub/__init__
            "pkg/other.py": "import importlib\nimport pkg.sub.b\nimportlib.import_module('pkg')\n",
            "pkg/broken.py": "from .missing import x\n",
        },
    )
    graph = build_graph(tmp_path, "pkg")
    got = {(e.importer, e.target, e.type_only, e.deferred, e.implicit) for e in graph.edges}
    assert got == {
        ("pkg", "pkg.loader", False, False, False),
        ("pkg", "pkg.sub", False, False, False),
        ("pkg.loader", "pkg.sub.a", False, False, False),
        ("pkg.loader", "pkg.sub", False, False, True),  # sub/__init__ runs first
        ("pkg.sub", "pkg.sub.b", False, False, False),
        ("pkg.sub.a", "pkg.loader", True, False, False),
        ("pkg.sub.a", "pkg.loader", False, True, False),
        ("pkg.sub.b", "pkg.sub.a", False, False, False),
        ("pkg.other", "pkg.sub.b", False, False, False),
        ("pkg.other", "pkg.sub", False, False, True),
        ("pkg.other", "pkg", False, False, False),
    }
    assert [u.rpartition(": ")[2] for u in graph.unresolved] == ["no such module"]
    assert "pkg.broken imports pkg.missing" in graph.unresolved[0]
    # The import in f() closes a cycle; the TYPE_CHECKING one alone would not. sub/__init__
    # importing b, which imports its sibling a, closes none by itself (a and b do not depend
    # on sub/__init__); it joins the cycle because loader runs sub/__init__ first.
    ((cycle, others),) = find_cycles(graph.runtime())
    assert (cycle, others) == (["pkg.loader", "pkg.sub.a", "pkg.loader"], {"pkg.sub", "pkg.sub.b"})
    without_f = {
        m: {t for t in ts if (m, t) != ("pkg.sub.a", "pkg.loader")}
        for m, ts in graph.runtime().items()
    }
    assert find_cycles(without_f) == []
    text = describe_cycle(graph, cycle, others)
    assert "pkg/loader.py:1" in text and "pkg/sub/a.py:5 (in a function)" in text
    # The layer rule counts the TYPE_CHECKING import and the one in the function.
    assert layer_violations(graph, ("pkg.sub",), "pkg.loader") == [
        "pkg.sub.a imports pkg.loader [pkg/sub/a.py:3 (under TYPE_CHECKING)]",
        "pkg.sub.a imports pkg.loader [pkg/sub/a.py:5 (in a function)]",
    ]
    # pkg.other reaches pkg.loader only through the package's __init__.
    assert layer_violations(graph, ("pkg.other",), "pkg.loader") == [
        "pkg.other reaches pkg.loader through: pkg.other → pkg [pkg/other.py:3]; "
        "pkg → pkg.loader [pkg/__init__.py:1]"
    ]
