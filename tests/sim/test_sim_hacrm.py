"""The simulated HA manager's own will, as pve-ha-manager's CRM and LRM have it: it starts a
resource requested ``started`` whose guest is stopped without any request (Manager.pm
l.1014-1026, l.1320-1324), retries a failed start (LRM.pm l.857-903, Manager.pm l.1468-1497,
l.1550-1558) before ``error``, shuts an HA container down without force (PVECT.pm l.85-105) and
leaves one that outlasts its timeout running in ``error`` (Manager.pm l.1199-1217), and shows
the state of its last round (Config.pm get_service_status)."""

from __future__ import annotations

import time

import pytest

from gputopo.sim import state
from gputopo.sim.pveapi import PveApiServer
from gputopo.sim.pveapi.answers import ApiError
from helpers.simapi import api_server, seed_root  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow  # each test waits out some of the HA manager's rounds

CT = "arch: amd64\nhostname: llm\nmemory: 4096\nostype: ubuntu\n"
VM = "memory: 8192\nname: gpuvm\nostype: l26\n"
CRM = 0.6  # takes a request after 0.3 s, moves the guest at 0.6 s


@pytest.fixture
def srv(tmp_path, seed_root):
    s = api_server(tmp_path, seed_root, {("lxc", 101): CT, ("qemu", 200): VM})
    (tmp_path / "pve/ha").mkdir()
    (tmp_path / "pve/ha/resources.cfg").write_text("ct: 101\n\tstate started\n\n")
    state.set_guest_status(tmp_path / "run", "lxc", 101, "running")
    state.write_state(tmp_path / "run", "latencies", {"ha.crm": CRM})
    s.start()
    yield s
    s.stop()


def _call(s: PveApiServer, method: str, path: str, **params):
    return s.dispatch(method, path, params, None).data


def _ha(s: PveApiServer, kind: str, vmid: int) -> dict:
    return _call(s, "GET", f"/nodes/pve1/{kind}/{vmid}/status/current")["ha"]


def _until(pred, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


def test_a_guest_requested_started_is_started_by_the_manager_without_any_request(srv):
    # the container went down by itself (or was stopped behind the manager's back)
    state.set_guest_status(srv.run_dir, "lxc", 101, "stopped")
    _ha(srv, "lxc", 101)  # one read; from here on nobody asks anything
    assert _until(lambda: state.guest_status(srv.run_dir, "lxc", 101) == "running", 3 * CRM)


def test_a_new_resource_has_no_state_until_the_manager_added_it_and_is_then_started(srv):
    _ha(srv, "lxc", 101)  # the manager's first round knows ct:101
    _call(srv, "POST", "/cluster/ha/resources", sid="vm:200")
    assert _ha(srv, "qemu", 200) == {"managed": 1, "state": None}
    # requested 'started' (the schema's default) on a stopped VM: the manager starts it alone
    assert _until(lambda: state.guest_status(srv.run_dir, "qemu", 200) == "running", 3 * CRM)
    assert _ha(srv, "qemu", 200) == {"managed": 1, "state": "started"}


def test_a_start_asked_away_before_the_lrm_ran_is_not_carried_out(srv):
    (srv.pve_root / "ha/resources.cfg").write_text("ct: 101\n\tstate started\n\nvm: 200\n\tstate stopped\n\n")
    _call(srv, "POST", "/nodes/pve1/qemu/200/status/start")  # a hastart: 'started' written
    time.sleep(0.1)
    _call(srv, "PUT", "/cluster/ha/resources/vm:200", state="stopped")
    time.sleep(2 * CRM)
    assert state.guest_status(srv.run_dir, "qemu", 200) == "stopped"
    assert _ha(srv, "qemu", 200) == {"managed": 1, "state": "stopped"}


def test_a_failed_start_is_retried_then_error(srv):
    """max_restart 1 and max_relocate 1 (the defaults): on one node 4 starts, then error."""
    tries = []
    start = srv._start_guest

    def failing(kind, vmid, log):
        tries.append(vmid)
        raise RuntimeError("startup for container '101' failed")

    srv._start_guest = failing
    try:
        state.set_guest_status(srv.run_dir, "lxc", 101, "stopped")
        assert _until(lambda: _ha(srv, "lxc", 101)["state"] == "error", 8 * CRM)
    finally:
        srv._start_guest = start
    assert tries == [101] * 4
    # in error the manager starts nothing more, and refuses to be asked
    time.sleep(2 * CRM)
    assert tries == [101] * 4 and state.guest_status(srv.run_dir, "lxc", 101) == "stopped"
    with pytest.raises(ApiError, match="service 'ct:101' in error state, must be disabled and fixed first"):
        _call(srv, "PUT", "/cluster/ha/resources/ct:101", state="started")


def test_an_ha_container_outlasting_its_shutdown_keeps_running_in_error(srv):
    # one of Proxmox's seconds lasts 10 ms: the container needs 2 s, more than 2 x 60 + 5 of them
    state.write_state(srv.run_dir, "latencies", {"ha.crm": CRM, "second": 0.01, "vzshutdown:101": 2.0})
    # forceStop is not passed on to the HA manager (pve-container Status.pm l.364-375)
    upid = _call(srv, "POST", "/nodes/pve1/lxc/101/status/shutdown", timeout=60, forceStop=1)
    assert ":hastop:101:" in upid
    assert _until(lambda: _ha(srv, "lxc", 101)["state"] == "error", 4 * CRM)
    assert state.guest_status(srv.run_dir, "lxc", 101) == "running"
    assert (srv.pve_root / "ha/resources.cfg").read_text() == "ct: 101\n\tstate stopped\n\n"
    with pytest.raises(ApiError, match="service 'ct:101' in error state, must be disabled and fixed first"):
        _call(srv, "PUT", "/cluster/ha/resources/ct:101", state="started")


def test_the_state_is_the_last_rounds_until_the_manager_takes_a_stop(srv):
    _ha(srv, "lxc", 101)
    upid = _call(srv, "POST", "/nodes/pve1/lxc/101/status/stop")
    status = f"/nodes/pve1/tasks/{upid}/status"
    assert _until(lambda: _call(srv, "GET", status)["status"] == "stopped", CRM / 4)  # 'stop' queued
    assert _ha(srv, "lxc", 101)["state"] == "started"  # not taken yet
    assert _until(lambda: _ha(srv, "lxc", 101)["state"] == "request_stop", CRM)
    assert _until(lambda: _ha(srv, "lxc", 101)["state"] == "stopped", 2 * CRM)
