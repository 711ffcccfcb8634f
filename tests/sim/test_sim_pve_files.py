"""The simulated API over Proxmox's own files (fixtures/pve/, see SOURCES.md there): it reads
them as a real node's API answers them and, when it changes one, writes what Proxmox's writer
writes.

The expected values are Proxmox's: pve-guest-common AbstractConfig.pm ``load_current_config``
(what GET .../config shows), pve-container ``write_pct_config``, qemu-server
``write_vm_config``, pve-common SectionConfig.pm ``write_config`` (with pve-ha-manager's
Rules.pm), and the digest pve-ha-manager's own test prints for its rules file. The handlers are
called in-process, as the HTTP layer calls them.
"""

import hashlib

import pytest

from gputopo.sim.pveapi import PveApiServer
from gputopo.sim.pveapi.auth import Caller
from gputopo.sim.pveapi.params import ItemErrors, fmt_map_array
from helpers import REPO

PVE = REPO / "fixtures" / "pve"
ROOT = Caller(user="root@pam", via="ticket")


@pytest.fixture
def srv(tmp_path):
    return PveApiServer(tmp_path / "pve", tmp_path / "run", version="9.0.3", auth_fail_delay=0.0)


def _sha1(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


def test_container_snapshots_survive_a_change(srv):
    text = (PVE / "lxc/snapshot-create-102.conf").read_text()
    srv.write_conf("lxc", 102, text)
    cfg = srv.h_lxc_get(ROOT, {"vmid": 102, "node": "pve1"})
    assert cfg["hostname"] == "test" and cfg["memory"] == 2048 and cfg["parent"] == "test2"
    assert cfg["digest"] == _sha1(text) and "description" not in cfg
    snap = srv.h_lxc_get(ROOT, {"vmid": 102, "node": "pve1", "snapshot": "test"})
    assert snap["description"] == "test comment\n" and snap["snaptime"] == 1234567890
    srv.h_lxc_put(ROOT, {"vmid": 102, "node": "pve1", "hostname": "test9"})
    # write_pct_config: only the changed line differs; both snapshots and their '#' lines stay
    assert srv.conf_path("lxc", 102).read_text() == text.replace("hostname: test\n", "hostname: test9\n", 1)


def test_container_pending_description_shows_in_the_config(srv):
    srv.write_conf("lxc", 101, "#old\narch: amd64\n\n[pve:pending]\n#new\nmemory: 1024\n")
    cfg = srv.h_lxc_get(ROOT, {"vmid": 101, "node": "pve1"})
    assert cfg["description"] == "new\n" and cfg["memory"] == 1024
    cur = srv.h_lxc_get(ROOT, {"vmid": 101, "node": "pve1", "current": 1})
    assert cur["description"] == "old\n" and "memory" not in cur


def test_vm_snapshot_description_survives_a_change(srv):
    text = (PVE / "qemu-server/snapshot-create-102.conf").read_text()
    srv.write_conf("qemu", 102, text)
    snap = srv.h_qemu_get(ROOT, {"vmid": 102, "node": "pve1", "snapshot": "test"})
    assert snap["description"] == "test comment" and snap["vmstate"] == "somestorage:state-volume"
    srv.h_qemu_put(ROOT, {"vmid": 102, "node": "pve1", "name": "win2"})
    # write_vm_config writes the snapshot's description back as its '#' line
    assert srv.conf_path("qemu", 102).read_text() == text.replace("name: win\n", "name: win2\n", 1)


def test_vm_sections_read_as_the_api_shows_them(srv):
    text = (PVE / "qemu-server/sections.conf").read_text()
    srv.write_conf("qemu", 120, text)
    cfg = srv.h_qemu_get(ROOT, {"vmid": 120, "node": "pve1"})
    assert cfg["bios"] == "ovmf" and cfg["name"] == "deb1223" and cfg["digest"] == _sha1(text)
    assert "bios" not in srv.h_qemu_get(ROOT, {"vmid": 120, "node": "pve1", "current": 1})


def test_vm_pending_description_and_false_pending_delete(srv):
    srv.write_conf("qemu", 130, "#old\nnuma: 0\nname: vm\n\n[PENDING]\n#new\ndelete: numa\n")
    cfg = srv.h_qemu_get(ROOT, {"vmid": 130, "node": "pve1"})
    # load_current_config: the pending description wins; `delete $conf->{$opt} if $conf->{$opt}`
    assert cfg["description"] == "new" and cfg["numa"] == 0


def test_rules_file_read_with_proxmox_s_digest_and_rewritten_as_proxmox_does(srv):
    text = (PVE / "ha/defaults-for-node-affinity-rules.cfg").read_text()
    (srv.pve_root / "ha").mkdir()
    (srv.pve_root / "ha/rules.cfg").write_text(text)
    rules = srv.h_ha_rules(ROOT, {})
    # pve-ha-manager src/test/rules_cfgs/defaults-for-node-affinity-rules.cfg.expect
    assert {r["digest"] for r in rules} == {"c96c9de143221a82e44efa8bb4814b8248a8ea11"}
    assert [(r["rule"], r["order"], r.get("disable"), r.get("strict")) for r in rules] == [
        ("node-affinity-defaults", 1, None, None),
        ("node-affinity-disabled", 2, 1, None),
        ("node-affinity-disabled-explicit", 3, 1, None),
        ("node-affinity-strict", 4, None, 1),
    ]
    srv.h_ha_rule_delete(ROOT, {"rule": "node-affinity-defaults"})
    assert (srv.pve_root / "ha/rules.cfg").read_text() == (
        "node-affinity: node-affinity-disabled\n\tdisable\n\tnodes node2\n\tresources vm:102\n\n"
        "node-affinity: node-affinity-disabled-explicit\n\tdisable\n\tnodes node2\n\tresources vm:103\n\n"
        "node-affinity: node-affinity-strict\n\tnodes node3\n\tresources vm:104\n\tstrict 1\n\n"
    )


def test_mapping_api_takes_a_whole_device_path_and_writes_proxmox_s_file(srv):
    line = "id=10DE:27B0,iommugroup=16,node=pve1,path=0000:07:00,subsystem-id=10de:16fa"
    assert fmt_map_array([line]) == [line]
    with pytest.raises(ItemErrors):
        fmt_map_array(["id=10de:27b0,node=pve1,path=07:00"])  # the domain is required
    srv.h_mapping_create(ROOT, {"id": "gpu", "map": [line], "description": "one GPU"})
    assert srv.mapping_path().read_text() == f"gpu\n\tmap {line}\n\tdescription one GPU\n\n"
