"""ProxmoxClient against the simulated PVE API (real HTTPS on loopback) and a simulated pvesh."""

import os

import pytest

from gputopo.adapters.credentials import ApiConfig, read_secret_file
from gputopo.adapters.proxmox import ProxmoxClient
from gputopo.errors import ConfigError, LoginFailed, ProxmoxError, TaskFailed
from gputopo.formats.lxcconf import parse_lxc_conf
from gputopo.formats.pcicfg import parse_pci_cfg
from gputopo.ports import ProxmoxPort
from gputopo.sim import state
from gputopo.sim.pveapi import PveshSim
from helpers.simapi import api_server, seed_root  # noqa: F401 (fixtures)

CT = "arch: amd64\nhostname: llm\nmemory: 4096\ndev0: /dev/nvidia0,gid=44,mode=0666\n"
M81 = "id=10de:2bb5,iommugroup={g},node=pve1,path=0000:81:00.0,subsystem-id=10de:204e"


@pytest.fixture
def srv(tmp_path, seed_root):
    s = api_server(tmp_path, seed_root, {("lxc", 101): CT, ("qemu", 200): "name: gpuvm\nmemory: 8192\n"})
    s.start()
    yield s
    s.stop()


def _cfg(s, **kw):
    return ApiConfig(
        host="127.0.0.1", port=s.port, ca_bundle=str(s.ca_cert_path), timeout=10, poll_interval=0.02, **kw
    )


def _root(s):
    return ProxmoxClient.from_config(_cfg(s), env={"GPUTOPO_PVE_PASSWORD": s.root_password})


def _token(s):
    return ProxmoxClient.from_config(
        _cfg(s), env={"GPUTOPO_PVE_TOKEN": f"{s.root_token_id}={s.root_token_secret}"}
    )


def _group(root, addr):
    return int((root / "sys/bus/pci/devices" / addr / "iommu_group").readlink().name)


def test_client_is_a_port_and_identity(srv):
    c = _token(srv)
    assert isinstance(c, ProxmoxPort)
    assert c.identity() == "root@pam!gputopo"
    assert _root(srv).identity() == "root@pam"
    assert c.version()["version"] == "8.4.1"


def test_can_change_devices(srv):
    ok, why = _token(srv).can_change_devices()
    assert not ok and "GPUTOPO_PVE_PASSWORD" in why and "local" in why
    assert _root(srv).can_change_devices()[0]
    ops = ProxmoxClient.from_config(
        _cfg(srv, user="ops@pve"), env={"GPUTOPO_PVE_PASSWORD": srv.operator_password}
    )
    assert ops.can_change_devices()[0] is False


def test_secret_never_shown(srv):
    c = _token(srv)
    assert srv.root_token_secret not in repr(c) and srv.root_token_secret not in str(c)
    with pytest.raises(ProxmoxError) as ei:
        c.lxc_update(101, {"dev1": "/dev/nvidia1"}, [], "")
    assert ei.value.status == 403
    assert str(ei.value) == (
        "PUT /nodes/pve1/lxc/101/config: 403 Permission check failed "
        "(configuring device passthrough is only allowed for root@pam)"
    )
    assert srv.root_token_secret not in str(ei.value) and "\n" not in str(ei.value)
    with pytest.raises(ProxmoxError) as ei:
        ProxmoxClient.from_config(_cfg(srv), env={"GPUTOPO_PVE_PASSWORD": "wrong-secret-123"})
    assert ei.value.status == 401 and "wrong-secret-123" not in str(ei.value)
    # a token is tried at once: a wrong secret fails the login, as a wrong password does
    with pytest.raises(LoginFailed) as ei:
        ProxmoxClient.from_config(_cfg(srv), env={"GPUTOPO_PVE_TOKEN": "root@pam!gputopo=not-the-secret-xyz"})
    assert ei.value.status == 401 and ei.value.exit_code == 2 and "not-the-secret-xyz" not in str(ei.value)
    assert str(ei.value) == "GET /version: 401 Authentication failed! (API token root@pam!gputopo)"


def test_tls_verification_is_on_by_default(srv):
    cfg = ApiConfig(host="127.0.0.1", port=srv.port, timeout=5)
    with pytest.raises(ProxmoxError) as ei:
        ProxmoxClient.from_config(cfg, env={"GPUTOPO_PVE_PASSWORD": srv.root_password})
    assert srv.root_password not in str(ei.value)
    insecure = ApiConfig(host="127.0.0.1", port=srv.port, timeout=5, verify_ssl=False)
    assert ProxmoxClient.from_config(insecure, env={"GPUTOPO_PVE_PASSWORD": srv.root_password}).version()


