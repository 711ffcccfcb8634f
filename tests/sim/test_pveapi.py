"""The simulated PVE API server, driven by the real proxmoxer (https, TLS verified) and requests."""

import time
from pathlib import Path

import pytest
import requests
from proxmoxer import ProxmoxAPI
from proxmoxer.core import AuthenticationError, ResourceException

from gputopo.formats.lxcconf import parse_lxc_conf, validate_lxc_conf
from gputopo.formats.pcicfg import parse_pci_cfg, validate_pci_cfg
from gputopo.formats.propstring import sha1_digest
from gputopo.sim import state
from gputopo.sim.hostroot import materialize
from gputopo.sim.pveapi import PveApiServer
from helpers.simapi import seed_root  # noqa: F401 (fixtures)

CT = "arch: amd64\nhostname: llm\nmemory: 4096\ndev0: /dev/nvidia0,gid=44,mode=0666\nlxc.cgroup2.devices.allow: c 195:* rwm\n"
GOOD_MAP = "id=10de:2bb5,iommugroup={g},node=pve1,path={p},subsystem-id=10de:204e"


def _server(tmp_path: Path, root: Path, version: str = "8.4.1", hooks=None) -> PveApiServer:
    srv = PveApiServer(
        tmp_path / "pve", tmp_path / "run", root, version=version, hooks=hooks, auth_fail_delay=0.0
    )
    srv.write_conf("lxc", 101, CT)
    srv.write_conf("qemu", 200, "name: gpuvm\nmemory: 8192\nhostpci0: mapping=pro6000-vm,pcie=1\n")
    return srv.start()


@pytest.fixture
def srv(tmp_path, seed_root):
    s = _server(tmp_path, seed_root)
    yield s
    s.stop()


def _ticket_api(s: PveApiServer) -> ProxmoxAPI:
    return ProxmoxAPI(
        "127.0.0.1", port=s.port, user="root@pam", password=s.root_password, verify_ssl=str(s.ca_cert_path)
    )


def _token_api(s: PveApiServer, token_id=None, secret=None) -> ProxmoxAPI:
    user, tid = (token_id or s.root_token_id).split("!")
    return ProxmoxAPI(
        "127.0.0.1",
        port=s.port,
        user=user,
        token_name=tid,
        token_value=secret or s.root_token_secret,
        verify_ssl=str(s.ca_cert_path),
    )


def _err(fn) -> ResourceException:
    with pytest.raises(ResourceException) as ei:
        fn()
    return ei.value


def _group(root: Path, addr: str) -> int:
    return int((root / "sys/bus/pci/devices" / addr / "iommu_group").readlink().name)


def test_layout_is_etc_pve(srv):
    assert (srv.pve_root / "lxc").resolve() == (srv.pve_root / "nodes/pve1/lxc").resolve()
    assert (srv.pve_root / "qemu-server/200.conf").is_file()


def test_tls_is_verified_against_generated_ca(srv):
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(srv.url + "/version", timeout=5)
    r = requests.get(srv.url + "/version", verify=str(srv.ca_cert_path), timeout=5)
    assert r.status_code == 401 and r.content == b"" and r.reason == "No ticket"


def test_version_and_nodes(srv):
    api = _token_api(srv)
    assert api.version.get()["version"] == "8.4.1"
    assert api.nodes.get()[0]["node"] == "pve1"


def test_bad_token_is_401_without_body(srv):
    e = _err(lambda: _token_api(srv, secret="00000000-0000-0000-0000-000000000000").version.get())
    assert e.status_code == 401 and e.content == "Authentication failed!"
    assert e.errors == {"errors": b""}


def test_bad_password_is_authentication_failure(srv):
    r = requests.post(
        srv.url + "/access/ticket",
        data={"username": "root@pam", "password": "nope"},
        verify=str(srv.ca_cert_path),
        timeout=5,
    )
    assert r.status_code == 401 and r.reason == "authentication failure"
    assert r.json() == {"data": None, "message": "authentication failure\n"}
    with pytest.raises(AuthenticationError):
        ProxmoxAPI(
            "127.0.0.1", port=srv.port, user="root@pam", password="nope", verify_ssl=str(srv.ca_cert_path)
        )


