"""The HA placement step's pure parts and its reads: what a node reads of the cluster's HA
configuration (nothing outside a cluster, a warning where the login may not read it), what the
node plans, what it leaves out of the plan's signature, and how its undo and its commands put
back what it changed."""

from __future__ import annotations

import shlex
from typing import Any

import pytest

from gputopo.actions.ha import HaChange, PlaceHa, _snapshot, apply_changes, restore_changes
from gputopo.actions.shell import CommandContext
from gputopo.cluster.noderun import apply_node
from gputopo.errors import ProxmoxError
from gputopo.facts.ha import read_ha_config
from gputopo.model.facts import Facts, HostFacts
from gputopo.model.state import ClusterVm, CurrentState, GuestState, HaConfig, MappingState
from gputopo.plan.findings import Findings
from gputopo.plan.ha import ha_step, plan_placement
from gputopo.plan.model import MappingTarget, Plan
from gputopo.plan.spec import parse_spec
from gputopo.ports import ExecResult
from gputopo.usecases.readplan import read_and_plan
from helpers import applysim
from helpers.applysim import template  # noqa: F401 (fixtures)


def line(node: str, slot: str = "81", group: int = 25) -> str:
    return f"id=10de:2bb5,iommugroup={group},node={node},path=0000:{slot}:00.0,subsystem-id=10de:204e"


class FakeCluster:
    """A ClusterApiPort answering from data, recording every call; ``denied`` answers the HA
    reads with Proxmox's 403 for a login without Sys.Audit."""

    def __init__(self, nodes: list[str], release: int = 9, denied: bool = False):
        self._nodes = nodes
        self._release = release
        self.denied = denied
        self.calls: list[str] = []
        self.vms: dict[str, dict[int, dict[str, Any]]] = {}
        self.resources = [{"sid": "vm:201", "type": "vm", "state": "started"}]

    def _audit(self, call: str) -> None:
        self.calls.append(call)
        if self.denied:
            raise ProxmoxError(call, 403, "Permission check failed (/, Sys.Audit)")

    def nodes(self) -> list[str]:
        self.calls.append("GET /nodes")
        return list(self._nodes)

    def release(self) -> int:
        self.calls.append("GET /version")
        return self._release

    def ha_resources(self) -> list[dict[str, Any]]:
        self._audit("GET /cluster/ha/resources")
        return self.resources

    def ha_rules(self) -> list[dict[str, Any]]:
        self._audit("GET /cluster/ha/rules")
        return []

    def ha_groups(self) -> list[dict[str, Any]]:
        self._audit("GET /cluster/ha/groups")
        return []

    def node_vms(self, node: str) -> list[dict[str, Any]]:
        self.calls.append(f"GET /nodes/{node}/qemu")
        return [{"vmid": v} for v in self.vms.get(node, {})]

    def vm_config(self, node: str, vmid: int) -> dict[str, Any]:
        self.calls.append(f"GET /nodes/{node}/qemu/{vmid}/config")
        return self.vms[node][vmid]


def test_a_host_outside_a_cluster_reads_nothing_more_and_is_told_nothing():
    api = FakeCluster(["pve1"])
    assert read_ha_config(api) == (None, None)
    assert api.calls == ["GET /nodes"]
    found = Findings()
    assert ha_step("pve1", {}, CurrentState(), {}, found, changing=True) is None
    assert found.warnings == []


def test_a_login_without_sys_audit_gets_no_ha_step_and_a_warning():
    config, why = read_ha_config(FakeCluster(["pve1", "pve2"], denied=True))
    assert config is None
    assert why.startswith("the HA configuration cannot be read (Permission check failed (/, Sys.Audit))")
    found = Findings()
    assert ha_step("pve1", {}, CurrentState(ha_unread=why), {}, found, changing=True) is None
    assert found.warnings == [f"HA placement left alone: {why}"]


