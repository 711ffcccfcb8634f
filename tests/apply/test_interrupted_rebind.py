"""An interrupted rebind never lands on the wrong driver.

Ctrl-C pressed three times while GPU 0000:e1:00.0 moves, at each of its sysfs writes in turn
(``tests/helpers/signaldriver.py`` sends the signals from inside that write and holds it), in both
directions: the split (nvidia -> vfio-pci, the override kept) and the change back (vfio-pci ->
nvidia, the override cleared). The rollback must not begin while the worker moving the GPU still
writes: had it begun, the helper lands the held write between two of the rollback's own (a
cleared override before its probe binds nvidia again: ``expected driver vfio-pci, found
nvidia``). Every run ends ``rolled back`` (exit 130) with each GPU on its driver of before, with
its driver_override of before, and the journal closed; then ``gputopo recover`` finds nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gputopo.apply.journal import find_unfinished
from gputopo.plan.spec import parse_spec
from gputopo.usecases.apply import apply
from helpers import TESTS, applysim
from helpers.applysim import host, template  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow  # an apply in a process of its own per write, seconds each

DRIVER = TESTS / "helpers" / "signaldriver.py"
GPU = "0000:e1:00.0"
# its writes, in order: split: override vfio-pci, unbind nvidia, probe (the override stays);
# back: override nvidia, unbind vfio-pci, probe, override cleared
WRITES = {"split": 3, "back": 4}


def drive(h, spec: Path, at: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "GPUTOPO_INTERRUPT_AT": at}
    cmd = [sys.executable, str(DRIVER), *args, "--sim", str(h.dir)]
    if args[0] == "apply":
        cmd += ["--spec", str(spec), "--yes", "--no-verify", "--timeout", "30"]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.parametrize(
    "direction,write", [(d, n) for d, count in WRITES.items() for n in range(1, count + 1)]
)
def test_ctrl_c_at_each_write_of_a_rebind_rolls_back_to_the_drivers_of_before(host, direction, write):
    # the container restarts: a split that keeps it running leaves a change pending in its config
    text = applysim.restarting(applysim.seed_spec_text(host))
    if direction == "back":
        assert apply(parse_spec(text), host.ports(), root=str(host.paths.root)).status == "applied"
        host.stop()
        text = applysim.reverse(text)
    spec = host.dir / "spec.yaml"
    spec.write_text(text)
    before = applysim.fingerprint(host)
    assert before[f"pci:{GPU}"] == (
        ("nvidia", "(null)\n") if direction == "split" else ("vfio-pci", "vfio-pci\n")
    )

    res = drive(host, spec, f"{GPU}:{write}", "apply")

    assert res.returncode == 130, res.stderr
    assert res.stderr.rstrip().endswith("interrupted (SIGINT); rolled back"), res.stderr
    assert "failed" not in res.stdout, res.stdout
    assert find_unfinished(host.paths.root) is None
    assert applysim.diff(before, applysim.fingerprint(host)) == []
    rec = drive(host, spec, "", "recover")
    assert rec.returncode == 0 and "nothing to recover" in rec.stdout + rec.stderr, rec.stderr
