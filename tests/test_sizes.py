"""The size gate: no module of gputopo/ over 400 lines, no function over 60, unless listed here.

A module's size is its number of lines; a function's is its lines from ``def`` to its last line
(decorators not counted), nested functions and methods each measured on their own. The lists
below hold what was over a limit when the gate came, each with its size then. They only shrink:
an entry that grew past its listed size fails, and so does one now within the limit (or gone),
to be removed from the list. ``gputopo/errors.py`` is exempt: it is the error catalogue, one
class per error the user can meet, kept in one place on purpose.

To regenerate the lists from the tree as it is (after a split, or a merge):

    python tests/test_sizes.py --print

prints both in this file's format, to paste over the ones below.
"""

from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "gputopo"

MODULE_LIMIT = 400  # lines
FUNCTION_LIMIT = 60  # lines from def to its end

EXEMPT = {"gputopo/errors.py"}  # the error catalogue

# module path -> its lines when listed
ALLOWED_MODULES: dict[str, int] = {}

# path::function -> its lines
ALLOWED_FUNCTIONS: dict[str, int] = {}


def _functions(tree: ast.Module) -> dict[str, int]:
    """{qualified name: lines} of every function of a module, nested ones and methods included
    (``Class.method``, ``outer.inner``); a name defined twice keeps its longest definition."""
    out: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                if not isinstance(child, ast.ClassDef):
                    out[name] = max(out.get(name, 0), child.end_lineno - child.lineno + 1)
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return out


@functools.cache  # both tests read the same tree
def measure(package: Path = PACKAGE) -> tuple[dict[str, int], dict[str, int]]:
    """({module path: lines}, {"module path::qualified name": lines}) of every module under
    ``package``, paths relative to its parent (``gputopo/cli/quick.py``); exempt modules left out."""
    modules: dict[str, int] = {}
    functions: dict[str, int] = {}
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package.parent).as_posix()
        if rel in EXEMPT:
            continue
        text = path.read_text()
        modules[rel] = len(text.splitlines())
        for name, lines in _functions(ast.parse(text, rel)).items():
            functions[f"{rel}::{name}"] = lines
    return modules, functions


def offenders(sizes: dict[str, int], limit: int, allowed: dict[str, int]) -> list[str]:
    """One line for each thing over ``limit`` that ``allowed`` does not list, each listed one
    that grew past its listed size, and each listed one now within the limit or gone."""
    out = []
    for name, lines in sorted(sizes.items()):
        if name not in allowed:
            if lines > limit:
                out.append(f"{name}: {lines} lines, over {limit}: split it by meaning")
        elif lines > allowed[name]:
            out.append(f"{name}: {lines} lines, listed at {allowed[name]}: it grew")
        elif lines <= limit:
            out.append(f"{name}: {lines} lines, within {limit}: remove it from the list")
    out += [f"{name}: gone: remove it from the list" for name in sorted(set(allowed) - set(sizes))]
    return out


def current_lists(package: Path = PACKAGE) -> str:
    """The two lists as the tree stands, in this file's format (``--print``)."""
    modules, functions = measure(package)
    text = []
    for title, sizes, limit in (
        ("ALLOWED_MODULES", modules, MODULE_LIMIT),
        ("ALLOWED_FUNCTIONS", functions, FUNCTION_LIMIT),
    ):
        text.append(f"{title} = {{")
        text += [f'    "{name}": {lines},' for name, lines in sorted(sizes.items()) if lines > limit]
        text.append("}")
    return "\n".join(text)


def _check(sizes: dict[str, int], limit: int, allowed: dict[str, int], what: str) -> None:
    if not PACKAGE.is_dir():
        import pytest

        pytest.skip("not a source checkout: no gputopo/ next to tests/")
    bad = offenders(sizes, limit, allowed)
    assert not bad, f"{what} (regenerate the lists: python tests/test_sizes.py --print):\n" + "\n".join(bad)


def test_no_module_is_over_400_lines_unless_listed():
    _check(measure()[0], MODULE_LIMIT, ALLOWED_MODULES, "module sizes")


def test_no_function_is_over_60_lines_unless_listed():
    _check(measure()[1], FUNCTION_LIMIT, ALLOWED_FUNCTIONS, "function sizes")


def test_the_gate_tells_each_kind_of_offender():
    sizes = {"a.py": 500, "b.py": 450, "c.py": 300, "d.py": 420}
    allowed = {"b.py": 440, "c.py": 410, "d.py": 430, "e.py": 600}
    assert offenders(sizes, 400, allowed) == [
        "a.py: 500 lines, over 400: split it by meaning",
        "b.py: 450 lines, listed at 440: it grew",
        "c.py: 300 lines, within 400: remove it from the list",
        "e.py: gone: remove it from the list",
    ]


def test_functions_are_measured_from_def_to_their_end_each_on_its_own():
    tree = ast.parse(
        "@decorated\ndef f():\n    def inner():\n        pass\n    return 1\n\n\n"
        "class C:\n    def m(self):\n        x = 1\n        return x\n"
    )
    assert _functions(tree) == {"f": 4, "f.inner": 2, "C.m": 3}


if __name__ == "__main__":
    if sys.argv[1:] != ["--print"]:
        sys.exit("usage: python tests/test_sizes.py --print")
    print(current_lists())
