"""A container that gives up GPUs which stay on nvidia restarts (``container_restart: auto``):
Proxmox removes a ``devN`` from a running container only at its next start, and until then it
can still open those GPUs, so verify would find them in it. On the seed host (PVE 8) a spec
giving container 101 two of its eight GPUs plans the restart, and the apply verifies clean."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from gputopo.sim.host import SimHost
from gputopo.sim.kernel import SimKernel
from helpers import applysim
from helpers.cli import run

pytestmark = pytest.mark.slow  # applies on a simulated host


@pytest.fixture
def host():
    base = Path(tempfile.mkdtemp(prefix="gputopo-count2-", dir=applysim.fast_tmp()))
    h = SimHost.create(base / "sim", model="Qwen3-30B-A3B-FP8")  # a model two GPUs hold
    SimKernel(h.paths.root).configure(time_scale=applysim.SCALE)
    yield h
    h.stop()
    applysim.cleanup(base)


def test_two_of_eight_restarts_the_container_and_verifies_clean(host, capsys):
    text = applysim.seed_spec_text(host)
    assert "numa: [0]" in text
    spec = host.dir / "count2.yaml"
    spec.write_text(text.replace("numa: [0]", "count: 2", 1))
    code, out, err = run(capsys, "plan", "--sim", str(host.dir), "--spec", str(spec))
    assert code == 0, out + err
    assert "[stop] stop CT 101" in out and "[start] start CT 101" in out, out
    assert "removals apply at its next restart" not in out, out
    code, out, err = run(capsys, "apply", "--yes", "--sim", str(host.dir), "--spec", str(spec))
    assert code == 0, out + err
    assert "not planned" not in out + err
