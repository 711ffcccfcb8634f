"""A GPU gone from the bus is named first: after ``sim break gpu-missing`` the plan refuses in
one line naming its address, its owner and that it left the bus, and nothing about what follows
from it (a tensor-parallel size of 3). Verify's converged check says the same through the
planner."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from helpers import applysim
from helpers.applysim import template  # noqa: F401 (fixtures)
from helpers.cli import one_line, run

LINE = (
    "gputopo: error: refused: 0000:71:00.0: container 101's GPU (/dev/nvidia2, in mapping pro6000) "
    "left the bus: the host no longer has it; check the card and its slot, bring it back "
    "(echo 1 > /sys/bus/pci/rescan, or a reboot), then plan again"
)


@pytest.fixture
def host(template):
    base = Path(tempfile.mkdtemp(prefix="gputopo-offbus-", dir=applysim.fast_tmp()))
    h = applysim.copy_host(template, base / "sim")
    yield h
    h.stop()
    applysim.cleanup(base)


def test_a_gpu_gone_from_the_bus_is_named_with_its_owner(host, capsys):
    spec = host.dir / "spec.yaml"
    spec.write_text(applysim.seed_spec_text(host))
    code, out, err = run(capsys, "sim", "break", "gpu-missing", str(host.dir), "--address", "0000:71:00.0")
    assert code == 0, out + err
    code, out, err = run(capsys, "plan", "--sim", str(host.dir), "--spec", str(spec))
    assert code == 2, out + err
    assert one_line(err) == LINE
    assert "tensor parallel" not in err
    code, out, err = run(capsys, "verify", "--sim", str(host.dir), "--spec", str(spec), "--json")
    assert code != 0
    assert "left the bus" in out and "tensor parallel 3" not in out
