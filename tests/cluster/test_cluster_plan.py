"""The pure parts of the cluster: HA and corosync formats, merged mappings, HA placement, the
order of a rolling apply, what a node-owned mapping step signs, and a cluster plan made offline
from ``discover --json`` files and Proxmox's files."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gputopo.actions import SetMapping
from gputopo.cluster.gather import parse_version, select_nodes
from gputopo.cluster.ha import HaState, ha_changes, ha_files, placements
from gputopo.cluster.plan import merge_mappings
from gputopo.cluster.rolling import batches
from gputopo.errors import ConfigError, UnknownNode
from gputopo.facts.discover import discover
from gputopo.formats.corosync import parse_corosync_nodes
from gputopo.formats.hacfg import Section, parse_section_config, write_section_config
from gputopo.plan.model import MappingTarget, Plan
from gputopo.plan.spec import parse_spec
from helpers.clusterharness import copy_cluster, spec_text, template  # noqa: F401 (fixtures)

LINE = "id=10de:2bb5,iommugroup={g},node={n},path=0000:{b}:00.0,subsystem-id=10de:204e"


def line(node: str, bus: str = "81", group: int = 25) -> str:
    return LINE.format(n=node, b=bus, g=group)


# --- formats -------------------------------------------------------------------------------

# pve-ha-manager src/test/rules_cfgs/defaults-for-node-affinity-rules.cfg (cases 2 and 4)
RULES = """\
# Case 2: Node Affinity rule is disabled, it shouldn't be enabled afterwards.
node-affinity: node-affinity-disabled
\tresources vm:102
\tnodes node2
\tdisable