def test_credentials_from_file_must_be_owner_only(srv, tmp_path):
    f = tmp_path / "secret"
    f.write_text(srv.root_token_secret + "\n")
    os.chmod(f, 0o644)
    with pytest.raises(ConfigError) as ei:
        ProxmoxClient.from_config(_cfg(srv, token_name="gputopo", secret_file=str(f)), env={})
    assert str(f) in str(ei.value) and "\n" not in str(ei.value)
    os.chmod(f, 0o600)
    assert read_secret_file(str(f)) == srv.root_token_secret
    c = ProxmoxClient.from_config(_cfg(srv, token_name="gputopo", secret_file=str(f)), env={})
    assert c.version()["release"] == "8.4"
    with pytest.raises(ConfigError, match="no credentials"):
        ProxmoxClient.from_config(_cfg(srv), env={})
    with pytest.raises(ConfigError, match="GPUTOPO_PVE_TOKEN"):
        ProxmoxClient.from_config(_cfg(srv), env={"GPUTOPO_PVE_TOKEN": "garbage"})


def test_lxc_update_with_digest_and_booleans(srv):
    c = _root(srv)
    conf = c.lxc_config(101)
    c.lxc_update(101, {"dev1": "/dev/nvidia1,gid=44,mode=0666", "onboot": True}, ["dev0"], conf["digest"])
    opts = parse_lxc_conf((srv.pve_root / "lxc/101.conf").read_text()).options
    assert opts["onboot"] == "1" and "dev0" not in opts and opts["dev1"].startswith("/dev/nvidia1")
    with pytest.raises(ProxmoxError) as ei:
        c.lxc_update(101, {"memory": "8192"}, [], conf["digest"])  # stale digest
    assert ei.value.status == 500 and "detected modified configuration" in str(ei.value)
    with pytest.raises(ProxmoxError) as ei:
        c.lxc_update(101, {"memory": "lots"}, [], "")
    assert ei.value.status == 400 and ei.value.errors == {
        "memory": "type check ('integer') failed - got 'lots'"
    }


@pytest.mark.slow
def test_guest_actions_and_task_failures(srv):
    c = _token(srv)
    assert c.guest_status("lxc", 101) == "stopped"
    c.guest_action("lxc", 101, "start", timeout=5)
    assert c.guest_status("lxc", 101) == "running"
    with pytest.raises(ProxmoxError, match="CT 101 already running"):
        c.guest_action("lxc", 101, "start", timeout=5)
    c.guest_action("lxc", 101, "shutdown", timeout=5)
    srv.inject_fault("qmstart", 200, "TASK failed: no vfio")
    with pytest.raises(TaskFailed) as ei:
        c.guest_action("qemu", 200, "start", timeout=5)
    assert ei.value.exitstatus == "TASK failed: no vfio" and ei.value.upid.startswith("UPID:pve1:")
    srv.set_latency("qmstart", 5)
    with pytest.raises(TaskFailed) as ei:
        c.guest_action("qemu", 200, "start", timeout=0.2)
    assert ei.value.exitstatus is None
    assert [g["vmid"] for g in c.list_guests("lxc")] == [101]
    assert c.qemu_config(200)["name"] == "gpuvm"


@pytest.mark.slow
def test_mappings_over_https(srv, seed_root):
    c = _token(srv)
    m = M81.format(g=_group(seed_root, "0000:81:00.0"))
    c.mapping_create("pro6000-vm", [m], "NUMA 1")
    got = c.mappings(check_node="pve1")
    assert got[0]["map"] == [m] and got[0]["checks"] == [] and got[0]["description"] == "NUMA 1"
    c.mapping_update("pro6000-vm", [m, m.replace("81:00.0", "91:00.0")], None, got[0]["digest"])
    (mp,) = parse_pci_cfg((srv.pve_root / "mapping/pci.cfg").read_text())
    assert len(mp.maps) == 2 and mp.description is None
    with pytest.raises(ProxmoxError, match="detected modified configuration"):
        c.mapping_update("pro6000-vm", [m], "x", got[0]["digest"])
    with pytest.raises(ProxmoxError) as ei:
        c.mapping_create("pro6000-vm", [m], None)
    assert "already defined" in str(ei.value)
    c.mapping_delete("pro6000-vm")
    assert c.mappings() == []


