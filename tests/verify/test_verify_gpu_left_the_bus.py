"""Verify after ``sim break gpu-missing``: the converged check FAILs with the planner's refusal,
the checks that need a plan say in a few words that it was refused (the refusal is printed
once), and the container check FAILs the ``devN`` that still points at the GPU that left."""

from __future__ import annotations

import json

import pytest

from helpers.applysim import spec_host, template  # noqa: F401 (fixtures)
from helpers.cli import run

pytestmark = pytest.mark.slow  # a simulated host copied and read by the command line

REFUSAL = (
    "the spec was refused: 0000:71:00.0: container 101's GPU (/dev/nvidia2, in mapping pro6000) "
    "left the bus: the host no longer has it; check the card and its slot, bring it back "
    "(echo 1 > /sys/bus/pci/rescan, or a reboot), then plan again"
)
SHORT = "not run: the plan was refused (see converged)"


@pytest.fixture
def host(spec_host):
    """A copy of the seed host with its spec in ``DIR/spec.yaml``."""
    return spec_host


def test_the_refusal_is_said_once_and_the_stale_device_node_fails(host, capsys):
    code, out, err = run(capsys, "sim", "break", "gpu-missing", str(host.dir), "--address", "0000:71:00.0")
    assert code == 0, out + err
    spec = str(host.dir / "spec.yaml")
    code, out, err = run(capsys, "verify", "--sim", str(host.dir), "--spec", spec, "--json")
    assert code == 1, err
    checks = {c["name"]: c for c in json.loads(out)["checks"]}
    assert (checks["converged"]["status"], checks["converged"]["summary"]) == ("FAIL", REFUSAL)
    assert checks["container"]["status"] == "FAIL"
    assert checks["container"]["summary"] == (
        "CT 101: dev2 /dev/nvidia2 on node pve1 reaches no GPU: no GPU on the host has minor 2, "
        "0000:71:00.0 left the bus; bring it back or remove dev2"
    )
    for name in ("vm", "memory", "service", "inference"):
        assert (checks[name]["status"], checks[name]["summary"]) == ("SKIP", SHORT), name
    assert checks["platform"]["summary"].startswith(SHORT)
    assert sum("left the bus" in c["summary"] for c in checks.values()) == 2  # converged, container
    code, out, err = run(capsys, "verify", "--sim", str(host.dir), "--spec", spec)
    assert code == 1 and "echo 1 > /sys/bus/pci/rescan" not in out.split("│ vm ", 1)[1], out