def test_a_member_reads_the_ha_configuration_and_the_cluster_vms_with_mapped_devices():
    api = FakeCluster(["pve2", "pve1"])
    api.vms = {
        "pve1": {201: {"hostpci0": "mapping=pro6000-vm,pcie=1", "digest": "x"}},
        "pve2": {202: {"hostpci0": "0000:01:00.0"}, 203: {"name": "no devices"}},
    }
    config, why = read_ha_config(api)
    assert why is None and config.members == ["pve1", "pve2"] and config.release == 9
    assert config.vms == {201: ClusterVm(node="pve1", hostpci=["mapping=pro6000-vm,pcie=1"])}
    assert set(config.resources) == {"vm:201"}


CONFIG = HaConfig(
    release=9,
    members=["pve1", "pve2", "pve3"],
    resources={"vm:201": {"sid": "vm:201"}, "vm:203": {"sid": "vm:203"}, "vm:205": {"sid": "vm:205"}},
    vms={
        201: ClusterVm(node="pve1", hostpci=["mapping=vm,pcie=1"]),
        203: ClusterVm(node="pve3", hostpci=["mapping=vm,pcie=1"]),
        205: ClusterVm(node="pve3", hostpci=["mapping=other"]),
    },
)


def test_a_node_places_the_vms_that_use_its_mappings_anywhere_and_its_own():
    maps = {"vm": [line("pve1"), line("pve2")], "other": [line("pve2"), line("pve3")]}
    changes, _warnings, scope = plan_placement("pve2", {"vm"}, maps, CONFIG)
    # 201 and 203 use pve2's mapping; 205 (pve3's, another mapping) is not pve2's to place
    assert scope == {201, 203}
    assert [(c.op, c.id, c.params["nodes"]) for c in changes] == [
        ("create-rule", "gputopo-vm201", "pve1,pve2"),
        ("create-rule", "gputopo-vm203", "pve1,pve2"),
    ]
    # pve3 manages no mapping: its own VMs only
    changes, _, scope = plan_placement("pve3", set(), maps, CONFIG)
    assert scope == {203, 205}
    assert [(c.id, c.params["nodes"]) for c in changes] == [
        ("gputopo-vm203", "pve1,pve2"),
        ("gputopo-vm205", "pve2,pve3"),
    ]


def test_a_node_plans_from_its_own_lines_as_planned_and_the_others_as_they_are():
    current = CurrentState(
        ha_config=CONFIG,
        guests={201: GuestState(hostpci=["mapping=vm,pcie=1"], config={"hostpci0": "mapping=vm,pcie=1"})},
        mappings={"vm": MappingState(map=[line("pve2"), line("pve1", "91", 29)])},
    )
    found = Findings()
    # pve1's plan drops its line: the VMs keep only pve2 and lose their placement (none yet)
    step = ha_step("pve1", {"vm": MappingTarget(map=[line("pve2")])}, current, {}, found)
    assert step is None
    # pve1's plan keeps its line: pve1 and pve2
    step = ha_step("pve1", {"vm": MappingTarget(map=[line("pve1")])}, current, {}, found)
    assert [c.id for c in step.changes] == ["gputopo-vm201", "gputopo-vm203"]
    # a plan that writes map lines gets the step even when nothing changes as the lines are now
    step = ha_step("pve1", {"vm": MappingTarget(map=[line("pve2")])}, current, {}, found, changing=True)
    assert step is not None and step.changes == [] and "planned again" in step.describe()


def test_the_ha_step_is_left_out_of_the_signature():
    change = HaChange(op="create-rule", id="gputopo-vm201", params={"nodes": "pve1,pve2"})
    bare = Plan(node="pve1", target=[])
    with_ha = Plan(node="pve1", target=[], actions=[PlaceHa(node="pve1", release=9, changes=[change])])
    assert with_ha.signature() == bare.signature()
    assert not with_ha.is_empty  # a plan of only the HA step is still a change


def _rule(rid: str, nodes: str) -> dict[str, Any]:
    vmid = rid.removeprefix("gputopo-vm")
    return {"rule": rid, "type": "node-affinity", "resources": f"vm:{vmid}", "nodes": nodes, "strict": 1}


