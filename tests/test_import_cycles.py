"""No import cycle anywhere in ``gputopo/``, inside a layer included (tests/test_layers.py keeps
imports between layers pointing down; this keeps them acyclic within one).

The graph is static (``ast``), one node per module (a package is its ``__init__``), one edge per
``import``/``from ... import`` statement found anywhere in a module: at the top, inside a
function, and under ``if TYPE_CHECKING:``. A function-level import only delays a cycle to the
first call, and a type-only one still makes each module need the other to be read; both are
what moving the shared piece down (or a Protocol in the lower module) removes, so both count.
Relative imports are resolved against the importing module's package; ``from pkg import name``
points at ``pkg.name`` when that is a module, else at ``pkg``. Not edges: the parent packages
Python initialises on the way to a submodule (a package's ``__init__`` importing its own
submodules is not a cycle with them), a module naming itself, and ``importlib.import_module``
with a computed name (the CLI's lazy command table, ``gputopo.sim.cluster``'s lazy names).

Cycles are found with the standard library's :class:`graphlib.TopologicalSorter`, which names
one cycle per :class:`graphlib.CycleError`; each is reported and one of its edges set aside, so
every cycle left shows up in the failure.
"""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

from helpers import REPO, planted_package

PKG = REPO / "gputopo"


def _module_name(path: Path, pkg: Path) -> str:
    parts = list(path.relative_to(pkg.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(level: int, module: str | None, package: str) -> str:
    """The absolute module a ``from`` statement names (``level`` dots, relative to ``package``)."""
    if not level:
        return module or ""
    base = package.split(".")
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def _targets(tree: ast.AST, package: str, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that the statements of ``tree`` import."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                name = alias.name
                while name and name not in modules:  # import a.b.c of a non-module: its module
                    name = name.rpartition(".")[0]
                if name:
                    found.add(name)
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(node.level, node.module, package)
            for alias in node.names:
                if f"{source}.{alias.name}" in modules:
                    found.add(f"{source}.{alias.name}")
                elif source in modules:
                    found.add(source)
    return found


def import_graph(pkg: Path) -> dict[str, set[str]]:
    """Every module under ``pkg`` and the modules under ``pkg`` it imports (see the docstring)."""
    paths = {_module_name(p, pkg): p for p in sorted(pkg.rglob("*.py"))}
    modules = set(paths)
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        graph[name] = _targets(ast.parse(path.read_text()), package, modules) - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Import cycles of ``graph`` (module -> modules it imports), each as ``[a, b, ..., a]``
    where each module imports the next; empty when the graph is acyclic."""
    # TopologicalSorter reads the mapping as node -> predecessors: an edge a -> b (a imports b)
    # makes b come before a, and a CycleError's list runs against the imports.
    left = {m: set(deps) for m, deps in graph.items()}
    found: list[list[str]] = []
    while True:
        try:
            TopologicalSorter(left).prepare()
            return found
        except CycleError as e:
            cycle = list(reversed(e.args[1]))
            found.append(cycle)
            left[cycle[0]].discard(cycle[1])  # set this edge aside and look for the next cycle


def test_no_import_cycle_in_gputopo():
    found = cycles(import_graph(PKG))
    assert not found, "import cycles (each module imports the next):\n" + "\n".join(
        " -> ".join(c) for c in found
    )


def test_the_detector_finds_a_planted_two_module_cycle():
    found = cycles({"gputopo.a": {"gputopo.b"}, "gputopo.b": {"gputopo.a"}, "gputopo.c": {"gputopo.a"}})
    assert len(found) == 1
    assert found[0] in (["gputopo.a", "gputopo.b", "gputopo.a"], ["gputopo.b", "gputopo.a", "gputopo.b"])
    assert (
        cycles({"gputopo.a": {"gputopo.b"}, "gputopo.b": set(), "gputopo.c": {"gputopo.a", "gputopo.b"}})
        == []
    )


def test_the_detector_reports_every_cycle_of_a_graph():
    graph = {"x.a": {"x.b"}, "x.b": {"x.a"}, "x.c": {"x.d"}, "x.d": {"x.e"}, "x.e": {"x.c"}}
    found = cycles(graph)
    assert sorted(sorted(set(c)) for c in found) == [["x.a", "x.b"], ["x.c", "x.d", "x.e"]]
    for c in found:  # each step of a reported cycle is an import of the graph
        assert c[0] == c[-1] and all(b in graph[a] for a, b in zip(c, c[1:]))


def test_the_graph_sees_relative_function_level_and_type_checking_imports(tmp_path):
    pkg = planted_package(
        tmp_path,
        {
            "__init__.py": "__version__ = '1'\n",
            "sim/__init__.py": "from gputopo.sim.host import SimHost\n",
            "sim/host.py": "def start():\n    from .cluster import peers\n",
            "sim/cluster/__init__.py": "",
            "sim/cluster/peers.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                "    from ..host import SimHost\nfrom gputopo import __version__\n"
            ),
            "sim/pveapi/__init__.py": "",
            "sim/pveapi/server.py": "import gputopo.sim.pveapi.http_handler\nimport json\n",
            "sim/pveapi/http_handler.py": "from . import routes\nfrom gputopo.sim.pveapi import server\n",
            "sim/pveapi/routes.py": "from gputopo.sim.pveapi import API_PREFIX\n",
        },
    )
    graph = import_graph(pkg)
    assert graph["gputopo.sim.host"] == {"gputopo.sim.cluster.peers"}  # from .cluster import peers
    assert graph["gputopo.sim.cluster.peers"] == {"gputopo.sim.host", "gputopo"}
    assert graph["gputopo.sim.pveapi.http_handler"] == {
        "gputopo.sim.pveapi.routes",
        "gputopo.sim.pveapi.server",
    }
    assert graph["gputopo.sim.pveapi.routes"] == {"gputopo.sim.pveapi"}  # a name, not a module: its package
    assert graph["gputopo.sim"] == {"gputopo.sim.host"}
    found = {frozenset(c) for c in cycles(graph)}
    assert found == {
        frozenset({"gputopo.sim.host", "gputopo.sim.cluster.peers"}),
        frozenset({"gputopo.sim.pveapi.server", "gputopo.sim.pveapi.http_handler"}),
    }


def test_a_package_importing_its_submodules_is_no_cycle(tmp_path):
    pkg = planted_package(
        tmp_path,
        {
            "__init__.py": "",
            "kernel/__init__.py": "from gputopo.kernel.bind import SimKernel\n",
            "kernel/bind.py": "from . import faults\nfrom gputopo.kernel.faults import Fault\n",
            "kernel/faults.py": "import gputopo.kernel.faults\n",
        },
    )
    graph = import_graph(pkg)
    assert graph["gputopo.kernel.bind"] == {"gputopo.kernel.faults"}
    assert graph["gputopo.kernel.faults"] == set()  # naming itself
    assert cycles(graph) == []
