"""``gputopo plan --commands``: what it prints, pasted into a shell on a fresh simulated host,
reaches the host ``gputopo apply`` reaches on another fresh copy, and its undo section brings
the first one back to where it started. How the commands reach the simulator (its pct, qm and
pvesh; the one rewrite, of host paths) is in :mod:`helpers.pasted`."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from helpers import applysim
from helpers.applysim import template  # noqa: F401 (fixtures)
from helpers.cli import run
from helpers.pasted import PastedShell, rewrite, sections


def _hosts(template, n: int):
    base = Path(tempfile.mkdtemp(prefix="gputopo-paste-", dir=applysim.fast_tmp()))
    return base, [applysim.copy_host(template, base / f"sim{i}") for i in range(n)]


def _spec(host, text: str) -> Path:
    p = host.dir / "spec.yaml"
    p.write_text(text)
    return p


@pytest.mark.slow
@pytest.mark.parametrize("restart", [False, True], ids=["live", "restarting"])
def test_pasted_commands_reach_what_apply_reaches_and_their_undo_the_start(template, capsys, restart):
    base, (pasted, applied) = _hosts(template, 2)
    try:
        text = applysim.seed_spec_text(pasted)
        if restart:  # the container stopped and started too (pct shutdown, pct start)
            text = applysim.restarting(text)
        start = applysim.fingerprint(pasted)
        assert applysim.fingerprint(applied) == start

        rc, printed, err = run(
            capsys, "plan", "--spec", str(_spec(pasted, text)), "--sim", str(pasted.dir), "--commands"
        )
        assert rc == 0, err
        forward, undo = sections(printed)
        assert any(c.startswith("echo vfio-pci > /sys/bus/pci/devices/") for c in forward), printed
        assert any(c.startswith("pct set 101 ") for c in forward), printed
        assert ("pct shutdown 101 --timeout 60" in forward) is restart, printed

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
            shell.paste(undo)
        finally:
            shell.close()
        assert applysim.diff(applysim.fingerprint(pasted), start) == []
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
