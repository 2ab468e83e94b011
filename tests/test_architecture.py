"""The import graph of the project's packages: no cycles, no private names across modules.

DESIGN.md section 2 gives each package one job; the graph of their imports is how that shows in
the code.  A cycle means two modules cannot be understood (or changed, or imported) one without
the other; a private name (``_name``) used from another module is a contract nobody declared.
This module checks both over the packages in :data:`PACKAGES`, read with :mod:`ast` (nothing is
imported or run), and is also a command that prints what it finds::

    python -m tests.test_architecture            # cycles and private names, exit 1 if any
    python -m tests.test_architecture --edges    # and every edge of the graph

What counts as an import (all of them, wherever they are written):

- every ``import`` and ``from ... import`` statement: at module level, inside functions and
  classes, and under ``if TYPE_CHECKING:`` (a type-only import still ties the two modules: one
  cannot be read, moved or type-checked without the other);
- ``from pkg import name`` is an edge to the submodule ``pkg.name`` when there is one, else to
  ``pkg`` itself; ``import a.b.c`` is an edge to ``a.b.c``; relative imports are resolved;
- the parent packages of an imported module are *not* edges: ``import a.b.c`` runs
  ``a/__init__.py`` and ``a/b/__init__.py`` first, but a package that is still initialising
  can only fail a caller that reads a name from it, and that is written ``from a import name``
  or ``a.name``, which is an edge to ``a`` and is counted.  So a package ``__init__`` that
  re-exports its submodules (``mechanisms``, ``chorus_py.backends``) is no cycle, while a
  submodule that imports a name back from its own package's ``__init__`` is one;
- imports of modules outside the project (the standard library, sqlglot, tests) are not edges.

What counts as a private name: a name starting with one underscore (dunders such as ``__all__``
are public), imported with ``from x import _y`` (from any module, the project's or a library's)
or read as ``x._y`` where ``x`` is a project module the file imported (``os._exit`` and the like
are the standard library's business).  Only the project's packages are checked: tests may
reach into the modules they test.  Nothing is exempt.
"""

from __future__ import annotations

import argparse
import ast
import itertools
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: The project's packages: every module under them is a node of the graph.
PACKAGES = ("chorus_py", "analyses", "rewriters", "mechanisms", "budget", "server", "benchmarks")


@dataclass(frozen=True)
class Edge:
    """``source`` imports ``target`` at ``path:line``."""

    source: str
    target: str
    path: str
    line: int


@dataclass(frozen=True)
class PrivateUse:
    """``module`` uses the private name ``name`` of ``owner`` at ``path:line``."""

    module: str
    owner: str
    name: str
    path: str
    line: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.module} uses {self.owner}.{self.name}"


@dataclass(frozen=True)
class Graph:
    """The modules of some packages, the imports between them and the private names used."""

    modules: Mapping[str, Path]
    edges: tuple[Edge, ...]
    private: tuple[PrivateUse, ...]

    def targets(self, source: str) -> list[str]:
        """The modules ``source`` imports, sorted."""
        return sorted({e.target for e in self.edges if e.source == source})

    def edge(self, source: str, target: str) -> Edge:
        """The first import of ``target`` written in ``source``."""
        return min((e for e in self.edges if e.source == source and e.target == target),
                   key=lambda e: e.line)


