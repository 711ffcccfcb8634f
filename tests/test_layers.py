"""The layer rule of docs/ARCHITECTURE.md: imports point down only.

A module's layer is its directory under ``gputopo/`` (a top-level module is a layer of its own).
A module may import from its own directory and from layers ranked below its own; nothing else.
Relative imports are resolved against the importing module's package, so ``from ..cli import
x`` is caught like ``from gputopo.cli import x``. A module whose layer is not in :data:`RANK`
fails the test: every new directory must be placed.
"""

from __future__ import annotations

import ast
from pathlib import Path

from helpers import REPO, planted_package

PKG = REPO / "gputopo"

# Lower ranks are imported by higher ones. Equal ranks do not import each other (siblings).
RANK: dict[str, int] = {
    "__init__": 0,  # gputopo/__init__.py: the version only
    "errors": 0,
    "resources": 0,
    "exitcodes": 0,  # the exit codes of every command, one table
    "model": 1,  # facts and current-state data models; documents.py: every versioned JSON document
    "ports": 2,  # the Protocols the edge implements
    "formats": 3,  # Proxmox and nvidia-smi text formats, pure
    "actions": 4,  # one module per action kind: data, describe, preflight, before/do/undo, expect
    "capacity": 4,  # a served model's weights and KV cache per GPU at a tensor-parallel size: pure
    "topo": 4,  # the topology tree, PCIe distance matrix, owners, SVG/DOT pictures: pure
    "plan": 5,  # spec, planner, render, diff: pure
    # discovery and the current state: reads the host through the ports. A sibling of plan, so
    # neither imports the other: reading needs no spec, planning does no I/O
    "facts": 5,
    "adapters": 6,  # the real sysfs, Proxmox API, pvesh, pct, host files, HTTP
    "apply": 7,
    "verify": 7,
    "cluster": 7,  # a cluster: nodes read and applied over SSH, HA placement, cluster verify
    "sim": 8,  # a simulated host behind the ports; may use everything but the CLI
    "watch": 8,  # the drift watch: diff and verify's quick checks as metrics, udev's events
    # the use cases: each thing an operator does, composed over the layers below (observe, plan,
    # apply then verify, the ports a connection builds); the CLI calls one of them per command
    "usecases": 9,
    "cli": 10,
    "__main__": 11,
}


def _module_name(path: Path, pkg: Path) -> str:
    rel = path.relative_to(pkg.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__" and len(parts) > 2:
        parts = parts[:-1]
    return ".".join(parts)


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _imports(path: Path, module: str) -> set[str]:
    """Every gputopo module (or module.name) that ``path`` imports, relative imports resolved."""
    tree = ast.parse(path.read_text())
    package = module if _is_package(path) else module.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                if node.level > 1:
                    base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("gputopo"):
                continue
            found.add(target)
            for alias in node.names:
                found.add(f"{target}.{alias.name}")
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("gputopo"))
    return found


def layer_of(module: str) -> str:
    """The layer of a dotted module name: the part after ``gputopo.`` ('__init__' for the package)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def layer_violations(pkg: Path) -> list[str]:
    """Every import under ``pkg`` that points up or sideways, and every module with no layer."""
    bad: list[str] = []
    for path in sorted(pkg.rglob("*.py")):
        me = _module_name(path, pkg)
        mine = layer_of(me) if me != pkg.name or path.stem != "__init__" else "__init__"
        if mine not in RANK:
            bad.append(f"{me}: not placed in a layer (add {mine!r} to RANK in tests/test_layers.py)")
            continue
        for imp in sorted(_imports(path, me)):
            theirs = layer_of(imp)
            if theirs == mine:
                continue
            if theirs not in RANK:
                # 'from gputopo import __version__' names an attribute of the package
                if imp.count(".") == 1 and (pkg / "__init__.py").is_file() and theirs.startswith("__"):
                    continue
                bad.append(f"{me} imports {imp}, whose layer {theirs!r} is not placed")
            elif RANK[theirs] >= RANK[mine]:
                bad.append(f"{me} ({mine}) imports {imp} ({theirs})")
    return bad


def test_imports_point_down():
    bad = layer_violations(PKG)
    assert not bad, "imports that point up or sideways, or unplaced modules:\n" + "\n".join(bad)


def test_the_rule_catches_an_upward_relative_import(tmp_path):
    pkg = planted_package(
        tmp_path,
        {
            "__init__.py": "",
            "plan/__init__.py": "",
            "plan/planner.py": "from ..cli import main\nfrom . import sibling\n",
            "plan/sibling.py": "from ..model.facts import Facts\n",
            "model/facts.py": "",
            "cli/__init__.py": "",
        },
    )
    bad = layer_violations(pkg)
    assert bad == [
        "gputopo.plan.planner (plan) imports gputopo.cli (cli)",
        "gputopo.plan.planner (plan) imports gputopo.cli.main (cli)",
    ]


def test_the_rule_catches_a_sideways_import_and_an_unplaced_module(tmp_path):
    pkg = planted_package(
        tmp_path,
        {
            "__init__.py": "",
            "apply/run.py": "from gputopo.verify.checks import verify\n",
            "verify/checks.py": "",
            "gadgets/thing.py": "from gputopo.errors import GputopoError\n",
        },
    )
    bad = layer_violations(pkg)
    assert "gputopo.apply.run (apply) imports gputopo.verify.checks (verify)" in bad
    assert any(b.startswith("gputopo.gadgets.thing: not placed in a layer") for b in bad)


def test_the_rule_accepts_downward_imports(tmp_path):
    pkg = planted_package(
        tmp_path,
        {
            "__init__.py": "__version__ = '1'\n",
            "cli/main.py": "from gputopo import __version__\nfrom ..apply import run\nfrom gputopo.sim import host\n",
            "apply/run.py": "from ..plan.planner import plan\nfrom . import journal\n",
            "apply/journal.py": "",
            "plan/planner.py": "from gputopo.errors import PlanRefused\n",
            "errors.py": "",
        },
    )
    assert layer_violations(pkg) == []


def test_reading_the_host_does_not_import_planning(tmp_path):
    pkg = planted_package(
        tmp_path,
        {
            "__init__.py": "",
            "facts/current.py": "from gputopo.plan.select import pick_node\n",
            "plan/select.py": "from ..facts import discover\n",
            "facts/discover.py": "from gputopo.model.facts import Facts\nfrom gputopo.formats.nvsmi import parse\n",
        },
    )
    bad = layer_violations(pkg)
    assert "gputopo.facts.current (facts) imports gputopo.plan.select (plan)" in bad
    assert "gputopo.plan.select (plan) imports gputopo.facts (facts)" in bad
    assert not [b for b in bad if b.startswith("gputopo.facts.discover")]
