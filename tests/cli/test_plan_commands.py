"""``gputopo plan --commands``: what it prints, pasted into a shell on a fresh simulated host,
reaches the host ``gputopo apply`` reaches on another fresh copy, and its undo section brings
the first one back to where it started. How the commands reach the simulator (its pct, qm and
pvesh; the one rewrite, of host paths) is in :mod:`helpers.pasted`."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from helpers import applysim
from helpers.applysim import template  # noqa: F401 (fixtures)
from helpers.cli import one_line, run
from helpers.pasted import UNDO_MARK, PastedShell, rewrite, sections


def _hosts(template, n: int):
    base = Path(tempfile.mkdtemp(prefix="gputopo-paste-", dir=applysim.fast_tmp()))
    return base, [applysim.copy_host(template, base / f"sim{i}") for i in range(n)]


def _spec(host, text: str) -> Path:
    p = host.dir / "spec.yaml"
    p.write_text(text)
    return p


VM_CONSUMER = (
    "      consumers:\n        - {vmid: 201, mapping: pro6000-vm, gpus: 4, when_gpus_leave: remove}\n"
)


def with_vm(text: str) -> str:
    """The split with VM 201 consuming the VM mapping: its hostpciN lines, placement, and start."""
    out = text.replace("      guests: []\n", "      guests: []\n" + VM_CONSUMER, 1)
    assert out != text, "the seed spec no longer lists 'guests: []' under vms"
    return out


# scenario -> (the spec planned, from the seed's; whether the split is applied first, how
# commands of the printed script begin)
SCENARIOS = {
    "live": (lambda t: t, False, ["echo vfio-pci > /sys/bus/pci/devices/0000:81:00.0/driver_override"]),
    "restarting": (applysim.restarting, False, ["pct shutdown 101 --timeout 60", "pct start 101"]),
    "vm": (with_vm, False, ["qm set 201 --affinity 64-127,192-255"]),
    "reverse": (applysim.reverse, True, ["echo nvidia > /sys/bus/pci/devices/0000:81:00.0/driver_override"]),
    # the split's VM GPUs lost their /dev/nvidiaN (a reboot, no udev rule makes them): the
    # reverse makes each with nvidia-modprobe once nvidia has the GPU, before pct set
    "reverse-lost-nodes": (applysim.reverse, True, ['[ -e "/dev/nvidia${minor_0000_81_00_0}" ]']),
}
LOST = {"0000:81:00.0": 4, "0000:91:00.0": 5, "0000:e1:00.0": 7, "0000:f1:00.0": 6}  # seed minors


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_pasted_commands_reach_what_apply_reaches_and_their_undo_the_start(template, capsys, name):
    change, split_first, expected = SCENARIOS[name]
    base, (pasted, applied) = _hosts(template, 2)
    try:
        seed = applysim.seed_spec_text(pasted)
        if split_first:
            # both hosts apply the split first, the container restarted so that no removal waits
            # for its next start (an undo could not give that pending state back): the reverse
            # is planned from there
            for h in (pasted, applied):
                rc, out, err = run(
                    capsys,
                    "apply",
                    "--spec",
                    str(_spec(h, applysim.restarting(seed))),
                    "--sim",
                    str(h.dir),
                    "--yes",
                    "--no-verify",
                )
                assert rc == 0, out + err
                if name == "reverse-lost-nodes":
                    for minor in LOST.values():
                        (h.paths.root / f"dev/nvidia{minor}").unlink()
        text = change(seed)
        start = applysim.fingerprint(pasted)
        assert applysim.fingerprint(applied) == start

        rc, printed, err = run(
            capsys, "plan", "--spec", str(_spec(pasted, text)), "--sim", str(pasted.dir), "--commands"
        )
        assert rc == 0, err
        forward, undo = sections(printed)
        for c in expected:
            assert any(f.startswith(c) for f in forward), printed

        rc, out, err = run(
            capsys,
            "apply",
            "--spec",
            str(_spec(applied, text)),
            "--sim",
            str(applied.dir),
            "--yes",
            "--no-verify",
        )
        assert rc == 0, out + err

        shell = PastedShell(pasted.dir, base / "paste")
        try:
            shell.paste(forward)
            assert applysim.diff(applysim.fingerprint(pasted), applysim.fingerprint(applied)) == []
            if name == "reverse-lost-nodes":
                assert [f"nvidia{m}" for m in range(8)] == [
                    n for n in applysim.fingerprint(pasted)["dev/nvidia"] if n[6:].isdigit()
                ]
            shell.paste(undo)
        finally:
            shell.close()
        back = applysim.fingerprint(pasted)
        if name == "reverse-lost-nodes":
            # a node once made stays (the driver never removes one; apply's rollback leaves it too)
            back["dev/nvidia"] = start["dev/nvidia"]
        assert applysim.diff(back, start) == []
    finally:
        pasted.stop()
        applied.stop()
        applysim.cleanup(base)


def test_only_host_paths_outside_here_documents_and_pct_lines_are_rewritten():
    root, staging = Path("/s/root"), Path("/s/stage")
    assert (
        rewrite("echo x > /sys/bus/pci/drivers_probe", root, staging)
        == "echo x > /s/stage/sys/bus/pci/drivers_probe"
    )
    text = "install -D -m 0644 /dev/stdin /etc/a.conf <<'E'\nsee /etc/x and /sys/y\nE"
    assert (
        rewrite(text, root, staging)
        == "install -D -m 0644 /dev/stdin /s/root/etc/a.conf <<'E'\nsee /etc/x and /sys/y\nE"
    )
    assert rewrite("pct exec 101 -- rm -f /etc/x", root, staging) == "pct exec 101 -- rm -f /etc/x"
    assert (
        rewrite("pvesh delete /cluster/mapping/pci/x", root, staging) == "pvesh delete /cluster/mapping/pci/x"
    )
    # a /sys path that is read is the simulated root's (the shell's reads see the kernel's files)
    assert (
        rewrite("cat /sys/bus/pci/devices/x/driver_override >/etc/o", root, staging)
        == "cat /s/root/sys/bus/pci/devices/x/driver_override >/s/root/etc/o"
    )
    assert rewrite("echo 1 >'/sys/bus/pci/rescan'", root, staging) == "echo 1 >'/s/stage/sys/bus/pci/rescan'"


def test_commands_and_json_together_are_refused_in_one_line(template, capsys):
    rc, out, err = run(capsys, "plan", "--sim", str(template), "--split", "numa", "--commands", "--json")
    assert rc == 2 and out == ""
    assert one_line(err) == "gputopo: error: --commands and --json: choose one"


@pytest.mark.slow
def test_sim_shell_runs_the_printed_commands_to_what_apply_reaches(template, capsys):
    """'gputopo sim shell DIR -c' with the steps 'plan --commands' printed, as an operator pastes
    them: the simulated host reaches what 'gputopo apply' reaches on a fresh copy."""
    base, (pasted, applied) = _hosts(template, 2)
    try:
        text = applysim.seed_spec_text(pasted)
        rc, printed, err = run(
            capsys, "plan", "--spec", str(_spec(pasted, text)), "--sim", str(pasted.dir), "--commands"
        )
        assert rc == 0, err
        steps = printed.partition(UNDO_MARK)[0]
        rc, out, err = run(
            capsys,
            "apply",
            "--spec",
            str(_spec(applied, text)),
            "--sim",
            str(applied.dir),
            "--yes",
            "--no-verify",
        )
        assert rc == 0, out + err
        shell = subprocess.run(
            [sys.executable, "-m", "gputopo", "sim", "shell", str(pasted.dir), "-c", steps],
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "SHELL": "/bin/bash"},
        )
        assert shell.returncode == 0, shell.stdout + shell.stderr
        assert applysim.diff(applysim.fingerprint(pasted), applysim.fingerprint(applied)) == []
        assert not list(pasted.paths.run.glob("shell-*"))  # its tools and staging tree go with it
    finally:
        pasted.stop()
        applied.stop()
        applysim.cleanup(base)


@pytest.mark.slow  # about half a second or more: out of the one-minute loop
def test_sim_shell_stops_at_the_first_failing_command_with_its_status(template):
    shell = subprocess.run(
        [sys.executable, "-m", "gputopo", "sim", "shell", str(template), "-c", "echo one\nfalse\necho two\n"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (shell.returncode, shell.stdout) == (1, "one\n")
    assert shell.stderr == "gputopo sim shell: exit 1: false; the commands after it not run\n"
    status = subprocess.run(
        [sys.executable, "-m", "gputopo", "sim", "shell", str(template)],
        input="qm set 999 --affinity 1\necho status $?\ncat /sys/bus/pci/devices/0000:01:00.0/vendor\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert status.returncode == 0
    assert status.stdout.splitlines()[-2:] == ["status 255", "0x10de"]
