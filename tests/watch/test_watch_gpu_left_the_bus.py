"""Watch after ``sim break gpu-missing``: the planner's refusal is printed once (the ``spec:``
line), the converged check points at it, and the container's stale ``devN`` is named."""

from __future__ import annotations

import pytest

from helpers.applysim import spec_host, template  # noqa: F401 (fixtures)
from helpers.cli import run

pytestmark = pytest.mark.slow  # a simulated host copied and read by the command line


@pytest.fixture
def host(spec_host):
    """A copy of the seed host with its spec in ``DIR/spec.yaml``."""
    return spec_host


def test_watch_prints_the_refusal_once(host, capsys):
    code, out, err = run(capsys, "sim", "break", "gpu-missing", str(host.dir), "--address", "0000:71:00.0")
    assert code == 0, out + err
    code, out, err = run(capsys, "watch", "--sim", str(host.dir), "--spec", str(host.dir / "spec.yaml"))
    assert code == 0, err
    assert out.count("left the bus: the host no longer has it") == 1, out
    lines = out.splitlines()
    assert lines[0].endswith("drift in spec; 2 check(s) failing: converged, container"), out
    assert lines[1].startswith("  spec: refused: 0000:71:00.0: container 101's GPU (/dev/nvidia2"), out
    assert "  check converged: the spec was refused (see spec above)" in lines
    assert any(
        ln.startswith("  check container: CT 101: dev2 /dev/nvidia2 on node pve1 reaches no GPU")
        for ln in lines
    ), out
