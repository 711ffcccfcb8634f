"""A program of the node that cannot be started (a directory on PATH this user cannot search,
or a file of that name it cannot execute: ``execvp`` then ends in EACCES, not ENOENT) is one
line naming the program and why, in every adapter that runs one; ``apply --local`` ends in that
line (exit 2, nothing changed), never a traceback."""

from __future__ import annotations

import pytest

from gputopo.adapters.hostcmd import RealHostCommands
from gputopo.adapters.pct import PctExec
from gputopo.adapters.pvesh import run_command
from gputopo.errors import ConfigError, ExecError, HostCommandError
from helpers.cli import one_line, run

WHY = "permission denied (a directory on PATH this user cannot search, or a {p} there it cannot execute); run as root on the Proxmox node"


@pytest.fixture
def unrunnable(tmp_path, monkeypatch):
    """PATH holding only a pvesh and a pct this user may not execute (root included: no x bit)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("pvesh", "pct", "update-initramfs"):
        (bin_dir / tool).write_text("#!/bin/sh\n")
        (bin_dir / tool).chmod(0o644)
    monkeypatch.setenv("PATH", str(bin_dir))
    return bin_dir


def test_each_adapter_says_it_in_one_line(unrunnable):
    with pytest.raises(ConfigError) as e:
        run_command(["pvesh", "get", "/version"], 5)
    assert str(e.value) == "pvesh: " + WHY.format(p="pvesh")
    with pytest.raises(ExecError) as x:
        PctExec().run(101, ["true"], 5)
    assert x.value.rc == 126 and "pct: " + WHY.format(p="pct") in str(x.value)
    with pytest.raises(HostCommandError) as h:
        RealHostCommands().run(["update-initramfs", "-u"], 5)
    assert str(h.value) == "update-initramfs -u: " + WHY.format(p="update-initramfs")


def test_another_os_error_is_named_too():
    def runner(*a, **kw):
        raise OSError(8, "Exec format error")

    with pytest.raises(ExecError) as x:
        PctExec(runner=runner).run(101, ["true"], 5)
    assert "pct: cannot run it: Exec format error" in str(x.value)
    with pytest.raises(HostCommandError) as h:
        RealHostCommands(runner=runner).run(["nvidia-modprobe"], 5)
    assert str(h.value) == "nvidia-modprobe: cannot run it: Exec format error"


@pytest.fixture
def seed(materialized):
    return materialized("seed")


@pytest.fixture
def spec_file(tmp_path, seed):
    from gputopo.facts.discover import discover
    from gputopo.plan.starter import init_spec

    p = tmp_path / "spec.yaml"
    p.write_text(init_spec(discover(str(seed))))
    return p


def test_apply_local_ends_in_one_line(unrunnable, seed, spec_file, capsys):
    code, out, err = run(capsys, "apply", "--local", "--yes", "--root", str(seed), "--spec", str(spec_file))
    assert code == 2, out + err
    line = one_line(err)
    assert WHY.format(p="pvesh") in line and line.endswith("nothing was changed")
