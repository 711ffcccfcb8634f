"""The HA placement gputopo writes, on a simulated two-node PVE 9 cluster whose HA manager acts on
its rules (gputopo.sim.pveapi.harules, after pve-ha-manager src/PVE/HA/Manager.pm
next_state_started): once both nodes applied a split with an HA-managed VM consumer each, the
strict rules it wrote never ask the HA manager to move a running passthrough VM; a rule that
does (an operator's) sends the VM to a migration qemu-server refuses, retried every round, and
an HA container to a relocation."""

from __future__ import annotations

import time

import pytest

from gputopo.formats.hacfg import Section, parse_section_config, write_section_config
from gputopo.formats.pcicfg import parse_pci_cfg
from gputopo.sim import state
from gputopo.sim.cluster import SimCluster
from gputopo.sim.pveapi.harules import MOVES
from helpers.clusterharness import CRM, cleanup, copy_cluster
from helpers.clusterharness import ha_applied as _applied
from helpers.clusterharness import run_gputopo as _gputopo

pytestmark = pytest.mark.slow  # a simulated cluster and two node applies (seconds each)


@pytest.fixture(scope="module")
def applied():
    d = _applied(2)
    yield d
    cleanup(d.parent)


@pytest.fixture
def cluster(applied, tmp_path):
    c = copy_cluster(applied, tmp_path / "cluster")
    for node in c.nodes:
        state.write_state(c.node_dir(node) / "run", "latencies", {"ha.crm": CRM})
    yield c
    c.stop()


def _rounds(cluster: SimCluster, n: int) -> None:
    """Let the HA manager run ``n`` rounds (a status read runs one that is due)."""
    api = cluster.start("pve1").api
    for _ in range(n):
        time.sleep(CRM * 1.2)
        for node in cluster.nodes:  # pve1 answers for every node
            api.dispatch("GET", f"/nodes/{node}/qemu/{cluster.vm(node)}/status/current", {}, None)


def _moves(cluster: SimCluster, node: str) -> list[dict]:
    return state.read_state(cluster.node_dir(node) / "run", MOVES, []) or []


def _status(cluster: SimCluster, node: str, kind: str, vmid: int) -> str:
    return state.guest_status(cluster.node_dir(node) / "run", kind, vmid)


def _rules(cluster: SimCluster) -> dict[str, Section]:
    return {s.id: s for s in parse_section_config((cluster.dir / "pve/ha/rules.cfg").read_text())}


def test_the_rules_gputopo_wrote_never_ask_ha_to_move_a_running_passthrough_vm(cluster):
    rules = _rules(cluster)
    assert {r: (s.props["nodes"], s.props["strict"]) for r, s in rules.items()} == {
        "gputopo-vm201": ("pve1,pve2", "1"),
        "gputopo-vm202": ("pve1,pve2", "1"),
    }
    _rounds(cluster, 4)
    for node in cluster.nodes:
        assert _status(cluster, node, "qemu", cluster.vm(node)) == "running"
        assert _moves(cluster, node) == []


def test_a_rule_that_excludes_a_running_passthrough_vms_node_is_a_failed_migration_retried(cluster):
    api = cluster.start("pve1").api
    api.dispatch("PUT", "/cluster/ha/rules/gputopo-vm201", {"rule": "gputopo-vm201", "nodes": "pve2"}, None)
    _rounds(cluster, 4)
    moves = _moves(cluster, "pve1")
    assert len(moves) >= 2, moves  # sent again on the next round
    assert {(m["sid"], m["op"], m["node"], m["target"]) for m in moves} == {
        ("vm:201", "migrate", "pve1", "pve2")
    }
    assert {m["error"] for m in moves} == {
        "can't live migrate running VM which uses following mapped devices: "
        "hostpci0:pro6000-vm, hostpci1:pro6000-vm, hostpci2:pro6000-vm, hostpci3:pro6000-vm"
    }
    # the VM keeps running where it was, its config with it; the other VM is left alone
    assert _status(cluster, "pve1", "qemu", 201) == "running"
    assert (cluster.dir / "pve/nodes/pve1/qemu-server/201.conf").exists()
    assert _moves(cluster, "pve2") == []


def test_an_ha_container_on_a_node_its_rule_excludes_is_relocated(cluster):
    resources = cluster.dir / "pve/ha/resources.cfg"
    sections = parse_section_config(resources.read_text())
    sections.append(Section(type="ct", id="101", props={"state": "started"}))
    resources.write_text(write_section_config(sections))
    api = cluster.start("pve1").api
    assert _status(cluster, "pve1", "lxc", 101) == "running"
    api.dispatch(
        "POST",
        "/cluster/ha/rules",
        {"rule": "ct-away", "type": "node-affinity", "resources": "ct:101", "nodes": "pve2", "strict": 1},
        None,
    )
    _rounds(cluster, 3)
    moves = _moves(cluster, "pve1")
    assert [(m["sid"], m["op"], m["target"], m["error"]) for m in moves] == [
        ("ct:101", "relocate", "pve2", None)
    ]
    # shut down here (PVECT.pm migrate), its config moved, started there; once: it is where its rule says
    assert _status(cluster, "pve1", "lxc", 101) == "stopped"
    assert not (cluster.dir / "pve/nodes/pve1/lxc/101.conf").exists()
    assert (cluster.dir / "pve/nodes/pve2/lxc/101.conf").exists()
    assert _status(cluster, "pve2", "lxc", 101) == "running"


def test_on_three_nodes_a_rule_that_would_exclude_a_running_passthrough_vms_node_is_held_back(tmp_path):
    d = _applied(3)
    cluster = SimCluster(d)
    try:
        # pve3's lines of the mapping go (an operator's change) while VM 203 runs there on them
        api = cluster.start("pve1").api
        m = next(x for x in parse_pci_cfg((d / "pve/mapping/pci.cfg").read_text()) if x.id == "pro6000-vm")
        kept = [e for e in m.maps if "node=pve3" not in e]
        api.dispatch("PUT", "/cluster/mapping/pci/pro6000-vm", {"id": "pro6000-vm", "map": kept}, None)
        cluster.stop()
        res = _gputopo(
            "apply",
            "--spec",
            str(d.parent / "spec.yaml"),
            "--yes",
            "--no-verify",
            "--sim",
            str(cluster.node_dir("pve1")),
        )
        assert res.returncode == 0, res.stderr
        assert (
            "VM 203 runs on pve3 with its GPUs passed through, but HA gputopo-vm203 would allow only pve1, pve2"
            in res.stdout
        )
        rules = _rules(cluster)
        # the others follow the lines; VM 203's rule still allows the node it runs on
        assert {r: s.props["nodes"] for r, s in rules.items()} == {
            "gputopo-vm201": "pve1,pve2",
            "gputopo-vm202": "pve1,pve2",
            "gputopo-vm203": "pve1,pve2,pve3",
        }
        for node in cluster.nodes:
            state.write_state(cluster.node_dir(node) / "run", "latencies", {"ha.crm": CRM})
        _rounds(cluster, 3)
        assert _status(cluster, "pve3", "qemu", 203) == "running"
        assert all(_moves(cluster, node) == [] for node in cluster.nodes)
    finally:
        cluster.stop()
        cleanup(d.parent)
