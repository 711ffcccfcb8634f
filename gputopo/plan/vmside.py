"""The VM side of a node's plan: its PCI mappings (and the others shrunk off the containers'
GPUs when the spec says so) and the configs of the VMs that consume them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gputopo.actions import NVIDIA, Rebind
from gputopo.model.facts import Facts, Gpu
from gputopo.model.owner import Owner
from gputopo.model.state import CurrentState
from gputopo.plan.findings import Findings
from gputopo.plan.mappings import mapping_changes, shrink_other_mappings
from gputopo.plan.model import MappingTarget
from gputopo.plan.spec import Container, Node, VmMapping
from gputopo.plan.vm.consumers import VmPlan, plan_consumers
from gputopo.plan.vm.safety import MapView
from gputopo.plan.vm.sets import consumer_sets, map_order


@dataclass(frozen=True)
class NodeChoice:
    """What the VM side plans from: the spec's node, its containers and VM mappings by owner, the
    GPUs each owner gets and each GPU's owner, the node's current state and the rebinds."""

    spec_node: Node
    cts: dict[Owner, Container]
    vms: dict[Owner, VmMapping]
    selected: dict[Owner, list[Gpu]]
    owner_of: dict[str, Owner]
    current: CurrentState
    rebinds: list[Rebind]


def vm_side(
    facts: Facts, c: NodeChoice, found: Findings
) -> tuple[dict[str, MappingTarget], list[Any], set[str], MapView, VmPlan]:
    """The VM side of the plan: the mappings (:func:`_mappings`) and the consumers' configs, each
    consumer's GPUs picked from its mapping's (:func:`consumer_sets`)."""
    consumers = c.spec_node.vms.consumers
    by_name = {m.name.lower(): c.selected.get(o, []) for o, m in c.vms.items()}
    sets = consumer_sets(consumers, by_name, facts.nics)
    mappings, mapping_actions, changed, view = _mappings(c, sets)
    return (
        mappings,
        mapping_actions,
        changed,
        view,
        plan_consumers(consumers, facts, c.current, view, found, sets),
    )


def _mappings(c: NodeChoice, sets: Any) -> tuple[dict[str, MappingTarget], list[Any], set[str], MapView]:
    """(mapping id -> its target, the mapping steps, the ids of the mappings changed, the view of
    the mappings before and after): the node's VM mappings, and the other mappings shrunk off
    the containers' GPUs when the spec says so."""
    spec_node, cts, vms, selected, owner_of, current, rebinds = (
        c.spec_node,
        c.cts,
        c.vms,
        c.selected,
        c.owner_of,
        c.current,
        c.rebinds,
    )
    node_name = spec_node.name
    consumers = spec_node.vms.consumers
    orders = {m.name: map_order(consumers, sets, m.name) for m in vms.values()}
    mappings, mapping_actions, changed_mappings = mapping_changes(
        node_name, cts, vms, selected, current, orders
    )
    ct_gpus = {a for a, o in owner_of.items() if o.is_container}
    if spec_node.vms.other_mappings == "shrink":
        shrunk, shrink_actions, shrunk_ids = shrink_other_mappings(node_name, set(mappings), current, ct_gpus)
        mappings.update(shrunk)
        mapping_actions += shrink_actions
        changed_mappings |= shrunk_ids
    view = MapView(
        node=node_name,
        before={mid: list(m.map) for mid, m in current.mappings.items()},
        after={
            **{mid: list(m.map) for mid, m in current.mappings.items() if mid not in mappings},
            **{mid: list(m.map) for mid, m in mappings.items() if m.map},
        },
        owner_of=owner_of,
        to_container={r.address for r in rebinds if r.to_driver == NVIDIA},
        managed={m.name for m in spec_node.vms.mappings},
    )
    return mappings, mapping_actions, changed_mappings, view
