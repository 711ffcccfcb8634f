"""HA-managed guests on the simulated API, as pve-container API2/LXC/Status.pm and qemu-server
API2/Qemu.pm hand them to the HA manager (vm_is_ha_managed): a ``hastart``/``hastop`` task that
prints ``Requesting HA ...`` and ends OK before the guest moves, the requested state written to
``ha/resources.cfg`` (by ``ha-manager set`` at once, by the CRM for a stop), status/current's
``ha`` (PVE::HA::Config::get_service_status)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from gputopo.sim import state
from gputopo.sim.pveapi import PveApiServer
from gputopo.sim.pveapi.answers import ApiError
from helpers.simapi import api_server, seed_root  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow  # each test waits out the HA manager's delay (about a second)

CT = "arch: amd64\nhostname: llm\nmemory: 4096\nostype: ubuntu\n"
VM = "memory: 8192\nname: gpuvm\nostype: l26\n"
CRM = 0.6  # the HA manager's delay here: it takes a request after 0.3 s, moves the guest at 0.6 s


@pytest.fixture
def srv(tmp_path, seed_root):
    s = api_server(tmp_path, seed_root, {("lxc", 101): CT, ("lxc", 102): CT, ("qemu", 200): VM})
    (tmp_path / "pve/ha").mkdir()
    (tmp_path / "pve/ha/resources.cfg").write_text("ct: 101\n\tstate started\n\nvm: 200\n\tstate started\n")
    state.set_guest_status(tmp_path / "run", "lxc", 101, "running")
    state.set_guest_status(tmp_path / "run", "lxc", 102, "running")
    state.set_guest_status(tmp_path / "run", "qemu", 200, "running")
    state.write_state(tmp_path / "run", "latencies", {"ha.crm": CRM})
    s.start()
    yield s
    s.stop()


def _call(s: PveApiServer, method: str, path: str, **params):
    return s.dispatch(method, path, params, None).data


def _task(s: PveApiServer, upid: str) -> tuple[dict, list[str]]:
    for _ in range(40):
        st = _call(s, "GET", f"/nodes/pve1/tasks/{upid}/status")
        if st["status"] == "stopped":
            break
        time.sleep(0.02)
    return st, [line["t"] for line in _call(s, "GET", f"/nodes/pve1/tasks/{upid}/log")]


def _resources(s: PveApiServer) -> str:
    return (s.pve_root / "ha/resources.cfg").read_text()


def _status(s: PveApiServer, kind: str, vmid: int) -> dict:
    return _call(s, "GET", f"/nodes/pve1/{kind}/{vmid}/status/current")


def test_status_current_says_which_guests_are_ha_managed(srv):
    assert _status(srv, "lxc", 101)["ha"] == {"managed": 1, "state": "started"}
    assert _status(srv, "qemu", 200)["ha"] == {"managed": 1, "state": "started"}
    assert _status(srv, "lxc", 102)["ha"] == {"managed": 0}
    # Config.pm service_check_ha_state: a resource in state 'ignored' is not managed
    (srv.pve_root / "ha/resources.cfg").write_text("ct: 101\n\tstate ignored\n")
    assert _status(srv, "lxc", 101)["ha"] == {"managed": 0}
    upid = _call(srv, "POST", "/nodes/pve1/lxc/101/status/shutdown")
    assert ":vzshutdown:101:" in upid


def test_a_shutdown_of_an_ha_container_is_a_hastop_task_that_ends_before_the_container_stops(srv):
    t0 = time.monotonic()
    upid = _call(srv, "POST", "/nodes/pve1/lxc/101/status/shutdown", timeout=30)
    assert upid.split(":")[5:7] == ["hastop", "101"]
    st, log = _task(srv, upid)
    ended = time.monotonic() - t0
    assert st["exitstatus"] == "OK" and log == ["Requesting HA stop for CT 101", "TASK OK"]
    # the task is over; the container still runs and the CRM has not taken the command yet
    assert ended < CRM / 2
    assert _status(srv, "lxc", 101)["status"] == "running"
    # the node shows the manager's last round: 'started' until the CRM took the command
    assert _status(srv, "lxc", 101)["ha"]["state"] == "started"
    assert _resources(srv) == "ct: 101\n\tstate started\n\nvm: 200\n\tstate started\n"
    # the CRM takes it (Manager.pm: the requested state becomes 'stopped'), the LRM stops it
    time.sleep(CRM / 2 + 0.1)
    assert _status(srv, "lxc", 101)["ha"]["state"] == "request_stop"
    assert _resources(srv) == "ct: 101\n\tstate stopped\n\nvm: 200\n\tstate started\n\n"
    time.sleep(CRM / 2)
    assert _status(srv, "lxc", 101)["status"] == "stopped"
    assert _status(srv, "lxc", 101)["ha"] == {"managed": 1, "state": "stopped"}


def test_a_start_writes_the_requested_state_at_once_and_the_guest_runs_after_the_delay(srv):
    (srv.pve_root / "ha/resources.cfg").write_text("ct: 101\n\tstate stopped\n")
    state.set_guest_status(srv.run_dir, "lxc", 101, "stopped")
    upid = _call(srv, "POST", "/nodes/pve1/lxc/101/status/start")
    st, log = _task(srv, upid)
    assert ":hastart:101:" in upid and st["exitstatus"] == "OK"
    assert log == ["Requesting HA start for CT 101", "TASK OK"]
    # ha-manager set ct:101 --state started ran in the task; the container is not up yet
    assert _resources(srv) == "ct: 101\n\tstate started\n\n"
    assert _status(srv, "lxc", 101)["status"] == "stopped"
    time.sleep(CRM + 0.1)
    assert _status(srv, "lxc", 101)["status"] == "running"


def test_a_vm_stop_is_a_hastop_too_and_the_running_checks_come_first(srv):
    upid = _call(srv, "POST", "/nodes/pve1/qemu/200/status/stop")
    st, log = _task(srv, upid)
    assert ":hastop:200:" in upid and log == ["Requesting HA stop for VM 200", "TASK OK"]
    assert _status(srv, "qemu", 200)["status"] == "running"
    time.sleep(CRM + 0.1)
    assert _status(srv, "qemu", 200)["status"] == "stopped"
    assert "vm: 200\n\tstate stopped\n" in _resources(srv)
    # Status.pm vm_stop: 'CT 101 not running' is checked before the HA branch
    state.set_guest_status(srv.run_dir, "lxc", 101, "stopped")
    with pytest.raises(ApiError, match="CT 101 not running"):
        _call(srv, "POST", "/nodes/pve1/lxc/101/status/stop")


def test_setting_the_requested_state_back_makes_the_crm_start_the_guest(srv):
    (srv.pve_root / "ha/resources.cfg").write_text("ct: 101\n\tstate stopped\n")
    state.set_guest_status(srv.run_dir, "lxc", 101, "stopped")
    # PUT /cluster/ha/resources/{sid} (API2/HA/Resources.pm update, what 'ha-manager set' calls)
    _call(srv, "PUT", "/cluster/ha/resources/ct:101", state="started")
    assert _resources(srv) == "ct: 101\n\tstate started\n\n"
    assert _status(srv, "lxc", 101)["status"] == "stopped"
    time.sleep(CRM + 0.1)
    assert _status(srv, "lxc", 101)["status"] == "running"


def test_sim_create_makes_the_guests_ha_resources_and_refuses_a_bad_id(tmp_path):
    from click.testing import CliRunner

    from gputopo.cli import cli

    r = CliRunner().invoke(cli, ["sim", "create", str(tmp_path / "h"), "--ha", "ct:101"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "h/pve/ha/resources.cfg").read_text() == "ct: 101\n\tstate started\n\n"

    def create(dest: str, sid: str) -> subprocess.CompletedProcess:
        argv = [sys.executable, "-m", "gputopo", "sim", "create", str(tmp_path / dest), "--ha", sid]
        return subprocess.run(argv, capture_output=True, text=True, timeout=60)

    bad = create("bad", "101")
    assert bad.returncode == 2 and not (tmp_path / "bad").exists()
    assert bad.stderr == "gputopo: error: --ha 101: an HA resource id is ct:<vmid> or vm:<vmid>\n"
    none = create("none", "vm:999")
    assert none.returncode == 2 and not (tmp_path / "none").exists()
    assert len(none.stderr.splitlines()) == 1 and "vm:999: no such guest" in none.stderr
