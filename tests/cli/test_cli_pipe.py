"""A reader that goes away early (``gputopo plan | head -1``): the command stops quietly with
141, as a command killed by SIGPIPE does in a shell; no traceback, no error line, not 1.

Each command runs in its own process with stdout on a real pipe whose reading end is closed
before the command writes: its first write (or its last flush) meets EPIPE, as it does behind
a ``head`` that has read its line."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers.applysim import copy_host, template  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow  # a process per command line


def _behind_closed_pipe(*argv: str) -> subprocess.CompletedProcess:
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the command writes a byte
    try:
        return subprocess.run(
            [sys.executable, "-m", "gputopo", *argv],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write)


@pytest.fixture(scope="module")
def sim(template, tmp_path_factory):
    return copy_host(template, tmp_path_factory.mktemp("pipe") / "sim")


@pytest.mark.parametrize(
    "argv",
    [
        ["plan", "--split", "numa"],
        ["plan", "--split", "numa", "--json"],
        ["topo"],
        ["topo", "--json"],
        ["discover"],
        ["discover", "--json"],  # answered before click loads
        ["--help"],  # the same
        ["schema", "spec"],
        ["diff", "--split", "numa", "--exit-code"],  # a SystemExit(2) whose output is still buffered
    ],
    ids=lambda a: " ".join(a),
)
def test_a_reader_gone_early_ends_the_command_quietly_with_141(sim, argv):
    if argv[0] in ("plan", "diff"):
        argv = [*argv, "--sim", str(sim.dir)]
    elif argv[0] in ("topo", "discover"):
        argv = [*argv, "--root", str(sim.paths.root)]
    p = _behind_closed_pipe(*argv)
    assert p.returncode == 141, p.stderr
    assert "Traceback" not in p.stderr and "rror" not in p.stderr and "Exception" not in p.stderr, p.stderr
