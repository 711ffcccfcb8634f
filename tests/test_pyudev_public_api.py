"""pyudev is used through its public API only: no private module, attribute or libudev handle."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import gputopo

PACKAGE = Path(gputopo.__file__).resolve().parent
# the spellings the issue names, whatever the code around them
PRIVATE_TEXT = re.compile(r"\bpyudev\._|\bctx\._")


def private_uses(source: str) -> list[str]:
    """Where ``source`` reaches into pyudev's internals: an import of a private module of
    pyudev's, a private attribute of a name bound to pyudev or to one of its names (the module,
    a Context through a variable), any ``_libudev``, and the text of :data:`PRIVATE_TEXT`.
    Returns one line per use."""
    tree = ast.parse(source)
    bound: set[str] = set()
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "pyudev":
                    bound.add(a.asname or "pyudev")
                    if any(p.startswith("_") for p in a.name.split(".")):
                        found.append(f"line {node.lineno}: import {a.name}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "pyudev":
            if any(p.startswith("_") for p in node.module.split(".")):
                found.append(f"line {node.lineno}: from {node.module} import ...")
            for a in node.names:
                bound.add(a.asname or a.name)
                if a.name.startswith("_"):
                    found.append(f"line {node.lineno}: from {node.module} import {a.name}")
    # names assigned from a pyudev call or attribute (ctx = pyudev.Context())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(
            isinstance(n, ast.Name) and n.id in bound for n in ast.walk(node.value)
        ):
            bound.update(t.id for t in node.targets if isinstance(t, ast.Name))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            base = node.value
            if node.attr == "_libudev" or (isinstance(base, ast.Name) and base.id in bound):
                found.append(f"line {node.lineno}: .{node.attr}")
    for i, line in enumerate(source.splitlines(), 1):
        if PRIVATE_TEXT.search(line):
            found.append(f"line {i}: {line.strip()}")
    return found


def test_the_checker_finds_what_the_old_name_lookup_did():
    dot_ = "._"  # spelled apart, so that a grep of the tree finds no private use here either
    old = (
        f"import pyudev\nfrom pyudev{dot_}util import udev_list_iterate\n"
        f"ctx = pyudev.Context()\nlib = ctx{dot_}libudev\nhwdb = lib.udev_hwdb_new(ctx)\n"
        f"context = pyudev.Context()\nx = context{dot_}libudev\nimport pyudev as pu\ny = pu{dot_}os\n"
    )
    found = private_uses(old)
    assert sorted({int(f.split(":")[0].split()[1]) for f in found}) == [2, 4, 7, 9], found
    public = "import pyudev\nctx = pyudev.Context()\nd = pyudev.Devices.from_name(ctx, 'pci', a)\n"
    assert private_uses(public) == []


def test_no_private_pyudev_anywhere_in_the_package():
    # only a module that names pyudev or libudev, or holds PRIVATE_TEXT, can reach into pyudev
    texts = {p: p.read_text() for p in sorted(PACKAGE.rglob("*.py"))}
    suspects = {p: t for p, t in texts.items() if "udev" in t or PRIVATE_TEXT.search(t)}
    assert any("import pyudev" in t for t in suspects.values()), "the scan misses the modules using pyudev"
    found = {
        str(p.relative_to(PACKAGE.parent)): uses for p, t in suspects.items() if (uses := private_uses(t))
    }
    assert found == {}


def test_no_private_pyudev_in_the_tests_and_benchmarks_either():
    here = Path(__file__).resolve()
    tests = here.parent  # the checkout's tests/, wherever the package under test is installed
    files = [*sorted(tests.rglob("*.py")), *sorted((tests.parent / "benchmarks").rglob("*.py"))]
    assert here in files
    found = {
        str(p.relative_to(PACKAGE.parent)): uses
        for p in files
        if p != here
        and ("udev" in (t := p.read_text()) or PRIVATE_TEXT.search(t))
        and (uses := private_uses(t))
    }
    assert found == {}