def test_ticket_put_needs_csrf(srv):
    v = str(srv.ca_cert_path)
    t = requests.post(
        srv.url + "/access/ticket",
        data={"username": "root@pam", "password": srv.root_password},
        verify=v,
        timeout=5,
    ).json()["data"]
    cookies = {"PVEAuthCookie": t["ticket"]}
    assert (
        requests.get(srv.url + "/nodes/pve1/lxc/101/config", cookies=cookies, verify=v, timeout=5).status_code
        == 200
    )
    r = requests.put(
        srv.url + "/nodes/pve1/lxc/101/config", data={"memory": "8192"}, cookies=cookies, verify=v, timeout=5
    )
    assert (r.status_code, r.reason, r.content) == (401, "Permission denied - invalid csrf token", b"")
    r = requests.put(
        srv.url + "/nodes/pve1/lxc/101/config",
        data={"memory": "8192"},
        cookies=cookies,
        headers={"CSRFPreventionToken": t["CSRFPreventionToken"]},
        verify=v,
        timeout=5,
    )
    assert r.status_code == 200 and r.json() == {"data": None}


def test_unknown_path_is_501_after_auth(srv):
    e = _err(lambda: _token_api(srv).nodes("pve1").frobnicate.get())
    assert e.status_code == 501 and e.content == "Method 'GET /nodes/pve1/frobnicate' not implemented"
    r = requests.get(srv.url + "/nodes/pve1/frobnicate", verify=str(srv.ca_cert_path), timeout=5)
    assert r.status_code == 401


def test_lxc_config_get_shape(srv):
    c = _token_api(srv).nodes("pve1").lxc(101).config.get()
    assert c["memory"] == 4096 and c["hostname"] == "llm"
    assert c["lxc"] == [["lxc.cgroup2.devices.allow", "c 195:* rwm"]]
    assert c["digest"] == sha1_digest(CT)


def test_missing_config_is_500(srv):
    e = _err(lambda: _token_api(srv).nodes("pve1").lxc(999).config.get())
    assert e.status_code == 500 and e.content == "Configuration file 'nodes/pve1/lxc/999.conf' does not exist"


def test_parameter_errors_are_400_with_errors(srv):
    api = _token_api(srv)
    e = _err(lambda: api.nodes("pve1").lxc(101).config.put(memory="lots", bogus="1"))
    assert e.status_code == 400 and e.content == "Parameter verification failed."
    assert e.errors["memory"] == "type check ('integer') failed - got 'lots'"
    assert "not defined in schema" in e.errors["bogus"]
    e = _err(lambda: api.nodes("pve1").lxc(101).config.put(onboot="True"))
    assert e.errors == {"onboot": "type check ('boolean') failed - got 'True'"}
    e = _err(lambda: api.nodes("pve1").lxc(50).config.get())
    assert e.errors == {"vmid": "value must have a minimum value of 100"}
    e = _err(lambda: api.nodes("pve1").lxc(101).config.put(delete="gpus"))
    assert e.errors == {"delete": "unknown option 'gpus'"}


def test_digest_conflict(srv):
    api = _token_api(srv)
    e = _err(lambda: api.nodes("pve1").lxc(101).config.put(memory=8192, digest="0" * 40))
    assert e.status_code == 500
    assert e.content == "detected modified configuration - file changed by other user? Try again."


def test_dev_with_token_is_403(srv):
    api = _token_api(srv)
    msg = "Permission check failed (configuring device passthrough is only allowed for root@pam)"
    for call in (
        lambda: api.nodes("pve1").lxc(101).config.put(dev1="/dev/nvidia1"),
        lambda: api.nodes("pve1").lxc(101).config.put(delete="dev0"),
    ):
        e = _err(call)
        assert (e.status_code, e.content) == (403, msg)
    assert "dev0" in parse_lxc_conf((srv.pve_root / "lxc/101.conf").read_text()).options


