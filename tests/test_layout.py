"""The tests are laid out like the package and share code only through ``tests/helpers``."""

from __future__ import annotations

import ast

from helpers import REPO, TESTS

# folders of tests/ that are not a layer of gputopo/: the install and CI, the real-kernel tests,
# the shared code, the golden files
OWN = {"packaging", "e2e", "helpers", "golden"}


def _imported(path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names}
    return names


def _test_imports(root) -> list[str]:
    """``<file> imports <module>`` for each import of a test module under ``root``."""
    return [
        f"{p.relative_to(root)} imports {name}"
        for p in sorted(root.rglob("*.py"))
        for name in sorted(_imported(p))
        if any(part.startswith("test_") for part in name.split("."))
    ]


def test_no_test_module_imports_another():
    assert len(list(TESTS.rglob("test_*.py"))) > 50  # the scan reads the real tree
    bad = _test_imports(TESTS)
    assert not bad, "shared code belongs in tests/helpers:\n" + "\n".join(bad)


def test_the_scan_sees_a_test_module_imported(tmp_path):
    (tmp_path / "plan").mkdir()
    (tmp_path / "plan" / "test_a.py").write_text("from test_b import run\nimport helpers.cli\n")
    (tmp_path / "test_c.py").write_text("def f():\n    import plan.test_a\n")
    assert _test_imports(tmp_path) == [
        "plan/test_a.py imports test_b",
        "plan/test_a.py imports test_b.run",
        "test_c.py imports plan.test_a",
    ]


def test_no_two_test_modules_share_a_name():
    """Without packages, pytest imports a test module by its basename: two test_x.py in different
    folders would collide."""
    names = [p.name for p in TESTS.rglob("test_*.py")]
    assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})


def test_each_test_folder_is_a_layer_of_the_package():
    layers = {p.name for p in (REPO / "gputopo").iterdir() if (p / "__init__.py").is_file()}
    folders = {p.relative_to(TESTS).parts[0] for p in TESTS.rglob("test_*.py") if p.parent != TESTS}
    assert folders <= layers | OWN, sorted(folders - layers - OWN)


def test_test_folders_are_not_packages():
    """No __init__.py outside helpers/: a package would put the checkout's root on sys.path, so the
    tests would import gputopo from the source tree instead of the installed package."""
    inits = [str(p.relative_to(TESTS)) for p in TESTS.rglob("__init__.py") if p.parent.name != "helpers"]
    assert not inits, inits
