"""The simulated cluster: one /etc/pve for every node, an API on a node that answers for all of
them (driven by the real proxmoxer over HTTPS), cluster locks, the HA manager's API and the
migration precondition."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest
from proxmoxer import ProxmoxAPI
from proxmoxer.core import ResourceException

from gputopo.formats.corosync import parse_corosync_nodes
from gputopo.formats.pcicfg import parse_pci_cfg
from gputopo.sim import state
from gputopo.sim.cluster import SimCluster
from gputopo.sim.host import SimHost
from helpers.clusterharness import cleanup, cluster, copy_cluster, make_template, template  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow  # a simulated cluster per test (seconds each); the full run only


@pytest.fixture(scope="module")
def template9():
    d = make_template("9.1.2", count=2)
    yield d
    cleanup(d.parent)


def api_of(c: SimCluster, node: str = "pve1") -> ProxmoxAPI:
    host = c.start(node)
    creds = host.credentials()
    return ProxmoxAPI(
        "127.0.0.1",
        port=host.api.port,
        user="root@pam",
        password=creds["password"],
        verify_ssl=str(host.api.ca_cert_path),
    )


def _err(fn) -> ResourceException:
    with pytest.raises(ResourceException) as e:
        fn()
    return e.value


def test_one_etc_pve_for_every_node(cluster):
    pve = cluster.dir / "pve"
    assert [
        (n.name, n.nodeid, n.ring0_addr) for n in parse_corosync_nodes((pve / "corosync.conf").read_text())
    ] == [("pve1", 1, "127.0.0.11"), ("pve2", 2, "127.0.0.12"), ("pve3", 3, "127.0.0.13")]
    for i, node in enumerate(cluster.nodes, 1):
        member = cluster.member(node)
        assert member.paths.pve.resolve() == pve.resolve()
        assert (pve / "nodes" / node / "lxc" / f"{100 + i}.conf").is_file()
        assert (pve / "nodes" / node / "qemu-server" / f"{200 + i}.conf").is_file()
        assert (member.paths.root / "proc/sys/kernel/hostname").read_text().strip() == node
        assert state.guest_status(member.paths.run, "lxc", 100 + i) == "running"
    # guest ids are unique in a cluster
    confs = sorted(p.name for p in pve.glob("nodes/*/*/*.conf"))
    assert len(confs) == len(set(confs)) == 6
    (pro6000,) = parse_pci_cfg((pve / "mapping/pci.cfg").read_text())
    assert sorted({e.split("node=")[1].split(",")[0] for e in pro6000.maps}) == ["pve1", "pve2", "pve3"]
    assert len(pro6000.maps) == 24


def test_a_single_host_is_made_as_before(tmp_path):
    host = SimHost.create(tmp_path / "one")
    assert host.info.get("cluster") is None and host.info["vm"] == 201
    assert not (host.paths.pve / "corosync.conf").exists() and not (host.paths.pve / "ha").exists()


def test_the_api_of_one_node_answers_for_every_node(cluster):
    api = api_of(cluster, "pve1")
    assert [n["node"] for n in api.nodes.get()] == ["pve1", "pve2", "pve3"]
    status = api.cluster.status.get()
    assert [(e["name"], e["local"]) for e in status if e["type"] == "node"] == [
        ("pve1", 1),
        ("pve2", 0),
        ("pve3", 0),
    ]
    assert api.nodes("pve2").lxc(102).config.get()["hostname"] == "llm"
    assert [g["vmid"] for g in api.nodes("pve3").qemu.get()] == [203]
    err = _err(lambda: api.nodes("pve2").lxc(101).config.get())  # 101 lives on pve1
    assert "does not exist" in str(err.content)
    err = _err(lambda: api.nodes("pve9").lxc.get())
    assert err.status_code == 500 and "hostname lookup 'pve9' failed" in str(err.content)
    # a task on pve2, started and followed through pve1, runs on pve2
    upid = api.nodes("pve2").lxc(102).status.shutdown.post()
    assert upid.startswith("UPID:pve2:")
    for _ in range(200):
        if api.nodes("pve2").tasks(upid).status.get()["status"] == "stopped":
            break
        time.sleep(0.05)
    assert state.guest_status(cluster.node_dir("pve2") / "run", "lxc", 102) == "stopped"
    assert state.guest_status(cluster.node_dir("pve1") / "run", "lxc", 101) == "running"


def test_migration_precondition_names_nodes_without_the_mapping(cluster):
    api = api_of(cluster, "pve1")
    pre = api.nodes("pve1").qemu(201).migrate.get()
    assert pre["mapped-resources"] == ["hostpci0"] and pre["allowed_nodes"] == []
    assert pre["not_allowed_nodes"] == {
        "pve2": {"unavailable-resources": ["hostpci0"]},
        "pve3": {"unavailable-resources": ["hostpci0"]},
    }
    line = "id=10de:2bb5,iommugroup=25,node={n},path=0000:81:00.0,subsystem-id=10de:204e"
    api.cluster.mapping.pci.post(id="pro6000-vm", map=[line.format(n="pve1"), line.format(n="pve2")])
    pre = api.nodes("pve1").qemu(201).migrate.get()  # asked through pve1, answered by the VM's node
    assert pre["allowed_nodes"] == ["pve2"] and pre["running"] == 0 and pre["local_resources"] == []
    assert pre["not_allowed_nodes"] == {"pve3": {"unavailable-resources": ["hostpci0"]}}
    assert api.nodes("pve2").qemu(202).migrate.get()["allowed_nodes"] == ["pve1"]


def test_mapping_writes_wait_for_the_cluster_lock(cluster):
    api = api_of(cluster, "pve1")
    pve = cluster.dir / "pve"
    lock = pve / "priv" / "lock" / "file-mapping_pci_cfg"
    lock.mkdir(parents=True)
    released = []

    def release() -> None:
        time.sleep(0.4)
        released.append(time.monotonic())
        lock.rmdir()

    t = threading.Thread(target=release)
    t.start()
    api.cluster.mapping.pci.post(id="other", map=["id=10de:2bb5,node=pve3,path=0000:01:00.0"])
    done = time.monotonic()
    t.join()
    assert released and done >= released[0]
    assert [m.id for m in parse_pci_cfg((pve / "mapping/pci.cfg").read_text())] == ["pro6000", "other"]
    assert not (pve / "priv").exists()  # the empty lock directories go again


def test_ha_rules_on_pve9(template9, tmp_path):
    c = copy_cluster(template9, tmp_path / "c9")
    try:
        api = api_of(c)
        api.cluster.ha.rules.post(
            rule="gputopo-vm201",
            type="node-affinity",
            resources="vm:201",
            nodes="pve2,pve1",
            strict=1,
            comment="placed: GPUs",
        )
        assert (c.dir / "pve/ha/rules.cfg").read_text() == (
            "node-affinity: gputopo-vm201\n\tcomment placed%3A GPUs\n\tnodes pve1,pve2\n\tresources vm:201\n"
            "\tstrict 1\n\n"
        )
        (rule,) = api.cluster.ha.rules.get()
        assert (rule["rule"], rule["nodes"], rule["strict"]) == ("gputopo-vm201", "pve1,pve2", 1)
        err = _err(
            lambda: api.cluster.ha.rules.post(
                rule="r2", type="node-affinity", resources="vm:999", nodes="pve1"
            )
        )
        assert "cannot use unmanaged resource(s) vm:999." in str(err.content)
        err = _err(
            lambda: api.cluster.ha.rules.post(
                rule="r2", type="node-affinity", resources="vm:202", nodes="pve9"
            )
        )
        assert "cannot use non-existent node(s) pve9." in str(err.content)
        err = _err(
            lambda: api.cluster.ha.rules.post(
                rule="r2", type="node-affinity", resources="vm:201", nodes="pve1"
            )
        )
        assert err.status_code == 400 and "already used in another node affinity rule" in json.dumps(
            err.errors
        )
        err = _err(lambda: api.cluster.ha.groups.post(group="gx", nodes="pve1"))
        assert "cannot create group: ha groups have been migrated to rules" in str(err.content)
    finally:
        c.stop()


def test_ha_groups_on_pve8(cluster):
    api = api_of(cluster)
    err = _err(lambda: api.cluster.ha.rules.get())
    assert err.status_code == 501
    api.cluster.ha.groups.post(group="gputopo-vm201", nodes="pve2,pve1", restricted=1)
    api.cluster.ha.resources("vm:201").put(group="gputopo-vm201")
    assert (
        cluster.dir / "pve/ha/groups.cfg"
    ).read_text() == "group: gputopo-vm201\n\tnodes pve1,pve2\n\trestricted 1\n\n"
    assert (
        "vm: 201\n\tgroup gputopo-vm201\n\tstate stopped\n"
        in (cluster.dir / "pve/ha/resources.cfg").read_text()
    )
    err = _err(lambda: api.cluster.ha.groups("gputopo-vm201").delete())
    assert "ha group is used by service 'vm:201'" in str(err.content)


def test_sim_create_nodes_on_the_command_line(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "gputopo", "sim", "create", "--nodes", "2", str(tmp_path / "c")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == (
        "created simulated cluster of 2 nodes in "
        + str(tmp_path / "c")
        + ": pve1 (127.0.0.11, CT 101, VM 201), pve2 (127.0.0.12, CT 102, VM 202)"
    )
    assert SimCluster(tmp_path / "c").nodes == ["pve1", "pve2"]
