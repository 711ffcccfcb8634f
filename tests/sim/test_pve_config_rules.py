"""Which config changes a real node refuses, and in which order it checks, driven over HTTP with
proxmoxer and requests: keys only root@pam may set (an API token of root@pam is not root@pam),
and a PUT that names nothing to change."""

from __future__ import annotations

from urllib.parse import urlencode

import pytest
from proxmoxer import ProxmoxAPI
from proxmoxer.core import ResourceException

from gputopo.formats.propstring import sha1_digest
from gputopo.sim import state
from gputopo.sim.pveapi import PveApiServer
from helpers.simapi import api_server, seed_root, token_put  # noqa: F401 (fixtures)

CT = "arch: amd64\nhostname: llm\nmemory: 4096\nostype: ubuntu\n"
VM = "bios: ovmf\ncores: 4\nmachine: q35\nmemory: 8192\n"
STALE = "0" * 40


@pytest.fixture
def srv(tmp_path, seed_root):
    s = api_server(tmp_path, seed_root, {("lxc", 101): CT, ("qemu", 201): VM})
    s.start()
    yield s
    s.stop()


def _token_api(s: PveApiServer) -> ProxmoxAPI:
    user, tid = s.root_token_id.split("!")
    return ProxmoxAPI(
        "127.0.0.1",
        port=s.port,
        user=user,
        token_name=tid,
        token_value=s.root_token_secret,
        verify_ssl=str(s.ca_cert_path),
    )


def _ticket_api(s: PveApiServer, user: str, password: str) -> ProxmoxAPI:
    return ProxmoxAPI("127.0.0.1", port=s.port, user=user, password=password, verify_ssl=str(s.ca_cert_path))


def _vm_text(s: PveApiServer) -> str:
    return s.conf_path("qemu", 201).read_text()


# --- keys only root@pam may set (qemu-server API2/Qemu.pm $check_vm_modify_config_perm) ----------


@pytest.mark.parametrize(
    "params, key",
    [
        ({"affinity": "0-3"}, "affinity"),
        ({"args": "-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=262144"}, "args"),
        ({"hugepages": "1024"}, "hugepages"),
        ({"delete": "affinity"}, "affinity"),  # a delete is checked as a set is
    ],
)
def test_a_token_of_root_cannot_set_a_root_only_key_and_gets_qemu_servers_500(srv, params, key):
    before = _vm_text(srv)
    body = urlencode({**params, "digest": sha1_digest(before)})
    r = token_put(srv, "/nodes/pve1/qemu/201/config", body)
    # a plain die: 500, the first line as the reason phrase, the whole text in the body
    assert r.status_code == 500
    assert r.reason == f"only root can set '{key}' config"
    assert r.json() == {"data": None, "message": f"only root can set '{key}' config\n"}
    assert _vm_text(srv) == before
    e = pytest.raises(ResourceException, _token_api(srv).nodes("pve1").qemu(201).config.put, **params)
    assert (e.value.status_code, e.value.content) == (500, f"only root can set '{key}' config")


def test_the_check_comes_before_the_digest_and_names_the_first_deleted_key(srv):
    # update_vm_api checks the deletes, then the set keys, all before the config is read
    e = pytest.raises(
        ResourceException,
        _token_api(srv).nodes("pve1").qemu(201).config.put,
        numa=1,
        delete="hugepages",
        digest=STALE,
    )
    assert e.value.content == "only root can set 'hugepages' config"


def test_root_with_a_ticket_may_and_a_token_may_set_the_keys_of_an_option_group(srv):
    api = _ticket_api(srv, "root@pam", srv.root_password)
    api.nodes("pve1").qemu(201).config.put(affinity="0-3", hugepages="1024", numa=1)
    assert {"affinity: 0-3", "hugepages: 1024", "numa: 1"} <= set(_vm_text(srv).splitlines())
    # numa and numaN are VM.Config.CPU, not root-only
    _token_api(srv).nodes("pve1").qemu(201).config.put(numa0="cpus=0-3,hostnodes=0,memory=8192,policy=bind")
    assert "numa0: cpus=0-3,hostnodes=0,memory=8192,policy=bind" in _vm_text(srv)


def test_another_user_with_every_vm_privilege_gets_the_same_500(srv):
    ops = _ticket_api(srv, srv.operator_user, srv.operator_password)
    e = pytest.raises(ResourceException, ops.nodes("pve1").qemu(201).config.put, args="-no-reboot")
    assert (e.value.status_code, e.value.content) == (500, "only root can set 'args' config")
    # a key of a group the user lacks the privilege for is a 403 naming it
    e = pytest.raises(ResourceException, ops.nodes("pve1").qemu(201).config.put, machine="q35")
    assert (e.value.status_code, e.value.content) == (
        403,
        "Permission check failed (/vms/201, VM.Config.HWType)",
    )


# --- a PUT that changes nothing (LXC/Config.pm update_vm line 161, Qemu.pm update_vm_api line 2110) ---


