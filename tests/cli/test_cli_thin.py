"""The CLI stays thin: a command's module imports no other command's module (what two commands
share lives in a module whose job is options or printing: connect, inputs, output, ...)."""

from __future__ import annotations

import ast
from pathlib import Path

from gputopo.cli import COMMANDS
from helpers import REPO

CLI = REPO / "gputopo" / "cli"
# completion is a command, and its module also holds the completers every option uses
SHARED_TOO = {"complete"}


def _cli_imports(path: Path) -> set[str]:
    """The gputopo.cli modules ``path`` imports (at the top or inside a function)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            name = node.module if not node.level else f"gputopo.cli.{node.module}"
            if name.startswith("gputopo.cli."):
                found.add(name.split(".")[2])
    return found


def test_no_command_module_imports_another():
    commands = {target.split(":")[0] for target in COMMANDS.values()} - SHARED_TOO
    bad = {m: sorted((_cli_imports(CLI / f"{m}.py") & commands) - {m}) for m in sorted(commands)}
    assert not {m: b for m, b in bad.items() if b}, "command modules importing another command's module"


def test_the_rule_sees_an_import_inside_a_function(tmp_path):
    p = tmp_path / "x.py"
    p.write_text("def f():\n    from gputopo.cli.plancmd import planned\n")
    assert _cli_imports(p) == {"plancmd"}


def test_no_cli_module_reads_a_journal():
    """Which apply is unfinished, what its journal says and which node a recover acts on are
    the library's (gputopo.apply.history): no module of the CLI imports the journal."""
    readers = sorted(
        p.name
        for p in CLI.glob("*.py")
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.ImportFrom) and node.module == "gputopo.apply.journal"
    )
    assert readers == []
