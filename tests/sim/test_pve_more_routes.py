"""Routes a real node answers that the simulated one must too, driven over HTTP with proxmoxer
and through pvesh: a VM's pending changes (qemu-server src/PVE/API2/Qemu.pm vm_pending), one HA
resource read and deleted (pve-ha-manager src/PVE/API2/HA/Resources.pm read, delete), an HA
resource's update in the source's order and words (Resources.pm update, src/PVE/HA/Config.pm
update_resources_config), and ``overrule-shutdown`` refused for an HA guest (pve-container
src/PVE/API2/LXC/Status.pm l.268, qemu-server API2/Qemu.pm vm_stop); gputopo's own client
gets the same answers."""

from __future__ import annotations

import pytest
from proxmoxer import ProxmoxAPI
from proxmoxer.core import ResourceException

from gputopo.adapters.proxmox import ApiConfig, ProxmoxClient
from gputopo.errors import ProxmoxError
from gputopo.formats.propstring import sha1_digest
from gputopo.sim import state
from gputopo.sim.pveapi import PveApiServer, PveshSim
from gputopo.sim.pveapi.hacrm import SERVICE_STATES
from helpers.simapi import api_server, seed_root  # noqa: F401 (fixtures)

CT = "arch: amd64\nhostname: llm\nmemory: 4096\nostype: ubuntu\n"
VM = (
    "bios: ovmf\ncores: 4\nmemory: 8192\nname: gpuvm\nonboot: 1\n\n"
    "[PENDING]\ncores: 8\ndelete: onboot,!bios\nballoon: 0\n"
)
RESOURCES = "ct: 101\n\tstate started\n\tmax_restart 2\n\nvm: 201\n\tstate started\n"
RULES = (
    "node-affinity: both\n\tnodes pve1\n\tresources ct:101,vm:201\n\tstrict 1\n\n"
    "node-affinity: alone\n\tnodes pve1\n\tresources vm:201\n"
)


@pytest.fixture
def srv(tmp_path, seed_root):
    s = api_server(tmp_path, seed_root, {("lxc", 101): CT, ("qemu", 201): VM})
    s.version = "9.1.2"
    (tmp_path / "pve/ha").mkdir()
    (tmp_path / "pve/ha/resources.cfg").write_text(RESOURCES)
    (tmp_path / "pve/ha/rules.cfg").write_text(RULES)
    state.set_guest_status(tmp_path / "run", "lxc", 101, "running")
    state.set_guest_status(tmp_path / "run", "qemu", 201, "running")
    s.start()
    yield s
    s.stop()


def _api(s: PveApiServer) -> ProxmoxAPI:
    user, tid = s.root_token_id.split("!")
    return ProxmoxAPI(
        "127.0.0.1",
        port=s.port,
        user=user,
        token_name=tid,
        token_value=s.root_token_secret,
        verify_ssl=str(s.ca_cert_path),
    )


def _refused(call) -> ResourceException:
    with pytest.raises(ResourceException) as e:
        call()
    return e.value


def _gputopo(s: PveApiServer) -> ProxmoxClient:
    cfg = ApiConfig(
        host="127.0.0.1", port=s.port, ca_bundle=str(s.ca_cert_path), timeout=10, poll_interval=0.02
    )
    return ProxmoxClient.from_config(cfg, env={"GPUTOPO_PVE_PASSWORD": s.root_password})


def test_a_vms_pending_changes_as_config_with_pending_array_lists_them(srv):
    digest = sha1_digest(srv.conf_path("qemu", 201).read_text())
    items = _api(srv).nodes("pve1").qemu(201).pending.get()
    assert items == [
        {"key": "bios", "value": "ovmf", "delete": 2},  # "!bios": a forced delete
        {"key": "cores", "value": 4, "pending": 8},
        {"key": "digest", "value": digest},
        {"key": "memory", "value": 8192},
        {"key": "name", "value": "gpuvm"},
        {"key": "onboot", "value": 1, "delete": 1},
        {"key": "balloon", "pending": 0},  # set only pending
    ]
    out, err, rc = PveshSim(srv)(["pvesh", "get", "/nodes/pve1/qemu/201/pending"], 10)
    assert rc == 0 and '"pending":8' in out, err
    e = _refused(lambda: _api(srv).nodes("pve1").qemu(299).pending.get())
    assert e.status_code == 500 and "qemu-server/299.conf' does not exist" in e.content