def test_local_backend_sends_map_as_repeated_options(srv, seed_root):
    pvesh = PveshSim(srv)
    c = ProxmoxClient.from_config(ApiConfig(backend="local", timeout=10), env={}, runner=pvesh)
    assert c.identity() == "root@pam" and c.can_change_devices()[0]
    m1 = M81.format(g=_group(seed_root, "0000:81:00.0"))
    m2 = "id=10de:2bb5,node=pve1,path=0000:91:00.0"
    c.mapping_create("pro6000-vm", [m1, m2], "vm")
    assert pvesh.calls[-1][:3] == ["pvesh", "create", "/cluster/mapping/pci"]
    assert pvesh.calls[-1].count("--map") == 2
    assert parse_pci_cfg((srv.pve_root / "mapping/pci.cfg").read_text())[0].maps == [m1, m2]
    digest = c.mappings()[0]["digest"]
    c.mapping_update("pro6000-vm", [m2], "vm only 91", digest)
    assert parse_pci_cfg((srv.pve_root / "mapping/pci.cfg").read_text())[0].maps == [m2]
    with pytest.raises(ProxmoxError) as ei:
        c.mapping_create("pro6000-vm", [m2], None)
    assert ei.value.status == 500 and "already defined" in str(ei.value)
    with pytest.raises(ProxmoxError) as ei:
        c.mapping_create("x1", ["id=10dg:2bb5,node=pve1,path=0000:91:00.0"], None)
    assert ei.value.status == 400 and "map[0]" in ei.value.errors
    # a root@pam shell on the node may set devN; tasks run synchronously under pvesh
    conf = c.lxc_config(101)
    c.lxc_update(101, {"dev1": "/dev/nvidia1"}, [], conf["digest"])
    assert "dev1" in c.lxc_config(101)
    c.guest_action("lxc", 101, "start", timeout=5)
    assert state.guest_status(srv.run_dir, "lxc", 101) == "running"
    srv.inject_fault("vzstop", 101, "stop failed: busy")
    with pytest.raises(TaskFailed) as ei:
        c.guest_action("lxc", 101, "stop", timeout=5)
    assert ei.value.exitstatus == "stop failed: busy"


def test_local_backend_errors_and_null_results(srv):
    pvesh = PveshSim(srv)
    c = ProxmoxClient.from_config(ApiConfig(backend="local"), env={}, runner=pvesh)
    with pytest.raises(ProxmoxError) as ei:
        c.lxc_update(101, {"memory": "lots"}, [], "")
    assert ei.value.status == 400 and ei.value.errors == {
        "memory": "type check ('integer') failed - got 'lots'"
    }
    assert pvesh.calls[-1][:5] == ["pvesh", "set", "/nodes/pve1/lxc/101/config", "--memory", "lots"]
    # a stopped container's interfaces are null: pvesh prints nothing
    assert c.lxc_interfaces(101) == []
    with pytest.raises(ProxmoxError) as ei:
        c.qemu_config(999)
    assert ei.value.call == "GET /nodes/pve1/qemu/999/config" and "999" in str(ei.value)


def test_the_address_messages_name_the_api_by():
    from gputopo.adapters.credentials import Credentials
    from gputopo.adapters.proxmox import HttpsClient

    def https(host: str) -> str:
        cfg = ApiConfig(backend="https", host=host, port=8006, node="pve1")
        return HttpsClient(None, cfg, Credentials(user="root@pam")).address

    assert https("pve1.example") == "https://pve1.example:8006"
    assert https("fd00::1") == "https://[fd00::1]:8006"
    local = ProxmoxClient.from_config(
        ApiConfig(backend="local", node="pve1"), runner=lambda a, t: ("", "", 0)
    )
    assert local.address == "pvesh (--local)"


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["https", "pvesh"])
def test_a_pending_value_is_listed_and_reverted(srv, backend):
    """A running container keeps a devN it already has pending (pve-container LXC/Config.pm
    update_pct_config); GET .../pending lists it and ``revert`` drops it, over HTTP and pvesh."""
    if backend == "https":
        c = _root(srv)
    else:
        c = ProxmoxClient.from_config(ApiConfig(backend="local", timeout=10), env={}, runner=PveshSim(srv))
    c.guest_action("lxc", 101, "start", timeout=5)
    c.lxc_update(101, {"dev0": "/dev/nvidia1"}, [], c.lxc_config(101)["digest"])
    items = {i["key"]: i for i in c.lxc_pending(101)}
    assert items["dev0"]["value"].startswith("/dev/nvidia0") and items["dev0"]["pending"] == "/dev/nvidia1"
    c.lxc_update(101, {}, [], items["digest"]["value"], revert=["dev0"])
    assert "pending" not in {i["key"]: i for i in c.lxc_pending(101)}["dev0"]
    assert "[pve:pending]" not in (srv.pve_root / "lxc/101.conf").read_text()