def test_non_root_user_lacking_privilege_gets_403_and_operator_can_audit(srv):
    ops = _token_api(srv, srv.operator_token_id, srv.operator_token_secret)
    assert ops.nodes("pve1").lxc(101).config.get()["hostname"] == "llm"
    e = _err(lambda: ops.nodes("pve1").lxc(101).config.put(dev1="/dev/nvidia1"))
    assert e.status_code == 403


def test_dev_for_missing_node_is_refused(srv):
    api = _ticket_api(srv)
    e = _err(lambda: api.nodes("pve1").lxc(101).config.put(dev5="/dev/nvidia42"))
    assert e.status_code == 500 and e.content == "Device /dev/nvidia42 does not exist"


def test_stopped_ct_change_applies_and_file_stays_valid(srv):
    api = _ticket_api(srv)
    digest = api.nodes("pve1").lxc(101).config.get()["digest"]
    api.nodes("pve1").lxc(101).config.put(
        dev1="/dev/nvidia1,gid=44,mode=0666", delete="dev0", onboot=1, digest=digest
    )
    text = (srv.pve_root / "lxc/101.conf").read_text()
    conf = parse_lxc_conf(text)
    assert "dev0" not in conf.options and conf.options["dev1"] == "/dev/nvidia1,gid=44,mode=0666"
    assert conf.pending.is_empty() and conf.lxc == [("lxc.cgroup2.devices.allow", "c 195:* rwm")]
    assert validate_lxc_conf(text) == []


@pytest.mark.parametrize("version, hotplugged", [("8.4.1", False), ("9.1.2", True)])
@pytest.mark.slow
def test_running_ct_pending_vs_hotplug(tmp_path, seed_root, version, hotplugged):
    s = _server(tmp_path, seed_root, version)
    try:
        state.set_guest_status(s.run_dir, "lxc", 101, "running")
        api = _ticket_api(s)
        api.nodes("pve1").lxc(101).config.put(dev1="/dev/nvidia1", hostname="llm2")
        api.nodes("pve1").lxc(101).config.put(dev0="/dev/nvidia2")  # an existing devN: always pending
        conf = parse_lxc_conf((s.pve_root / "lxc/101.conf").read_text())
        assert conf.options["hostname"] == "llm2"  # fast-plug on both
        assert ("dev1" in conf.options) is hotplugged
        assert ("dev1" in conf.pending.options) is not hotplugged
        assert conf.pending.options["dev0"] == "/dev/nvidia2"
        assert api.nodes("pve1").lxc(101).config.get()["dev0"] == "/dev/nvidia2"  # pending merged
        assert api.nodes("pve1").lxc(101).config.get(current=1)["dev0"].startswith("/dev/nvidia0")
    finally:
        s.stop()


def test_deleting_a_key_set_only_as_pending_keeps_its_pending_value(tmp_path, seed_root):
    """pve-container update_pct_config queues every delete of a running container with
    add_to_pending_delete, which leaves a pending value alone; cleanup_pending then drops the
    delete of a key that is not set now. The pending devN stays: only 'revert' takes it back."""
    s = _server(tmp_path, seed_root, "8.4.1")
    try:
        state.set_guest_status(s.run_dir, "lxc", 101, "running")
        api = _ticket_api(s)
        api.nodes("pve1").lxc(101).config.put(dev9="/dev/nvidia1")  # PVE 8: pending
        api.nodes("pve1").lxc(101).config.put(delete="dev9")
        conf = parse_lxc_conf((s.pve_root / "lxc/101.conf").read_text())
        assert conf.pending.options.get("dev9") == "/dev/nvidia1" and "dev9" not in conf.options
        assert "dev9" not in conf.pending_delete
    finally:
        s.stop()


