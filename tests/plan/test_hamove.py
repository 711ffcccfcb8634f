"""HA placement never asks the HA manager to move a running VM with passthrough: a rule (PVE 9)
or group (PVE 8) change that would leave such a VM on a node it no longer allows is held back
with a warning (pve-ha-manager src/PVE/HA/Manager.pm next_state_started sends it to migrate,
which qemu-server refuses for a running VM with passthrough, retried every round)."""

from __future__ import annotations

from gputopo.model.state import ClusterVm, HaConfig
from gputopo.plan.ha import plan_placement


def line(node: str, slot: str = "81") -> str:
    return f"id=10de:2bb5,iommugroup=25,node={node},path=0000:{slot}:00.0,subsystem-id=10de:204e"


# VM 203 runs on pve3, whose lines of mapping "vm" are gone: its GPUs are on pve1 and pve2 only
MAPS = {"vm": [line("pve1"), line("pve2")]}


def config(release: int, running: bool, **resource: str) -> HaConfig:
    return HaConfig(
        release=release,
        members=["pve1", "pve2", "pve3"],
        resources={
            "vm:201": {"sid": "vm:201"},
            "vm:203": {"sid": "vm:203", **resource},
        },
        rules=[],
        groups=[],
        vms={
            201: ClusterVm(node="pve1", hostpci=["mapping=vm,pcie=1"], running=True),
            203: ClusterVm(node="pve3", hostpci=["mapping=vm,pcie=1"], running=running),
        },
    )


def _ops(changes) -> list[tuple[str, str, str | None]]:
    return [(c.op, c.id, c.params.get("nodes") or c.params.get("group")) for c in changes]


def test_a_rule_that_would_send_a_running_passthrough_vm_away_is_held_back():
    changes, warnings, _ = plan_placement("pve1", {"vm"}, MAPS, config(9, running=True))
    assert _ops(changes) == [("create-rule", "gputopo-vm201", "pve1,pve2")]
    assert warnings == [
        "VM 203 runs on pve3 with its GPUs passed through, but HA gputopo-vm203 would allow only pve1, "
        "pve2: the HA manager would try to migrate it, which fails for a running VM with passthrough "
        "and is retried every round; left as it is: stop VM 203 (ha-manager set vm:203 --state "
        "stopped) or give pve3 its mapping lines back, then apply again"
    ]


def test_an_update_of_an_existing_rule_is_held_back_too():
    state = config(9, running=True)
    state.rules = [
        {
            "rule": "gputopo-vm203",
            "type": "node-affinity",
            "resources": "vm:203",
            "nodes": "pve1,pve2,pve3",
            "strict": 1,
        }
    ]
    changes, warnings, _ = plan_placement("pve1", {"vm"}, MAPS, state)
    assert all(c.id != "gputopo-vm203" for c in changes) and len(warnings) == 1


def test_a_restricted_group_and_the_resource_put_in_it_are_held_back():
    changes, warnings, _ = plan_placement("pve1", {"vm"}, MAPS, config(8, running=True))
    assert _ops(changes) == [
        ("create-group", "gputopo-vm201", "pve1,pve2"),
        ("set-group", "vm:201", "gputopo-vm201"),
    ]
    assert len(warnings) == 1 and "HA gputopo-vm203 would allow only pve1, pve2" in warnings[0]


def test_a_stopped_vm_or_one_requested_stopped_is_placed_as_before():
    for state in (config(9, running=False), config(9, running=True, state="stopped")):
        changes, warnings, _ = plan_placement("pve1", {"vm"}, MAPS, state)
        assert ("create-rule", "gputopo-vm203", "pve1,pve2") in _ops(changes) and warnings == []