def discover(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Every module under ``packages`` (directories of ``root``), by dotted name."""
    modules: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` names (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base.pop()
    base = base[:len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _known(name: str, modules: Mapping[str, Path]) -> str | None:
    """The longest prefix of ``name`` that is a project module (``a.b.f`` -> ``a.b``)."""
    parts = name.split(".")
    while parts:
        if ".".join(parts) in modules:
            return ".".join(parts)
        parts.pop()
    return None


def _dotted(node: ast.expr) -> str | None:
    """``a.b.c`` for an attribute chain of names, else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return f"{head}.{node.attr}" if head else None
    return None


def _scan(module: str, path: Path, modules: Mapping[str, Path],
          root: Path) -> tuple[list[Edge], list[PrivateUse]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    shown = path.relative_to(root).as_posix()
    is_package = path.name == "__init__.py"
    edges: list[Edge] = []
    private: list[PrivateUse] = []
    # Local names bound to project modules, for ``x._y``: ``import a.b`` binds ``a`` (read as
    # ``a.b._y``), ``import a.b as m`` and ``from a import b`` (a submodule) bind ``m`` / ``b``.
    bound: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _known(alias.name, modules)
                if target is None:
                    continue
                edges.append(Edge(module, target, shown, node.lineno))
                if alias.asname:
                    bound[alias.asname] = target
                else:
                    head = alias.name.split(".")[0]
                    if head in modules:
                        bound[head] = head
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(module, is_package, node)
            owner = _known(source, modules)
            for alias in node.names:
                # Any module's, the project's or a library's: a library's private name can
                # change in any release.
                if _private(alias.name):
                    private.append(PrivateUse(module, source, alias.name, shown, node.lineno))
                if owner is None:
                    continue
                submodule = f"{source}.{alias.name}"
                target = submodule if submodule in modules else owner
                edges.append(Edge(module, target, shown, node.lineno))
                if target == submodule:
                    bound[alias.asname or alias.name] = submodule
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            name = _dotted(node.value)
            if name is None:
                continue
            head, _, rest = name.partition(".")
            if head not in bound:
                continue
            owner = f"{bound[head]}.{rest}" if rest else bound[head]
            if owner in modules and owner != module:
                private.append(PrivateUse(module, owner, node.attr, shown, node.lineno))
    return edges, private


def build_graph(root: Path = ROOT, packages: Iterable[str] = PACKAGES) -> Graph:
    """Read every module under ``packages`` and collect its imports of the others."""
    modules = discover(root, packages)
    edges: list[Edge] = []
    private: list[PrivateUse] = []
    for module, path in modules.items():
        found, used = _scan(module, path, modules, root)
        edges += found
        private += used
    return Graph(modules, tuple(edges), tuple(private))


def _components(graph: Graph) -> list[list[str]]:
    """Strongly connected components of more than one module (or a module importing itself),
    by Tarjan's algorithm, iteratively (the graph may be deep)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph.modules):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(graph.targets(start)))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph.targets(child))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                members = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    members.append(member)
                    if member == node:
                        break
                if len(members) > 1 or node in graph.targets(node):
                    found.append(sorted(members))
    return sorted(found)


def _shortest_cycle(graph: Graph, start: str, within: set[str]) -> list[str]:
    """The shortest path start -> ... -> start inside one component (breadth first)."""
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in graph.targets(node):
                if child not in within:
                    continue
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if child not in previous:
                    previous[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"{start} is in a component but on no cycle")


def find_cycles(graph: Graph) -> list[list[str]]:
    """Import cycles as paths ``[a, b, ..., a]``: the shortest one through each module of each
    strongly connected component, without repeats (so every module on a cycle is shown)."""
    cycles: list[list[str]] = []
    seen: set[tuple[str, ...]] = set()
    for members in _components(graph):
        for start in members:
            cycle = _shortest_cycle(graph, start, set(members))
            ring = cycle[:-1]
            turn = ring.index(min(ring))
            key = tuple(ring[turn:] + ring[:turn])
            if key not in seen:
                seen.add(key)
                cycles.append([*key, key[0]])
    return cycles


def describe_cycle(graph: Graph, cycle: Sequence[str]) -> str:
    """``a -> b -> a`` and, below it, where each import is written."""
    where = [f"    {graph.edge(a, b).path}:{graph.edge(a, b).line}: {a} imports {b}"
             for a, b in itertools.pairwise(cycle)]
    return "\n".join([" -> ".join(cycle), *where])


def report(graph: Graph) -> list[str]:
    """Every violation, readable: the cycles, then the private names."""
    lines = [f"import cycle: {describe_cycle(graph, c)}" for c in find_cycles(graph)]
    lines += [f"private name: {use}" for use in graph.private]
    return lines


# -- the project --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def project() -> Graph:
    return build_graph()


def test_no_import_cycles(project: Graph) -> None:
    graph = project
    cycles = find_cycles(graph)
    assert not cycles, "import cycles among the project's modules:\n" + "\n".join(
        describe_cycle(graph, c) for c in cycles)


def test_no_private_names_across_modules(project: Graph) -> None:
    graph = project
    assert not graph.private, "private names used from another module:\n" + "\n".join(
        str(use) for use in graph.private)


#: The folders of server/ and what else of server/ each may import: the doors share only
#: server.listen and server.metrics; REST mounts the dashboard; server.serve imports the doors
#: and only server.workers (``chorus serve --workers``: it runs server.serve in each worker)
#: imports it (DESIGN.md section 2, issue 22); server.heap (the garbage collector's settings)
#: is for the servers' starts: server.serve and ``python -m server.rest``.
SERVER_LAYERS = {
    "server.pgwire": {"server.listen"},
    "server.rest": {"server.listen", "server.metrics", "server.dashboard", "server.heap"},
    "server.dashboard": {"server.metrics"},
    "server.metrics": set(),
    "server.listen": set(),
    "server.heap": set(),
    "server.serve": {"server.listen", "server.pgwire", "server.rest", "server.heap"},
    "server.workers": {"server.listen", "server.pgwire", "server.rest", "server.serve"},
}


def _layer(module: str) -> str | None:
    return next((layer for layer in SERVER_LAYERS
                 if module == layer or module.startswith(layer + ".")), None)


def test_the_front_doors_import_only_what_they_share(project: Graph) -> None:
    graph = project
    wrong = []
    for edge in graph.edges:
        source, target = _layer(edge.source), _layer(edge.target)
        if source and target and source != target and target not in SERVER_LAYERS[source]:
            wrong.append(f"{edge.path}:{edge.line}: {edge.source} imports {edge.target}")
    assert not wrong, "server/ imports across its folders:\n" + "\n".join(wrong)
    assert {m for m in graph.modules if m.startswith("server.")} <= {
        m for m in graph.modules if _layer(m)}, "a server module belongs to no layer"


def test_the_graph_covers_the_project(project: Graph) -> None:
    # Guards against a vacuous pass: every package is read, and imports written inside a
    # function count (the CLI imports the server only when `chorus serve` runs).
    graph = project
    for package in PACKAGES:
        assert package in graph.modules
    assert len(graph.modules) > 80
    assert len(graph.edges) > 300
    assert "server.serve" in graph.targets("chorus_py.cli")


# -- the checker, on small packages written for it -----------------------------------------------

def _package(root: Path, files: Mapping[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def test_a_cycle_through_a_function_level_import_is_found(tmp_path: Path) -> None:
    _package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from pkg.b import f\n",
        "pkg/b.py": "def f():\n    from pkg import c\n    return c\n",
        "pkg/c.py": "import pkg.a\n",
        "pkg/d.py": "import pkg.a\n",
    })
    graph = build_graph(tmp_path, ["pkg"])
    assert find_cycles(graph) == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]
    assert report(graph) == [
        "import cycle: pkg.a -> pkg.b -> pkg.c -> pkg.a\n"
        "    pkg/a.py:1: pkg.a imports pkg.b\n"
        "    pkg/b.py:2: pkg.b imports pkg.c\n"
        "    pkg/c.py:1: pkg.c imports pkg.a"]


def test_a_type_checking_import_and_a_relative_import_make_a_cycle(tmp_path: Path) -> None:
    _package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/sub/__init__.py": "",
        "pkg/sub/a.py": "from typing import TYPE_CHECKING\n"
                        "if TYPE_CHECKING:\n    from pkg.b import B\n",
        "pkg/b.py": "from .sub.a import A\n",
    })
    graph = build_graph(tmp_path, ["pkg"])
    assert find_cycles(graph) == [["pkg.b", "pkg.sub.a", "pkg.b"]]


def test_every_module_of_two_tangled_cycles_is_shown(tmp_path: Path) -> None:
    _package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "import pkg.b\nimport pkg.c\n",
        "pkg/b.py": "import pkg.a\n",
        "pkg/c.py": "import pkg.a\n",
        "pkg/d.py": "import pkg.d\n",
    })
    assert find_cycles(build_graph(tmp_path, ["pkg"])) == [
        ["pkg.a", "pkg.b", "pkg.a"], ["pkg.a", "pkg.c", "pkg.a"], ["pkg.d", "pkg.d"]]


def test_a_name_read_back_from_the_package_init_is_a_cycle(tmp_path: Path) -> None:
    # The re-exporting __init__ alone is fine; reading a name from it inside the package is not.
    files = {"pkg/__init__.py": "from pkg.a import A\nfrom pkg.b import B\n",
             "pkg/a.py": "class A: ...\n",
             "pkg/b.py": "from pkg.a import A\nclass B(A): ...\n"}
    _package(tmp_path, files)
    assert find_cycles(build_graph(tmp_path, ["pkg"])) == []
    _package(tmp_path, {"pkg/b.py": "from pkg import A\nclass B(A): ...\n"})
    assert find_cycles(build_graph(tmp_path, ["pkg"])) == [["pkg", "pkg.b", "pkg"]]


def test_private_names_are_found_imported_and_read(tmp_path: Path) -> None:
    _package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "_hidden = 1\n__version__ = '1'\n",
        "pkg/b.py": "from pkg.a import _hidden, __version__\n",
        "pkg/c.py": "import pkg.a\nfrom pkg import a as other\n\n"
                    "def f():\n    return pkg.a._hidden + other._hidden + other.__version__\n",
        "pkg/d.py": "import os\nfrom json import _helper\n\nx = os._exit\n",
    })
    graph = build_graph(tmp_path, ["pkg"])
    assert [str(use) for use in graph.private] == [
        "pkg/b.py:1: pkg.b uses pkg.a._hidden",
        "pkg/c.py:5: pkg.c uses pkg.a._hidden",
        "pkg/c.py:5: pkg.c uses pkg.a._hidden",
        "pkg/d.py:2: pkg.d uses json._helper"]
    assert find_cycles(graph) == []


def test_a_clean_package_passes(tmp_path: Path) -> None:
    _package(tmp_path, {
        "pkg/__init__.py": '"""A package."""\n',
        "pkg/base.py": "import os\n\n_local = os.sep\n\ndef public():\n    return _local\n",
        "pkg/top.py": "from pkg import base\nfrom pkg.base import public\n\n"
                      "def g():\n    import pkg.base\n    return base.public(), public, pkg.base\n",
        "other/__init__.py": "",
        "other/use.py": "import pkg.top\nfrom pkg.base import public\n",
    })
    graph = build_graph(tmp_path, ["pkg", "other"])
    assert report(graph) == []
    assert graph.targets("pkg.top") == ["pkg.base"]
    assert graph.targets("other.use") == ["pkg.base", "pkg.top"]


@pytest.mark.parametrize("argv", [[], ["--edges"]])
def test_the_command_prints_the_cycles(tmp_path: Path, argv: list[str],
                                       capsys: pytest.CaptureFixture[str]) -> None:
    _package(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": "import pkg.b\n",
                        "pkg/b.py": "import pkg.a\n"})
    assert main(["--root", str(tmp_path), "--packages", "pkg", *argv]) == 1
    out = capsys.readouterr().out
    assert "import cycle: pkg.a -> pkg.b -> pkg.a" in out
    assert ("pkg.a -> pkg.b" in out.splitlines()) == bool(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Print the cycles and private names of the import graph; 1 if there are any."""
    parser = argparse.ArgumentParser(prog="python -m tests.test_architecture",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository root")
    parser.add_argument("--packages", nargs="+", default=list(PACKAGES),
                        help="the packages whose modules make the graph")
    parser.add_argument("--edges", action="store_true", help="print every edge too")
    args = parser.parse_args(argv)
    graph = build_graph(args.root, args.packages)
    if args.edges:
        for module in sorted(graph.modules):
            for target in graph.targets(module):
                print(f"{module} -> {target}")
    problems = report(graph)
    for line in problems:
        print(line)
    print(f"{len(graph.modules)} modules, {len(graph.edges)} imports, "
          f"{len(find_cycles(graph))} cycles, {len(graph.private)} private names used")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
