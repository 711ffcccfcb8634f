"""The README's main command and the plan/diff story on the simulated seed host."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from gputopo.cli import main

pytestmark = pytest.mark.slow  # the whole demo runs twice (seconds each); the full run only

SEED_LINES = [
    "0, 00000000:01:00.0, 79043 MiB, 97887 MiB, 0 %",
    "1, 00000000:11:00.0, 78369 MiB, 97887 MiB, 0 %",
    "2, 00000000:61:00.0, 78369 MiB, 97887 MiB, 0 %",
    "3, 00000000:71:00.0, 78193 MiB, 97887 MiB, 0 %",
]


def test_demo_ends_split_verified_and_converged(tmp_path: Path):
    run = subprocess.run(
        [sys.executable, "-m", "gputopo", "demo", "--dir", str(tmp_path / "d"), "--pace", "0.01"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    out = run.stdout
    # the container kept running: the four GPUs it gave away stay in it until its next restart
    assert "all clear: 8 PASS, 1 WARN (container)" in out
    assert re.search(r"│ container\s+│ WARN\s+│ CT 101: dev4 \(/dev/nvidia4\), dev5", out), out
    for line in SEED_LINES:  # the operator's own nvidia-smi lines, from inside the container
        assert line in out
    # VM 201 runs on the four GPUs of NUMA node 1, pinned there; its guest's nvidia-smi lists them
    guest = out.split("inside VM 201 (QEMU guest agent):", 1)[1].split("a second plan")[0]
    assert len([ln for ln in guest.splitlines() if "RTX PRO 6000 Blackwell" in ln]) == 4, guest
    assert re.search(r"│ guest\s+│ PASS\s+│ VM 201: the guest's nvidia-smi lists its 4 GPU\(s\)", out), out
    # pinned to NUMA node 1: the CPUs its QEMU process may run on, as the kernel shows them
    root = tmp_path / "d/sim/root"
    pid = (root / "run/qemu-server/201.pid").read_text().strip()
    assert "Cpus_allowed_list:\t64-127,192-255\n" in (root / "proc" / pid / "status").read_text()
    conf = (tmp_path / "d/sim/pve/nodes/pve1/qemu-server/201.conf").read_text()
    assert [ln for ln in conf.splitlines() if ln.startswith("hostpci")] == [
        f"hostpci{i}: mapping=pro6000-vm,pcie=1" for i in range(4)
    ]
    assert "affinity: 64-127,192-255\n" in conf
    assert "a second plan: No changes" in out
    # the state of the design notes: the mapping split and --tp 4
    pci = (tmp_path / "d/sim/pve/mapping/pci.cfg").read_text()
    assert "pro6000-vm\n" in pci and "path=0000:81:00.0" in pci.split("pro6000-vm\n")[1]
    dropin = tmp_path / "d/sim/ct/101/rootfs/etc/systemd/system/sglang.service.d/gputopo.conf"
    assert "--tp 4" in dropin.read_text()


def _cli(args, capsys):
    """Run the CLI in-process; (exit code, captured output). A normal return is exit 0."""
    try:
        main(args)
        code = 0
    except SystemExit as e:
        code = e.code or 0
    return code, capsys.readouterr()


def test_diff_exit_code_before_and_after_apply(tmp_path: Path, capsys):
    """diff --exit-code: 2 while the host differs from the spec, 0 once apply made it match."""
    from gputopo.sim.host import SimHost

    SimHost.create(tmp_path / "sim")
    sim = str(tmp_path / "sim")
    spec = tmp_path / "spec.yaml"
    assert main(["init", "--root", f"{sim}/root", "--container-mapping", "pro6000", "-o", str(spec)]) is None
    code, out = _cli(["diff", "--sim", sim, "--spec", str(spec), "--exit-code"], capsys)
    assert code == 2, out.err
    assert "0000:81:00.0: nvidia -> vfio-pci" in out.out
    code, out = _cli(["apply", "--sim", sim, "--spec", str(spec), "--yes"], capsys)
    assert code == 0, out.out + out.err
    assert "all clear" in out.out
    code, out = _cli(["diff", "--sim", sim, "--spec", str(spec), "--exit-code"], capsys)
    assert code == 0, out.out + out.err