def test_one_ha_resource_is_read_with_its_own_keys_and_an_unknown_one_dies(srv):
    text = (srv.pve_root / "ha/resources.cfg").read_text()
    got = _api(srv).cluster.ha.resources("ct:101").get()
    assert got == {
        "sid": "ct:101",
        "type": "ct",
        "state": "started",
        "max_restart": 2,
        "digest": sha1_digest(text),
    }
    assert _api(srv).cluster.ha.resources("201").get()["sid"] == "vm:201"  # a bare VMID
    e = _refused(lambda: _api(srv).cluster.ha.resources("ct:555").get())
    assert (e.status_code, e.content) == (500, "no such resource 'ct:555'")
    e = _refused(lambda: _api(srv).cluster.ha.resources("555").get())
    assert "unable to detect SID from VMID - VM/CT 555 does not exist" in e.content
    e = _refused(lambda: _api(srv).cluster.ha.resources("ct:").get())
    assert e.status_code == 400 and e.errors == {"sid": "value does not look like a valid ha resource id"}


def test_deleting_a_resource_purges_it_from_the_rules_and_an_unknown_one_dies(srv):
    e = _refused(lambda: _api(srv).cluster.ha.resources("ct:555").delete())
    assert (e.status_code, e.content) == (500, "cannot delete service 'ct:555', not HA managed!")
    _api(srv).cluster.ha.resources("vm:201").delete()
    assert "vm: 201" not in (srv.pve_root / "ha/resources.cfg").read_text()
    rules = {r["rule"]: r for r in _api(srv).cluster.ha.rules.get()}
    assert set(rules) == {"both"} and rules["both"]["resources"] == "ct:101"  # "alone" had only vm:201
    out, err, rc = PveshSim(srv)(["pvesh", "delete", "/cluster/ha/resources/vm:201"], 10)
    assert (rc, err) == (255, "cannot delete service 'vm:201', not HA managed!\n")


def test_an_update_checks_the_error_state_before_the_digest_and_names_a_missing_resource(srv):
    api = _api(srv)
    e = _refused(lambda: api.cluster.ha.resources("ct:555").put(state="stopped"))
    assert (e.status_code, e.content) == (500, "update resources config failed: no such resource 'ct:555'")
    e = _refused(lambda: api.cluster.ha.resources("ct:101").put(state="stopped", digest="0" * 40))
    assert e.content == (
        "update resources config failed: detected modified configuration - file changed by other user? Try again."
    )
    state.write_state(srv.run_dir, SERVICE_STATES, {"ct:101": "error"})
    # check_service_state runs before update_resources_config takes the lock and compares the digest
    e = _refused(lambda: api.cluster.ha.resources("ct:101").put(state="started", digest="0" * 40))
    assert e.content == "service 'ct:101' in error state, must be disabled and fixed first"
    e = _refused(lambda: api.cluster.ha.resources("ct:101").put(group="nosuch"))
    assert e.content == "invalid parameter 'group': ha groups have been migrated to rules"
    api.cluster.ha.resources("ct:101").put(state="disabled")
    assert "state disabled" in (srv.pve_root / "ha/resources.cfg").read_text()


def test_gputopos_client_gets_the_same_words(srv):
    client = _gputopo(srv)
    with pytest.raises(ProxmoxError, match=r"update resources config failed: no such resource 'ct:555'"):
        client.ha_set_state("ct:555", "started")
    state.write_state(srv.run_dir, SERVICE_STATES, {"ct:101": "error"})
    with pytest.raises(
        ProxmoxError, match=r"service 'ct:101' in error state, must be disabled and fixed first"
    ):
        client.ha_set_state("ct:101", "stopped")


@pytest.mark.parametrize("kind, vmid", [("lxc", 101), ("qemu", 201)])
def test_overrule_shutdown_is_refused_for_an_ha_guest(srv, kind, vmid):
    guest = getattr(_api(srv).nodes("pve1"), kind)(vmid)
    e = _refused(lambda: guest.status.stop.post(**{"overrule-shutdown": 1}))
    assert e.status_code == 400 and e.errors == {"overrule-shutdown": "Not applicable for HA resources."}
    assert state.guest_status(srv.run_dir, kind, vmid) == "running"
    out, err, rc = PveshSim(srv)(
        ["pvesh", "create", f"/nodes/pve1/{kind}/{vmid}/status/stop", "--overrule-shutdown", "1"], 10
    )
    assert rc == 255 and err == (
        "400 Parameter verification failed.\noverrule-shutdown: Not applicable for HA resources.\n"
    )