node-affinity: node-affinity-strict
\tresources vm:104
\tnodes node3
\tstrict 1
"""


def test_ha_rules_parse_and_write_as_proxmox_does():
    rules = parse_section_config(RULES)
    assert [(s.type, s.id, s.props) for s in rules] == [
        (
            "node-affinity",
            "node-affinity-disabled",
            {"resources": "vm:102", "nodes": "node2", "disable": "1"},
        ),
        ("node-affinity", "node-affinity-strict", {"resources": "vm:104", "nodes": "node3", "strict": "1"}),
    ]
    # SectionConfig write_config: comment, a bare disable, required keys sorted, optional sorted
    assert write_section_config(rules) == (
        "node-affinity: node-affinity-disabled\n\tdisable\n\tnodes node2\n\tresources vm:102\n\n"
        "node-affinity: node-affinity-strict\n\tnodes node3\n\tresources vm:104\n\tstrict 1\n\n"
    )
    group = Section(type="group", id="g1", props={"restricted": "1", "nodes": "pve1,pve2", "comment": "a: b"})
    # Groups.pm has no encode_value for the comment (only Rules.pm encodes one): written as is
    assert write_section_config([group]) == "group: g1\n\tcomment a: b\n\tnodes pve1,pve2\n\trestricted 1\n\n"
    assert parse_section_config(write_section_config([group]))[0].props["comment"] == "a: b"
    with pytest.raises(ValueError, match="missing value for required option 'nodes'"):
        write_section_config([Section(type="group", id="g2")])


def test_corosync_node_list():
    text = """totem {\n  cluster_name: lab\n}\nnodelist {\n  node {\n    name: pve1\n    nodeid: 1\n    quorum_votes: 1
    ring0_addr: 10.0.0.1\n  }\n  node {\n    nodeid: 2\n    name: pve2\n    ring0_addr: 10.0.0.2 # second\n  }\n}\n"""
    assert [(n.name, n.nodeid, n.ring0_addr) for n in parse_corosync_nodes(text)] == [
        ("pve1", 1, "10.0.0.1"),
        ("pve2", 2, "10.0.0.2"),
    ]


def test_version_line():
    assert parse_version("gputopo, version 0.1.0\nPython 3.11.7 (/usr/bin/python3)\n") == "0.1.0"
    assert parse_version("bash: gputopo: command not found") is None


# --- mappings and signatures ----------------------------------------------------------------


def _plan(node: str, maps: dict[str, list[str]]) -> Plan:
    return Plan(
        node=node, target=[], mappings={k: MappingTarget(map=v, description="d") for k, v in maps.items()}
    )


def test_merged_mapping_takes_each_planned_node_own_lines_and_keeps_the_others():
    stale = line("pve2", "91", 29)  # pve1's plan saw an old line of pve2
    plans = {
        "pve1": _plan("pve1", {"vm": [stale, line("pve3"), line("pve1")]}),
        "pve2": _plan("pve2", {"vm": [line("pve1", "e1", 35), line("pve3"), line("pve2")]}),
    }
    merged = merge_mappings(plans, ["pve1", "pve2", "pve3"])
    assert merged["vm"].map == [line("pve1"), line("pve2"), line("pve3")]


def test_a_node_owned_mapping_step_signs_its_own_lines_only():
    a = SetMapping(id="vm", map=[line("pve2"), line("pve1")], create=True, node="pve1", base=[])
    b = SetMapping(
        id="vm", map=[line("pve1"), line("pve3", "e1", 35)], create=False, node="pve1", base=[], digest="abc"
    )
    assert a.signature() == b.signature()
    edited = SetMapping(id="vm", map=[line("pve1")], create=False, node="pve1", base=[line("pve1", "91", 29)])
    assert edited.signature() != a.signature()
    whole = SetMapping(id="vm", map=[line("pve1")], create=True)
    assert whole.signature()["map"] == [line("pve1")]  # a journal of an older version signs everything


# --- HA placement ----------------------------------------------------------------------------


MAPS = {"pro6000-vm": MappingTarget(map=[line("pve1"), line("pve1", "91", 29), line("pve2"), line("pve3")])}
VMS = {
    201: ("pve1", ["mapping=pro6000-vm,pcie=1", "mapping=pro6000-vm,pcie=1"]),
    203: ("pve3", ["mapping=pro6000-vm,pcie=1"]),
    204: ("pve3", ["0000:01:00.0"]),
}


def test_a_vm_can_run_where_its_mappings_have_enough_devices():
    got = {p.vmid: p.nodes for p in placements(VMS, MAPS, ["pve1", "pve2", "pve3"])}
    assert got == {201: ["pve1"], 203: ["pve1", "pve2", "pve3"]}  # 204 has no mapped device


def test_ha_rules_for_vms_on_several_nodes():
    state = HaState(
        release=9,
        resources={"vm:203": {"sid": "vm:203"}, "vm:201": {"sid": "vm:201"}},
        rules=[{"rule": "gputopo-vm999", "type": "node-affinity", "resources": "vm:999", "nodes": "pve1"}],
    )
    changes, warnings = ha_changes(placements(VMS, MAPS, ["pve1", "pve2", "pve3"]), state)
    assert [c.describe() for c in changes] == [
        "create HA rule gputopo-vm203: vm:203 on pve1,pve2,pve3 (strict)",
        "delete HA rule gputopo-vm999",
    ]
    assert warnings == []
    ((path, (before, after)),) = ha_files(state, changes).items()
    assert path == "pve/ha/rules.cfg" and "gputopo-vm999" in before
    assert after == (
        "node-affinity: gputopo-vm203\n\tcomment gputopo%3A nodes with the GPUs of mapping pro6000-vm\n"
        "\tnodes pve1,pve2,pve3\n\tresources vm:203\n\tstrict 1\n\n"
    )


def test_a_run_over_some_nodes_leaves_the_placement_of_other_vms():
    state = HaState(
        release=9,
        resources={"vm:203": {}, "vm:999": {}},
        rules=[{"rule": "gputopo-vm999", "type": "node-affinity", "resources": "vm:999", "nodes": "pve1"}],
    )
    wanted = placements(VMS, MAPS, ["pve1", "pve2", "pve3"])
    changes, _ = ha_changes(wanted, state, scope={201, 203, 204})
    assert [c.op for c in changes] == ["create-rule"]
    changes, _ = ha_changes(wanted, state, scope={201, 203, 204, 999})
    assert [c.op for c in changes] == ["create-rule", "delete-rule"]


def test_ha_leaves_unmanaged_vms_and_foreign_rules_alone():
    wanted = placements(VMS, MAPS, ["pve1", "pve2", "pve3"])
    changes, warnings = ha_changes(wanted, HaState(release=9))
    assert changes == [] and warnings == [
        "VM 203: its GPUs can run on pve1, pve2, pve3 but it is not HA-managed; no placement rule (ha-manager add vm:203)"
    ]
    state = HaState(
        release=9,
        resources={"vm:203": {}},
        rules=[{"rule": "ops", "type": "node-affinity", "resources": "vm:203,vm:1", "nodes": "pve1"}],
    )
    changes, warnings = ha_changes(wanted, state)
    assert changes == [] and warnings == [
        "VM 203: HA rule ops already places it; not adding a placement for pve1, pve2, pve3"
    ]


def test_ha_groups_on_pve8():
    state = HaState(
        release=8,
        resources={"vm:203": {"sid": "vm:203", "state": "stopped"}},
        groups=[{"group": "gputopo-vm203", "nodes": "pve1,pve2", "restricted": 1}],
    )
    changes, _ = ha_changes(placements(VMS, MAPS, ["pve1", "pve2", "pve3"]), state)
    assert [c.describe() for c in changes] == [
        "update HA group gputopo-vm203: on pve1,pve2,pve3 (strict)",
        "put HA resource vm:203 in group gputopo-vm203",
    ]
    files = ha_files(state, changes)
    assert files["pve/ha/resources.cfg"][1] == "vm: 203\n\tgroup gputopo-vm203\n\tstate stopped\n\n"


# --- node selection and order ----------------------------------------------------------------


SPEC3 = parse_spec(
    "apiVersion: gputopo/v1\nkind: GpuTopology\nnodes:\n  - name: pve1\n  - name: pve2\n  - name: pve3\n"
)


def test_node_selection():
    assert select_nodes(SPEC3, None, None) == ["pve1", "pve2", "pve3"]
    assert select_nodes(SPEC3, ["pve3", "pve1"], ["pve1", "pve2", "pve3"]) == ["pve1", "pve3"]
    with pytest.raises(UnknownNode, match=r"unknown node 'pve9': not in the spec \(have pve1, pve2, pve3\)"):
        select_nodes(SPEC3, ["pve9"], None)
    with pytest.raises(
        UnknownNode, match=r"unknown node 'pve3': not a member of the cluster \(have pve1, pve2\)"
    ):
        select_nodes(SPEC3, None, ["pve1", "pve2"])


def test_rolling_order():
    assert batches(["a", "b", "c", "d"], 1, None) == [["a"], ["b"], ["c"], ["d"]]
    assert batches(["a", "b", "c", "d"], 2, "c") == [["c"], ["a", "b"], ["d"]]
    with pytest.raises(UnknownNode):
        batches(["a", "b"], 1, "x")
    with pytest.raises(ConfigError):
        batches(["a"], 0, None)


# --- offline plan ----------------------------------------------------------------------------


@pytest.mark.slow
def test_cluster_plan_offline_from_discover_json(template, tmp_path):
    c = copy_cluster(template, tmp_path / "cluster")
    facts_dir = tmp_path / "facts"
    facts_dir.mkdir()
    for n in c.nodes:
        (facts_dir / f"{n}.json").write_text(discover(str(c.node_dir(n) / "root")).model_dump_json())
    spec = tmp_path / "spec.yaml"
    spec.write_text(spec_text(c, split=["pve1", "pve2"], whole=["pve3"]))
    args = [
        sys.executable,
        "-m",
        "gputopo",
        "cluster",
        "plan",
        "--facts",
        str(facts_dir),
        "--pve-root",
        str(c.dir / "pve"),
        "--spec",
        str(spec),
    ]
    res = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    # from files, services are not read: pve3 (all GPUs kept) has nothing to change
    assert "Cluster: changes on 2 of 3 node(s) (pve1, pve2)" in res.stdout
    block = res.stdout.split("Cluster-wide PCI mappings")[1]
    assert block.count("node=pve1,") == 4 and block.count("node=pve2,") == 4 and "node=pve3," not in block
    only = subprocess.run(args + ["--nodes", "pve2"], capture_output=True, text=True, timeout=120)
    assert only.returncode == 0 and "Node pve1" not in only.stdout and "Node pve2" in only.stdout
    bad = subprocess.run(args + ["--nodes", "pve2,pve7"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2
    assert (
        bad.stderr.strip() == "gputopo: error: unknown node 'pve7': not in the spec (have pve1, pve2, pve3)"
    )
    # the spec from a pipe is read once: the same plan as from the file
    piped = [a if a != str(spec) else "/dev/stdin" for a in args]
    res2 = subprocess.run(piped, input=spec.read_text(), capture_output=True, text=True, timeout=120)
    assert res2.returncode == 0, res2.stderr
    assert res2.stdout == res.stdout.replace(str(spec), "/dev/stdin")


def test_a_gpu_moving_on_one_node_stops_only_that_nodes_vms_of_a_shared_mapping():
    """The same PCI path on another node is another GPU: pve2 rebinding its 0000:81:00.0 stops
    pve2's VM on the shared mapping only when that mapping has a pve2 line for it."""
    from gputopo.model.state import CurrentState, GuestState, MappingState
    from gputopo.plan.restarts import guest_restarts

    node = parse_spec("apiVersion: gputopo/v1\nkind: GpuTopology\nnodes:\n  - name: pve2\n").nodes[0]
    pve1 = "id=10de:2bb5,iommugroup=25,node=pve1,path=0000:81:00.0,subsystem-id=10de:204e"
    pve2 = pve1.replace("node=pve1", "node=pve2")
    vm = GuestState(status="running", hostpci=["mapping=shared,pcie=1"])
    for lines, stops in (([pve1], []), ([pve1, pve2], [301])):
        current = CurrentState(
            mappings={"shared": MappingState(map=lines, digest="d" * 40)}, guests={301: vm}
        )
        got, _ = guest_restarts(node, current, {}, set(), {"0000:81:00.0"})
        assert [s.vmid for s in got] == stops, lines