@pytest.mark.parametrize("kind, vmid", [("lxc", 101), ("qemu", 201)])
def test_a_put_with_only_a_digest_is_no_options_specified_before_the_digest_is_compared(srv, kind, vmid):
    before = srv.conf_path(kind, vmid).read_text()
    e = pytest.raises(
        ResourceException, getattr(_token_api(srv).nodes("pve1"), kind)(vmid).config.put, digest=STALE
    )
    assert (e.value.status_code, e.value.content) == (500, "no options specified")
    r = token_put(srv, f"/nodes/pve1/{kind}/{vmid}/config", f"digest={STALE}")
    assert r.json() == {"data": None, "message": "no options specified\n"}
    assert srv.conf_path(kind, vmid).read_text() == before


def test_a_locked_container_still_answers_no_options_specified_first(srv):
    # pve-container dies before it takes the config lock, so before check_lock
    srv.write_conf("lxc", 101, CT + "lock: backup\n")
    e = pytest.raises(ResourceException, _token_api(srv).nodes("pve1").lxc(101).config.put, digest=STALE)
    assert e.value.content == "no options specified"
    e = pytest.raises(ResourceException, _token_api(srv).nodes("pve1").lxc(101).config.put, memory=2048)
    assert e.value.content == "CT is locked (backup)"


# --- revert: what drops a pending change (LXC/Config.pm update_pct_config, Qemu.pm update_vm_api) ---


def _pending(api, kind: str, vmid: int) -> dict[str, dict]:
    return {i["key"]: i for i in getattr(api.nodes("pve1"), kind)(vmid).pending.get()}


def test_only_revert_drops_a_pending_devn_of_a_running_pve8_container(srv):
    api = _ticket_api(srv, "root@pam", srv.root_password)
    state.set_guest_status(srv.run_dir, "lxc", 101, "running")
    ct = api.nodes("pve1").lxc(101)
    ct.config.put(dev0="/dev/nvidia0,mode=0666")  # PVE 8 hot-plugs no devN: it waits for the next start
    assert _pending(api, "lxc", 101)["dev0"] == {"key": "dev0", "pending": "/dev/nvidia0,mode=0666"}
    assert _pending(api, "lxc", 101)["hostname"] == {"key": "hostname", "value": "llm"}
    assert _pending(api, "lxc", 101)["digest"]["value"] == sha1_digest(srv.conf_path("lxc", 101).read_text())
    # a delete queues nothing and leaves the pending value (cleanup_pending drops the delete of a key
    # not set now)
    ct.config.put(delete="dev0")
    assert _pending(api, "lxc", 101)["dev0"] == {"key": "dev0", "pending": "/dev/nvidia0,mode=0666"}
    ct.config.put(revert="dev0")
    assert not [i for i in _pending(api, "lxc", 101).values() if "pending" in i or "delete" in i]
    assert "[pve:pending]" not in srv.conf_path("lxc", 101).read_text()
    # a pending delete of a key set now is taken back too
    ct.config.put(delete="arch")
    assert _pending(api, "lxc", 101)["arch"] == {"key": "arch", "value": "amd64", "delete": 1}
    ct.config.put(revert="arch")
    assert _pending(api, "lxc", 101)["arch"] == {"key": "arch", "value": "amd64"}


def test_revert_is_checked_as_pve_container_checks_it(srv):
    ct = _token_api(srv).nodes("pve1").lxc(101)
    e = pytest.raises(ResourceException, ct.config.put, revert="nosuch")
    assert (e.value.status_code, e.value.errors) == (400, {"revert": "unknown option 'nosuch'"})
    e = pytest.raises(ResourceException, ct.config.put, revert="memory", memory=2048)
    assert e.value.errors == {"revert": "you can't use '-memory' and '-revert memory' at the same time"}
    e = pytest.raises(ResourceException, ct.config.put, revert="memory", delete="memory")
    assert e.value.errors == {
        "delete": "you can't use '-delete memory' and '-revert memory' at the same time"
    }
    # a token may not revert a devN either: device passthrough is root@pam's
    e = pytest.raises(ResourceException, ct.config.put, revert="dev0")
    assert (e.value.status_code, e.value.content) == (
        403,
        "Permission check failed (configuring device passthrough is only allowed for root@pam)",
    )


def test_a_vm_revert_alone_is_an_option_and_drops_the_pending_value(srv):
    api = _ticket_api(srv, "root@pam", srv.root_password)
    state.set_guest_status(srv.run_dir, "qemu", 201, "running")
    vm = api.nodes("pve1").qemu(201)
    vm.config.put(hugepages="1024", cores=8)  # a running VM keeps them pending
    text = srv.conf_path("qemu", 201).read_text()
    assert "hugepages: 1024" in text.split("[PENDING]")[1] and "cores: 8" in text.split("[PENDING]")[1]
    vm.config.put(revert="hugepages,cores")  # not 'no options specified'
    assert srv.conf_path("qemu", 201).read_text() == VM
