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


def test_without_a_mapping_naming_it_the_container_and_its_device_node_are_named(host, capsys):
    """No PCI mapping lists the GPU: every GPU left is on nvidia with its minor, so the
    container's /dev/nvidiaN of no GPU is its GPU that left."""
    pci_cfg = host.paths.pve / "mapping/pci.cfg"
    pci_cfg.write_text("")
    spec = host.dir / "spec.yaml"
    spec.write_text(applysim.seed_spec_text(host))
    code, out, err = run(capsys, "sim", "break", "gpu-missing", str(host.dir), "--address", "0000:71:00.0")
    assert code == 0, out + err
    code, out, err = run(capsys, "plan", "--sim", str(host.dir), "--spec", str(spec))
    assert code == 2, out + err
    assert one_line(err) == (
        "gputopo: error: refused: container 101's GPU (/dev/nvidia2) left the bus: no GPU on the host "
        "has that minor any more; check the card and its slot, bring it back "
        "(echo 1 > /sys/bus/pci/rescan, or a reboot), then plan again"
    )


@pytest.mark.slow  # about half a second or more: out of the one-minute loop
def test_a_healthy_host_after_the_split_is_not_refused(host, capsys):
    """GPUs on vfio-pci have no minor: the container's config no longer maps theirs, and nothing
    is said of a bus."""
    spec = host.dir / "spec.yaml"
    spec.write_text(applysim.seed_spec_text(host))
    code, out, err = run(capsys, "apply", "--yes", "--sim", str(host.dir), "--spec", str(spec))
    assert code == 0, out + err
    code, out, err = run(capsys, "plan", "--sim", str(host.dir), "--spec", str(spec))
    assert code == 0 and "left the bus" not in out + err, out + err
