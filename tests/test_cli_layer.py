"""The CLI is thin: a command parses its options, makes one call to a use case
(``gputopo.usecases``) and prints what comes back. So a module under ``gputopo/cli/`` imports
only the CLI itself, the use cases, the data models, the errors, the exit codes and the shipped
resources; reading a host, planning, applying, verifying, the adapters and the cluster are
reached through a use case. Every import counts: at the top, inside a function and under
``if TYPE_CHECKING:``.
"""

from __future__ import annotations

import ast
from pathlib import Path

from helpers import REPO, planted_package

CLI = REPO / "gputopo" / "cli"

#: what any CLI module may import
ALLOWED = (
    "gputopo.cli",
    "gputopo.usecases",
    "gputopo.model",
    "gputopo.errors",
    "gputopo.exitcodes",
    "gputopo.resources",
)

#: narrow exceptions, each with why: a module -> the modules (or packages) it may import besides
EXCEPTIONS: dict[str, tuple[str, ...]] = {
    # the topology pictures and the tree printer are drawn from a TopoReport by gputopo.topo's
    # pure functions (no I/O): printing, not reading a host
    "topocmd.py": ("gputopo.topo",),
    "topoview.py": ("gputopo.topo",),
    # the simulator's own commands (sim create, serve, break, heal, cluster-ssh) work on the
    # simulator itself, not on a host through a use case
    **{
        f"{name}.py": ("gputopo.sim",)
        for name in ("simcmd", "simserve", "simguest", "simcluster", "simfaults", "simshell")
    },
    # discover --json is answered before click loads, importing as little as possible: the
    # start-up path reads the root with discovery itself (gputopo.cli.quick)
    "quick.py": ("gputopo.facts.discover", "gputopo.facts.snapshot"),
    # the package itself, for its __version__
    "commands.py": ("gputopo",),
}

#: the cluster commands move onto their own use cases (usecases/cluster_*.py): checked by
#: test_the_cluster_commands_reach_the_cluster_through_use_cases until then
CLUSTER = "clustercmd.py"

#: never imported by a CLI module, exceptions or not (the layers a use case composes)
FORBIDDEN = (
    "gputopo.apply",
    "gputopo.verify",
    "gputopo.plan",
    "gputopo.facts",
    "gputopo.adapters",
    "gputopo.actions",
    "gputopo.cluster",
    "gputopo.watch",
)


def _imports(path: Path) -> set[str]:
    """Every gputopo module ``path`` imports, relative imports resolved against gputopo.cli."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:  # from . import x (gputopo.cli), from .. import x (gputopo)
                base = ["gputopo", "cli"][: 3 - node.level]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if name == "gputopo":
                found.update(f"gputopo.{a.name}" for a in node.names)
            elif name.startswith("gputopo"):
                found.add(name)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("gputopo"))
    return found


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def violations(cli: Path, only: str | None = None) -> list[str]:
    """Every import of a module under ``cli`` (or of ``only`` there) that the rule refuses: one
    not allowed, or one of :data:`FORBIDDEN` that no exception names exactly."""
    bad = []
    for path in sorted(cli.glob("*.py")):
        if only is not None and path.name != only:
            continue
        excepted = EXCEPTIONS.get(path.name, ())
        for name in sorted(_imports(path)):
            if name == "gputopo.__version__" or _under(name, excepted):
                continue
            if _under(name, FORBIDDEN) or not _under(name, ALLOWED):
                bad.append(f"cli/{path.name} imports {name}")
    return bad


def test_cli_modules_import_only_the_use_cases_and_the_models():
    bad = [b for b in violations(CLI) if not b.startswith(f"cli/{CLUSTER} ")]
    assert not bad, "CLI modules reaching past the use cases:\n" + "\n".join(bad)


def test_the_cluster_commands_reach_the_cluster_through_use_cases():
    bad = violations(CLI, only=CLUSTER)
    assert not bad, "the cluster commands reaching past the use cases:\n" + "\n".join(bad)


def test_the_rule_refuses_each_layer_a_use_case_composes(tmp_path):
    files = {"__init__.py": "", "cli/__init__.py": ""}
    for i, layer in enumerate(FORBIDDEN):
        files[f"cli/c{i}.py"] = f"def f():\n    from {layer}.x import y\n"
    files["cli/ok.py"] = (
        "from gputopo.usecases.plan import plan\nfrom gputopo.model.facts import Facts\n"
        "from gputopo.errors import GputopoError\nfrom . import output\n"
    )
    files["cli/sim_elsewhere.py"] = "from gputopo.sim.host import SimHost\n"
    files["cli/topocmd.py"] = "from gputopo.topo.svg import render_svg\nfrom gputopo.facts import observe\n"
    pkg = planted_package(tmp_path, files)
    bad = violations(pkg / "cli")
    for i, layer in enumerate(FORBIDDEN):
        assert f"cli/c{i}.py imports {layer}.x" in bad
    assert "cli/sim_elsewhere.py imports gputopo.sim.host" in bad
    assert "cli/topocmd.py imports gputopo.facts" in bad
    assert not [b for b in bad if b.startswith("cli/ok.py")]
    assert not [b for b in bad if "render_svg" in b or "gputopo.topo.svg" in b]
