"""The README's five-minute tour, run as written: each ``$ gputopo`` line of its console block, in
a fresh directory, on the simulated host its first command makes. Each command must exit 0 and
print exactly the lines the README shows under it (after ``| tail -N``: the last N; none shown:
not compared); the picture its plan draws is the README's own (``docs/seed-split.svg``), and the
host ends split as the tour says: four GPUs on nvidia in container 101, four on vfio-pci."""

from __future__ import annotations

import re
import shlex

import pytest

from helpers import REPO
from helpers.cli import run

pytestmark = pytest.mark.slow  # an apply and a verify on a simulated host

README = REPO / "README.md"


def _console() -> str:
    """The console block of the README's 'plan, apply, verify, diff'."""
    text = README.read_text()
    section = text[text.index("### plan, apply, verify, diff\n") :]
    m = re.search(r"```\n(\$ gputopo sim create .*?)```", section, re.S)
    assert m, "no console block in the README's tour"
    return m[1]


def _steps(console: str) -> list[tuple[list[str], int | None, list[str]]]:
    """(argv after 'gputopo', N of a '| tail -N' after it, the lines shown under it) of each
    '$ gputopo' line."""
    steps: list[tuple[list[str], int | None, list[str]]] = []
    for line in console.splitlines():
        if line.startswith("$ "):
            command, _, tail = line[2:].partition(" | tail -")
            argv = shlex.split(command, comments=True)
            assert argv[0] == "gputopo", line
            steps.append((argv[1:], int(tail.split()[0]) if tail else None, []))
        else:
            steps[-1][2].append(line)
    return steps


def test_the_readme_tour_runs_as_written(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # gputopo.yaml and docs/seed-split.svg by the names the README gives
    (tmp_path / "docs").mkdir()
    host_dir = str(tmp_path / "pve1")
    steps = _steps(_console().replace("/tmp/pve1", host_dir))
    commands = [argv[0] for argv, _, _ in steps]
    assert commands[0] == "sim" and {"plan", "init", "apply", "verify", "diff"} <= set(commands)
    for argv, tail, shown in steps:
        code, out, err = run(capsys, *argv)
        assert code == 0, (argv, err)
        if shown:
            assert out.splitlines()[-tail if tail else 0 :] == shown, (argv, out)

    picture = "docs/seed-split.svg"
    assert (tmp_path / picture).read_text() == (REPO / picture).read_text()
    from gputopo.facts.discover import discover

    drivers = sorted(g.driver for g in discover(str(tmp_path / "pve1" / "root")).gpus)
    assert drivers == ["nvidia"] * 4 + ["vfio-pci"] * 4