def rules_of(config: HaConfig) -> dict[str, dict[str, str]]:
    return {r["rule"]: {k: str(v) for k, v in r.items()} for r in config.rules}


def test_undo_puts_back_every_rule_the_step_changed_and_only_those():
    before = HaConfig(
        release=9,
        rules=[
            _rule("gputopo-vm201", "pve1,pve3"),
            _rule("gputopo-vm202", "pve1,pve2"),
            _rule("mine", "pve3"),
        ],
    )
    changes = [
        HaChange(
            op="update-rule",
            id="gputopo-vm201",
            params={"resources": "vm:201", "nodes": "pve1,pve2", "strict": True},
        ),
        HaChange(op="delete-rule", id="gputopo-vm202"),
        HaChange(
            op="create-rule",
            id="gputopo-vm203",
            params={"type": "node-affinity", "resources": "vm:203", "nodes": "pve1,pve2", "strict": True},
        ),
    ]
    after = apply_changes(before, changes)
    step = PlaceHa(node="pve1", release=9, changes=changes)
    journaled = _snapshot(before, {"gputopo-vm201", "gputopo-vm202", "gputopo-vm203"}, set())
    undo = restore_changes(after, journaled)
    assert {(c.op, c.id) for c in undo} == {
        ("update-rule", "gputopo-vm201"),
        ("create-rule", "gputopo-vm202"),
        ("delete-rule", "gputopo-vm203"),
    }
    # every rule as it was, "mine" (not ours) untouched
    assert rules_of(apply_changes(after, undo)) == rules_of(before)
    ctx = CommandContext(Facts(host=HostFacts()), CurrentState(ha_config=before), "pve1")
    for cmd in step.commands(ctx) + step.undo_commands(ctx):
        assert shlex.split(cmd)[0] == "pvesh"
    assert step.undo_commands(ctx)[-1] == "pvesh delete /cluster/ha/rules/gputopo-vm203"


def test_groups_come_back_before_their_resources_and_go_after_them():
    before = HaConfig(release=8, resources={"vm:201": {"sid": "vm:201"}})
    changes = [
        HaChange(op="create-group", id="gputopo-vm201", params={"nodes": "pve1,pve2", "restricted": True}),
        HaChange(op="set-group", id="vm:201", params={"group": "gputopo-vm201"}),
    ]
    after = apply_changes(before, changes)
    assert after.resources["vm:201"]["group"] == "gputopo-vm201"
    undo = restore_changes(after, _snapshot(before, {"gputopo-vm201"}, {"vm:201"}))
    assert [(c.op, c.id) for c in undo] == [("unset-group", "vm:201"), ("delete-group", "gputopo-vm201")]


class Shell:
    def __init__(self):
        self.argv: list[str] = []

    def run(self, node, argv, timeout, input=None):
        self.argv = argv
        return ExecResult(0, '{"status": "no-changes", "steps": []}', "")


def test_cluster_apply_no_ha_is_passed_to_each_node():
    shell = Shell()
    apply_node(shell, "pve1", "sig", "spec", 10.0, ha=False)
    assert shell.argv[-1] == "--no-ha"
    apply_node(shell, "pve1", "sig", "spec", 10.0)
    assert "--no-ha" not in shell.argv


@pytest.mark.slow
def test_a_single_host_plans_no_ha_step_and_says_nothing_of_ha(template, tmp_path):
    host = applysim.copy_host(template, tmp_path / "sim")
    try:
        ports = host.ports()
        spec = parse_spec(applysim.seed_spec_text(host))
        facts, current, plan = read_and_plan(spec, ports, str(host.paths.root))
        assert current.ha_config is None and current.ha_unread is None
        assert plan.actions and not [a for a in plan.actions if a.kind == "ha_placement"]
        assert not [w for w in plan.warnings if "HA" in w]
    finally:
        host.stop()
