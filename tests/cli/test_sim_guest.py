"""``gputopo sim guest start|stop|status VMID --sim DIR``: a simulated guest's power through the
simulated host's Proxmox API, as pct/qm would, without curl or a login ticket; refusals in
Proxmox's words, one line, nothing changed."""

from __future__ import annotations

import pytest

from helpers.applysim import copy_host, fingerprint, running_service, template  # noqa: F401 (fixtures)
from helpers.cli import one_line, run

pytestmark = pytest.mark.slow  # each command serves the simulated host's API over HTTPS


@pytest.fixture
def sim(template, tmp_path):
    return copy_host(template, tmp_path / "sim")


def _guest(capsys, sim, *argv):
    return run(capsys, "sim", "guest", *argv, "--sim", str(sim.dir))


def test_status_lists_every_guest_and_stop_then_start_takes_the_service_down_and_up(capsys, sim):
    assert _guest(capsys, sim, "status")[:2] == (0, "CT 101: running\nVM 201: stopped\n")
    assert running_service(sim.paths.root, 101, "sglang.service")[0] is not None

    code, out, err = _guest(capsys, sim, "stop", "101")
    assert (code, out) == (0, "CT 101: stopped\n"), err
    # what runs: the container's service is gone with it, its GPUs held by nobody
    assert running_service(sim.paths.root, 101, "sglang.service") == (None, [])
    assert _guest(capsys, sim, "status", "101")[1] == "CT 101: stopped\n"

    code, out, err = _guest(capsys, sim, "start", "101")
    assert (code, out) == (0, "CT 101: running\n"), err
    cmdline, held = running_service(sim.paths.root, 101, "sglang.service")
    assert cmdline is not None and held


@pytest.mark.parametrize(
    "argv, code, line",
    [
        (["start", "999"], 2, "no such VM ('999')"),
        (["stop", "999"], 2, "no such VM ('999')"),
        (["status", "999"], 2, "no such VM ('999')"),
        (["start", "101"], 2, "CT 101 already running"),
        # qemu-server's start task fails: the mapping the VM names does not exist yet
        (["start", "201"], 1, "PCI device mapping not found for 'pro6000-vm'"),
    ],
)
def test_a_refused_or_failed_start_is_proxmoxs_line_and_changes_nothing(capsys, sim, argv, code, line):
    before = fingerprint(sim)
    got, out, err = _guest(capsys, sim, *argv)
    assert (got, out) == (code, "")
    assert one_line(err) == f"gputopo: error: {line}"
    assert fingerprint(sim) == before


def test_stopping_a_stopped_container_is_refused_as_proxmox_refuses_it(capsys, sim):
    assert _guest(capsys, sim, "stop", "101")[0] == 0
    before = fingerprint(sim)
    code, _, err = _guest(capsys, sim, "stop", "101")
    assert code == 2 and one_line(err) == "gputopo: error: CT 101 not running"
    assert fingerprint(sim) == before


def test_a_directory_without_a_simulated_host_is_one_line(capsys, tmp_path):
    code, _, err = run(capsys, "sim", "guest", "status", "--sim", str(tmp_path / "none"))
    assert code == 2 and "not a simulated host" in one_line(err)
