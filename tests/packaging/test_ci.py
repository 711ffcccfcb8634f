"""CI runs the README's test command (docs/tests.md explains it), that command runs every test,
and a plain ``pytest`` is the quick loop: it leaves out exactly the markers the full run adds. The
one exception is the crash matrix at every point (``matrix_full``): ``tests/conftest.py`` deselects
it unless ``-m`` names it, and the full run takes the matrix's sample (``matrix``) instead."""

from __future__ import annotations

import itertools
import re
import shlex
import subprocess
import sys
import tomllib

import pytest

from helpers import REPO

LEFT_OUT = {"slow", "e2e", "deb", "matrix"}  # what a plain pytest does not run
APART = {"matrix_full"}  # run only when -m names them (neither the full run nor the loop)


@pytest.fixture
def sources() -> tuple[str, str, dict]:
    if not (REPO / ".ci" / "run").is_file() or not (REPO / "pyproject.toml").is_file():
        pytest.skip("not a source checkout: no .ci/run or pyproject.toml next to tests/")
    pytest_ini = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    return (REPO / ".ci" / "run").read_text(), (REPO / "README.md").read_text(), pytest_ini


def selects(expression: str, marks: set[str], known: set[str]) -> bool:
    """Whether ``-m EXPRESSION`` selects a test carrying ``marks`` (names, not, and, or, parentheses)."""
    words = re.findall(r"[A-Za-z_]\w*|[()]", expression)
    assert set(words) - {"and", "or", "not", "(", ")"} <= known, expression
    return eval(" ".join(words), {"__builtins__": {}}, {m: m in marks for m in known})


def m_option(argv: list[str]) -> str:
    (expr,) = [argv[i + 1] for i, a in enumerate(argv) if a == "-m"]
    return expr


def test_ci_runs_the_readme_test_command(sources):
    ci, readme, _ = sources
    (command,) = [line for line in ci.splitlines() if line.startswith("pip install '.[test]'")]
    assert f"```sh\n{command}\n```" in (REPO / "docs" / "tests.md").read_text()  # the Tests page
    top = readme.split("\n## ", 1)[0]
    assert command in top  # and the first lines of the README


def test_ci_runs_the_readmes_first_command_and_its_tests_in_a_fresh_venv(sources):
    # a newcomer's venv: the machine's site-packages can hide neither a missing dependency nor a
    # start-up import (a site .pth importing typing before gputopo starts)
    ci, readme, _ = sources
    first = readme.split("```sh\n", 1)[1].splitlines()[0].split("#")[0].strip()
    assert first.startswith("pip install '.[sim]'")
    lines = ci.splitlines()
    at = {
        what: next(i for i, line in enumerate(lines) if line.startswith(start))
        for what, start in (
            ("venv", "python3 -m venv "),
            ("activate", ". "),
            ("demo", first),
            ("ruff", "ruff check"),
            ("tests", "pip install '.[test]' && "),
        )
    }
    venv = lines[at["venv"]].split()[-1].strip('"')
    assert lines[at["activate"]].split()[-1].strip('"') == f"{venv}/bin/activate"  # the one made
    assert at["venv"] < at["activate"] < min(at["demo"], at["ruff"], at["tests"])
    assert not [line for line in lines[at["activate"] :] if line.startswith(("deactivate", "python3 "))]


def test_the_full_run_selects_every_test_and_a_plain_pytest_leaves_out_the_slow_ones(sources):
    ci, _, ini = sources
    known = {m.split(":")[0] for m in ini["markers"]}
    assert LEFT_OUT | APART <= known
    (command,) = [line for line in ci.splitlines() if line.startswith("pip install '.[test]'")]
    full = m_option(shlex.split(command.split("&&", 1)[1]))
    loop = m_option(shlex.split(ini["addopts"]))
    for n in range(len(known) + 1):
        for marks in map(set, itertools.combinations(sorted(known), n)):
            if marks & APART:
                assert "matrix_full" not in full and not selects(loop, marks, known), marks
                continue
            assert selects(full, marks, known), marks
            assert selects(loop, marks, known) == (not marks & LEFT_OUT), marks


@pytest.mark.slow
def test_the_full_matrix_is_collected_only_when_m_names_it():
    def collected(expression: str) -> list[str]:
        argv = [sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:randomly", "-m", expression]
        res = subprocess.run(
            [*argv, "tests/apply/test_crash_matrix.py"], cwd=REPO, capture_output=True, text=True
        )
        assert res.returncode == 0, res.stdout + res.stderr
        return [line for line in res.stdout.splitlines() if "::" in line]

    full_run = collected("e2e or not e2e")
    assert full_run and not [t for t in full_run if "test_every_point" in t]
    apart = collected("matrix_full")
    assert apart and all("test_every_point" in t for t in apart)
