"""The simulated node's pct, qm and pvesh as commands on PATH (:mod:`gputopo.sim.nodecli`): the
real tools' syntax, their failures as they exit (a failed task non-zero, its message on stderr)."""

from __future__ import annotations

import os
import subprocess

import pytest

from gputopo.sim import state
from gputopo.sim.nodecli import install_tools
from helpers.applysim import host, template  # noqa: F401 (fixtures)


@pytest.fixture
def sh(host, tmp_path):
    tools = install_tools(tmp_path / "bin", host.dir)
    env = dict(os.environ, PATH=f"{tools}:{os.environ['PATH']}")

    def run(cmd: str) -> tuple[int, str, str]:
        res = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, env=env, timeout=120)
        return res.returncode, res.stdout, res.stderr

    return run


@pytest.mark.slow
def test_guest_commands_change_the_guest_and_fail_as_the_tools_do(sh, host):
    assert sh("pct start 101")[0::2] == (255, "CT 101 already running\n")
    assert sh("pct shutdown 101 --timeout 60")[0] == 0
    assert state.read_state(host.paths.run, "guests", {})["lxc"]["101"] == "stopped"
    assert sh("pct exec 101 -- true")[0::2] == (255, "container '101' not running!\n")
    assert sh("pct start 101")[0] == 0
    assert sh("pct exec 101 -- systemctl is-active sglang.service")[:2] == (0, "active\n")
    # VM 201 names a mapping nobody made yet: its start task fails, and qm says so
    rc, _, err = sh("qm start 201")
    assert rc == 255 and "pro6000-vm" in err


@pytest.mark.slow
def test_options_are_checked_as_the_api_checks_them(sh, host):
    conf = host.paths.lxc_conf(101).read_text()
    rc, _, err = sh("qm set 201 --bogus 1")
    assert rc == 255 and err.startswith("Unknown option: bogus")
    assert sh("pct frob 101")[0::2] == (255, "USAGE: pct <COMMAND> [ARGS] [OPTIONS]\n")
    assert host.paths.lxc_conf(101).read_text() == conf
    rc, out, _ = sh("pct set 101 --delete dev7 && pvesh get /nodes/pve1/lxc/101/config")
    assert rc == 0 and '"dev6"' in out and '"dev7"' not in out