def _wait(api, upid, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = api.nodes("pve1").tasks(upid).status.get()
        if st["status"] == "stopped":
            return st
        time.sleep(0.02)
    raise AssertionError("task did not stop")


@pytest.mark.slow
def test_start_task_applies_pending_and_calls_hooks(tmp_path, seed_root):
    calls = []

    class Hooks:
        def on_guest_start(self, kind, vmid):
            calls.append(("start", kind, vmid))

        def on_guest_stop(self, kind, vmid):
            calls.append(("stop", kind, vmid))

    s = _server(tmp_path, seed_root, hooks=Hooks())
    try:
        s.set_latency("vzstart", 0.15)
        api = _ticket_api(s)
        conf = parse_lxc_conf(CT)
        conf.pending.options["dev1"] = "/dev/nvidia1"
        from gputopo.formats.lxcconf import write_lxc_conf

        s.write_conf("lxc", 101, write_lxc_conf(conf))
        upid = api.nodes("pve1").lxc(101).status.start.post()
        assert upid.startswith("UPID:pve1:") and upid.endswith(":vzstart:101:root@pam:")
        assert api.nodes("pve1").tasks(upid).status.get()["status"] == "running"
        st = _wait(api, upid)
        assert st["exitstatus"] == "OK" and calls == [("start", "lxc", 101)]
        assert api.nodes("pve1").lxc(101).status.current.get()["status"] == "running"
        assert state.guest_status(s.run_dir, "lxc", 101) == "running"
        assert "dev1" in parse_lxc_conf((s.pve_root / "lxc/101.conf").read_text()).options
        e = _err(lambda: api.nodes("pve1").lxc(101).status.start.post())
        assert (e.status_code, e.content) == (500, "CT 101 already running")
        log = api.nodes("pve1").tasks(upid).log.get()
        assert log[-1] == {"n": len(log), "t": "TASK OK"}
        _wait(api, api.nodes("pve1").lxc(101).status.shutdown.post())
        assert calls[-1] == ("stop", "lxc", 101)
        e = _err(lambda: api.nodes("pve1").lxc(101).status.stop.post())
        assert e.content == "CT 101 not running"
    finally:
        s.stop()


@pytest.mark.slow
def test_failing_tasks(srv):
    api = _token_api(srv)
    srv.inject_fault("qmstart", 200, "start failed: QEMU exited with code 1")
    st = _wait(api, api.nodes("pve1").qemu(200).status.start.post())
    assert st["exitstatus"] == "start failed: QEMU exited with code 1"
    assert api.nodes("pve1").qemu(200).status.current.get()["status"] == "stopped"
    upid = api.nodes("pve1").lxc(555).status.start.post()  # start does not check the config first
    assert _wait(api, upid)["exitstatus"] == "Configuration file 'nodes/pve1/lxc/555.conf' does not exist"
    e = _err(lambda: api.nodes("pve1").tasks("UPID:bogus").status.get())
    assert e.errors == {"upid": "unable to parse worker upid"}


@pytest.mark.slow
def test_mapping_crud_and_errors(srv, seed_root):
    api = _token_api(srv)
    m81 = GOOD_MAP.format(g=_group(seed_root, "0000:81:00.0"), p="0000:81:00.0")
    m91 = GOOD_MAP.format(g=_group(seed_root, "0000:91:00.0"), p="0000:91:00.0")
    e = _err(lambda: api.cluster.mapping.pci.post(id="pro6000-vm"))
    assert e.errors == {"map": "property is missing and it is not optional"}
    e = _err(
        lambda: api.cluster.mapping.pci.post(
            id="pro6000-vm", map=["id=0x10de:2bb5,node=pve1,path=0000:81:00.0"]
        )
    )
    assert e.status_code == 400 and "map[0].id" in e.errors["map[0]"]
    api.cluster.mapping.pci.post(id="pro6000-vm", map=[m81, m91], description="NUMA 1")
    text = (srv.pve_root / "mapping/pci.cfg").read_text()
    assert validate_pci_cfg(text) == [] and parse_pci_cfg(text)[0].maps == [m81, m91]
    e = _err(lambda: api.cluster.mapping.pci.post(id="pro6000-vm", map=[m81]))
    assert e.content == "create hardware mapping failed: pci ID 'pro6000-vm' already defined"
    item = api.cluster.mapping.pci("pro6000-vm").get()
    assert "id" not in item and item["digest"] == sha1_digest(text) and item["map"] == [m81, m91]
    e = _err(lambda: api.cluster.mapping.pci("pro6000-vm").put(description="x"))
    assert e.content == "update hardware mapping failed: missing value for required option 'map'"
    e = _err(lambda: api.cluster.mapping.pci("pro6000-vm").put(map=[m81], digest="0" * 40))
    assert "detected modified configuration" in e.content
    e = _err(lambda: api.cluster.mapping.pci("nope").put(map=[m81]))
    assert e.content == "update hardware mapping failed: pci ID 'nope' does not exist"
    api.cluster.mapping.pci("pro6000-vm").put(map=[m91], digest=item["digest"], delete="description")
    assert api.cluster.mapping.pci("pro6000-vm").get() == {
        "type": "pci",
        "map": [m91],
        "digest": sha1_digest((srv.pve_root / "mapping/pci.cfg").read_text()),
    }
    api.cluster.mapping.pci("pro6000-vm").delete()
    api.cluster.mapping.pci("pro6000-vm").delete()  # unknown id: silent
    e = _err(lambda: api.cluster.mapping.pci("pro6000-vm").get())
    assert e.content == "mapping 'pro6000-vm' not found"
    assert api.cluster.mapping.pci.get() == []


def test_mapping_check_node(srv, seed_root):
    api = _token_api(srv)
    g = _group(seed_root, "0000:81:00.0")
    api.cluster.mapping.pci.post(id="good", map=[GOOD_MAP.format(g=g, p="0000:81:00.0")])
    api.cluster.mapping.pci.post(id="nosub", map=[f"id=10de:2bb5,iommugroup={g},node=pve1,path=0000:81:00.0"])
    api.cluster.mapping.pci.post(
        id="wrongid", map=[f"id=10de:1eb8,iommugroup={g},node=pve1,path=0000:81:00.0,subsystem-id=10de:204e"]
    )
    api.cluster.mapping.pci.post(id="gone", map=["id=10de:2bb5,node=pve1,path=0000:c1:00.0"])
    api.cluster.mapping.pci.post(id="other", map=["id=10de:2bb5,node=pve2,path=0000:81:00.0"])
    checks = {m["id"]: m["checks"] for m in api.cluster.mapping.pci.get(**{"check-node": "pve1"})}
    assert checks["good"] == []
    assert checks["nosub"] == [
        {
            "severity": "error",
            "message": "Invalid configuration: missing expected property 'subsystem-id' for device '0000:81:00.0'\n",
        }
    ]
    assert (
        checks["wrongid"][0]["message"]
        == "Invalid configuration: 'id' does not match for 'wrongid' (10de:2bb5 != 10de:1eb8)\n"
    )
    assert checks["gone"][0]["message"] == "Invalid configuration: pci device '0000:c1:00.0' not found\n"
    assert checks["other"] == [{"severity": "warning", "message": "No mapping for node pve1."}]
    e = _err(lambda: api.cluster.mapping.pci.get(**{"check-node": "pve9"}))
    assert e.content == "wrong node to check - pve9 != pve1"


def test_hardware_pci(srv, seed_root):
    items = _token_api(srv).nodes("pve1").hardware.pci.get()
    ids = [i["id"] for i in items]
    assert ids == sorted(ids)
    gpu = next(i for i in items if i["id"] == "0000:81:00.0")
    assert gpu["vendor"] == "0x10de" and gpu["device"] == "0x2bb5" and gpu["subsystem_device"] == "0x204e"
    assert gpu["iommugroup"] == _group(seed_root, "0000:81:00.0")
    assert not any(i["class"].startswith(("0x05", "0x06", "0x0b")) for i in items)
    # an empty value is no value (pve-http-server AnyEvent.pm decode_urlencoded: undef), so
    # the default blacklist applies (API2/Hardware/PCI.pm: $param->{...} // "05;06;0b")
    assert _token_api(srv).nodes("pve1").hardware.pci.get(**{"pci-class-blacklist": ""}) == items
    everything = _token_api(srv).nodes("pve1").hardware.pci.get(**{"pci-class-blacklist": "ff"})
    assert any(i["class"].startswith("0x06") for i in everything)


def test_state_is_shared_through_files(srv, seed_root, tmp_path):
    state.set_guest_status(srv.run_dir, "lxc", 101, "running")
    assert _token_api(srv).nodes("pve1").lxc.get()[0]["status"] == "running"
    srv.stop()
    again = PveApiServer(srv.pve_root, srv.run_dir, seed_root).start()
    try:
        again_api = _token_api(again)
        assert again_api.nodes("pve1").lxc(101).status.current.get()["status"] == "running"
    finally:
        again.stop()


# --- files written as Proxmox's writer writes them ----------------------------------------


def _canonical(text: str) -> bool:
    from gputopo.formats.lxcconf import write_lxc_conf

    return write_lxc_conf(parse_lxc_conf(text)) == text


def test_stopped_ct_file_is_written_like_pct(srv):
    api = _ticket_api(srv)
    api.nodes("pve1").lxc(101).config.put(
        dev1="/dev/nvidia1,gid=44,mode=0666", delete="dev0", onboot=1, description="GPU box"
    )
    text = (srv.pve_root / "lxc/101.conf").read_text()
    # description first as comment lines, keys sorted, raw lxc.* lines kept last and in order
    assert text == (
        "#GPU box\narch: amd64\ndev1: /dev/nvidia1,gid=44,mode=0666\nhostname: llm\nmemory: 4096\n"
        "onboot: 1\nlxc.cgroup2.devices.allow: c 195:* rwm\n"
    )
    assert _canonical(text)
    api.nodes("pve1").lxc(101).config.put(delete="description")
    assert not (srv.pve_root / "lxc/101.conf").read_text().startswith("#")


@pytest.mark.parametrize("version, main_dev1", [("8.4.1", False), ("9.1.2", True)])
@pytest.mark.slow
def test_running_ct_file_has_the_pending_section_like_pct(tmp_path, seed_root, version, main_dev1):
    s = _server(tmp_path, seed_root, version)
    try:
        state.set_guest_status(s.run_dir, "lxc", 101, "running")
        _ticket_api(s).nodes("pve1").lxc(101).config.put(dev1="/dev/nvidia1", memory=8192, delete="dev0")
        text = (s.pve_root / "lxc/101.conf").read_text()
        main = "arch: amd64\ndev0: /dev/nvidia0,gid=44,mode=0666\n"
        main += "dev1: /dev/nvidia1\n" if main_dev1 else ""
        pending = "delete: dev0\n" + ("" if main_dev1 else "dev1: /dev/nvidia1\n")
        assert text == (
            main + "hostname: llm\nmemory: 8192\nlxc.cgroup2.devices.allow: c 195:* rwm\n"
            "\n[pve:pending]\n" + pending
        )
        assert _canonical(text) and validate_lxc_conf(text) == []
        # a start applies the pending section and leaves no empty section behind
        api = _ticket_api(s)
        _wait(api, api.nodes("pve1").lxc(101).status.stop.post())
        _wait(api, api.nodes("pve1").lxc(101).status.start.post())
        text = (s.pve_root / "lxc/101.conf").read_text()
        assert text == (
            "arch: amd64\ndev1: /dev/nvidia1\nhostname: llm\nmemory: 8192\n"
            "lxc.cgroup2.devices.allow: c 195:* rwm\n"
        )
    finally:
        s.stop()


def test_mapping_file_is_written_like_proxmox(srv, seed_root):
    from gputopo.formats.pcicfg import write_pci_cfg

    api = _token_api(srv)
    m81 = GOOD_MAP.format(g=_group(seed_root, "0000:81:00.0"), p="0000:81:00.0")
    m91 = GOOD_MAP.format(g=_group(seed_root, "0000:91:00.0"), p="0000:91:00.0")
    api.cluster.mapping.pci.post(id="pro6000-vm", map=[m81, m91], description="NUMA 1", mdev=0)
    api.cluster.mapping.pci.post(id="pro6000", map=[m81])
    text = (srv.pve_root / "mapping/pci.cfg").read_text()
    # bare id line, tab-indented properties, map lines first, others sorted, a blank line after
    # every section
    assert text == (
        f"pro6000-vm\n\tmap {m81}\n\tmap {m91}\n\tdescription NUMA 1\n\tmdev 0\n\npro6000\n\tmap {m81}\n\n"
    )
    assert write_pci_cfg(parse_pci_cfg(text)) == text and validate_pci_cfg(text) == []


# --- check-node against the simulated sysfs, both ways ----------------------------------------


@pytest.mark.slow
def test_check_node_reads_live_sysfs_both_ways(tmp_path):
    from gputopo.sim.kernel import SimKernel

    root = materialize("seed", tmp_path / "root")
    s = _server(tmp_path, root)
    try:
        api = _token_api(s)
        g81, g91 = _group(root, "0000:81:00.0"), _group(root, "0000:91:00.0")
        api.cluster.mapping.pci.post(id="ok81", map=[GOOD_MAP.format(g=g81, p="0000:81:00.0")])
        api.cluster.mapping.pci.post(id="group", map=[GOOD_MAP.format(g=g81 + 1000, p="0000:81:00.0")])
        api.cluster.mapping.pci.post(id="ok91", map=[GOOD_MAP.format(g=g91, p="0000:91:00.0")])

        def checks():
            return {
                m["id"]: [c["message"] for c in m["checks"]]
                for m in api.cluster.mapping.pci.get(**{"check-node": "pve1"})
            }

        got = checks()
        assert got["ok81"] == [] and got["ok91"] == []
        assert got["group"] == [
            f"Invalid configuration: 'iommugroup' does not match for 'group' ({g81} != {g81 + 1000})\n"
        ]
        # the map has a property the hardware does not: a board without subsystem ids
        for name in ("subsystem_vendor", "subsystem_device"):
            (root / "sys/bus/pci/devices/0000:91:00.0" / name).unlink()
        assert checks()["ok91"] == [
            "Invalid configuration: unexpected property 'subsystem-id' configured for device '0000:91:00.0'\n"
        ]
        # a device that falls off the bus is gone for the check at once
        SimKernel(root, time_scale=0.0).fall_off("0000:81:00.0")
        assert checks()["ok81"] == ["Invalid configuration: pci device '0000:81:00.0' not found\n"]
    finally:
        s.stop()


# --- the same guest actions under /qemu ---------------------------------------------------------


@pytest.mark.slow
def test_qemu_stop_and_shutdown_tasks(srv):
    api = _token_api(srv)
    vm = api.nodes("pve1").qemu(200)
    # qemu-server API2/Qemu.pm checks nothing before the worker: a stop of a stopped VM is a
    # task that ends OK (QemuServer.pm _do_vm_stop finds nothing running)
    assert _wait(api, vm.status.stop.post())["exitstatus"] == "OK"
    # hostpci0 names a mapping this node does not have: the start task fails, as in Proxmox
    assert _wait(api, vm.status.start.post())["exitstatus"] == "PCI device mapping not found for 'pro6000-vm'"
    assert vm.status.current.get()["status"] == "stopped"
    srv.write_conf("qemu", 200, "name: gpuvm\nmemory: 8192\n")
    upid = vm.status.start.post()
    assert ":qmstart:200:root@pam!gputopo:" in upid
    assert _wait(api, upid)["exitstatus"] == "OK"
    assert vm.status.current.get()["status"] == "running"
    # ... and a start of a running VM a task that fails (QemuServer.pm vm_start)
    assert _wait(api, vm.status.start.post())["exitstatus"] == "VM 200 already running"
    st = _wait(api, vm.status.shutdown.post(timeout=30))
    assert st["exitstatus"] == "OK" and st["type"] == "qmshutdown" and st["tokenid"] == "gputopo"
    _wait(api, vm.status.start.post())
    srv.inject_fault("qmstop", 200, "VM quit/powerdown failed - got timeout")
    st = _wait(api, vm.status.stop.post())
    assert st["exitstatus"] == "VM quit/powerdown failed - got timeout"
    assert vm.status.current.get()["status"] == "running"
    log = api.nodes("pve1").tasks(st["upid"]).log.get()
    assert log[-1]["t"] == "TASK ERROR: VM quit/powerdown failed - got timeout"
