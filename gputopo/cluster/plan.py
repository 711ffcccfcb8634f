"""The plan of a whole cluster: one plan per node, the cluster-wide mappings once, HA placement.

Each node is planned exactly as it plans itself (:func:`gputopo.plan.planner.plan` with its
facts and state): the same actions its own ``gputopo apply`` will find, identified by the plan's
signature (``Plan.signature``), which the rolling apply hands to the node so that it refuses a
plan that changed since it was shown. A mapping is one file for the cluster: its target holds
every planned node's own lines and, for the nodes outside this run, the lines they have now.

HA placement is a step of each node's plan (:class:`gputopo.actions.ha.PlaceHa`, planned from
that node's lines and the others' as they are now, planned again when it runs), so the cluster
has changes exactly when a node's plan has. ``ha`` is the placement once every node of the run
is done (from the merged mappings): what the nodes' steps end with, shown, not run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import Field

from gputopo.cluster.gather import NodeInput
from gputopo.cluster.ha import HaChange, HaState, ha_changes, placements
from gputopo.errors import PlanRefused, Refusal
from gputopo.formats.mapline import map_node
from gputopo.model.facts import Facts
from gputopo.model.state import CurrentState
from gputopo.model.strict import Strict
from gputopo.plan.model import MappingTarget, Plan
from gputopo.plan.planner import plan as make_plan
from gputopo.plan.spec import Spec

#: one node's plan from what was read of it: (facts, spec, current state, node, templates)
PlanNode = Callable[[Facts, Spec, CurrentState, str, "str | None"], Plan]


def plan_node(facts: Facts, spec: Spec, current: CurrentState, node: str, templates: str | None) -> Plan:
    """The planner itself, for a caller that passes no :data:`PlanNode` (tests, tools)."""
    return make_plan(facts, spec, current, node=node, templates=templates)


class NodePlan(Strict):
    node: str
    signature: str
    plan: Plan


class ClusterPlan(Strict):
    nodes: list[NodePlan]
    mappings: dict[str, MappingTarget] = Field(default_factory=dict, description="Every node's lines, once")
    ha: list[HaChange] = Field(default_factory=list)
    ha_release: int | None = None
    warnings: list[str] = Field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        # the HA placement is written by the nodes' own steps: it changes only when a plan does
        return all(n.plan.is_empty for n in self.nodes)

    def node(self, name: str) -> NodePlan:
        return next(n for n in self.nodes if n.node == name)

    def changed_nodes(self) -> list[str]:
        return [n.node for n in self.nodes if not n.plan.is_empty]

    def to_data(self) -> dict[str, Any]:
        """``gputopo cluster plan --json``: the cluster plan, each action and HA change with its
        one-line description, ``no_changes`` for each node and for the whole."""
        data = self.model_dump(mode="json")
        for entry, n in zip(data["nodes"], self.nodes):
            for a, action in zip(entry["plan"]["actions"], n.plan.actions):
                a["description"] = action.describe()
            entry["no_changes"] = n.plan.is_empty
        for entry, change in zip(data["ha"], self.ha):
            entry["description"] = change.describe()
        data["no_changes"] = self.is_empty
        return data

    def to_text(self) -> str:
        """Each node's plan, the mappings once with every map line, the HA changes, a summary."""
        out: list[str] = []
        for n in self.nodes:
            out.append(n.plan.to_text().rstrip("\n"))
            out.append("")
        if self.mappings:
            out.append("Cluster-wide PCI mappings (/etc/pve/mapping/pci.cfg):")
            for mid, m in sorted(self.mappings.items()):
                out.append(
                    f"  {mid}: {len(m.map)} device(s)" + (f"  ({m.description})" if m.description else "")
                )
                out += [f"    map {e}" for e in m.map]
        if self.ha or self.ha_release is not None:
            kind = "rules" if (self.ha_release or 0) >= 9 else "groups"
            out.append(f"HA placement ({kind}) once every node is done (each node's apply writes its part):")
            out += [f"  - {c.describe()}" for c in self.ha] or ["  no changes"]
        if self.warnings:
            out.append("Cluster warnings:")
            out += [f"  - {w}" for w in self.warnings]
        changed = self.changed_nodes()
        if self.is_empty:
            out.append(f"Cluster: no changes on {len(self.nodes)} node(s)")
        else:
            out.append(
                f"Cluster: changes on {len(changed)} of {len(self.nodes)} node(s)"
                + (f" ({', '.join(changed)})" if changed else "")
            )
        return "\n".join(out) + "\n"


def merge_mappings(plans: dict[str, Plan], order: list[str]) -> dict[str, MappingTarget]:
    """Each managed mapping as it will be: every planned node's own lines (in ``order``), then
    the lines of nodes outside the run as they are now."""
    out: dict[str, MappingTarget] = {}
    ids = sorted({mid for p in plans.values() for mid in p.mappings})
    rank = {n: i for i, n in enumerate(order)}
    for mid in ids:
        lines: list[tuple[int, str]] = []
        kept: list[str] | None = None
        description = None
        for node, p in plans.items():
            target = p.mappings.get(mid)
            if target is None:
                continue
            own = [e for e in target.map if map_node(e) == node]
            lines += [(rank.get(node, len(rank)), e) for e in own]
            if kept is None:
                kept = [e for e in target.map if map_node(e) not in plans]
            description = description or target.description
        lines += [(rank.get(map_node(e) or "", len(rank)), e) for e in kept or []]
        out[mid] = MappingTarget(
            map=[e for _, e in sorted(lines, key=lambda x: x[0])], description=description
        )
    return out


def plan_cluster(
    spec: Spec,
    inputs: dict[str, NodeInput],
    order: list[str],
    *,
    ha: HaState | None = None,
    members: list[str] | None = None,
    templates: str | None = None,
    plan_one: PlanNode = plan_node,
) -> ClusterPlan:
    """Plan every node of ``inputs`` (in ``order``), merge the mappings, and (``ha`` given) plan
    the HA placement of the VMs on them over ``members`` (default: ``order``).

    Each node's plan is made by ``plan_one`` from what was read of it (its facts and state in
    ``inputs``): the use cases pass the pure half of their one read-and-plan
    (:func:`gputopo.usecases.readplan.spec_and_plan`), so a node is planned as a single node's
    read-and-plan plans it, the reads staying the cluster's (one round trip per node).

    Raises PlanRefused with every node's refusals, each prefixed with its node.
    """
    plans: dict[str, Plan] = {}
    refusals: list[Refusal] = []
    for node in order:
        i = inputs[node]
        try:
            plans[node] = plan_one(i.facts, spec, i.current, node, templates)
        except PlanRefused as e:
            refusals += [
                Refusal(f"node {node}: {r.address}" if r.address else f"node {node}", r.reason, r.code)
                for r in e.refusals
            ]
    if refusals:
        raise PlanRefused(refusals)
    mappings = merge_mappings(plans, order)
    cplan = ClusterPlan(
        nodes=[NodePlan(node=n, signature=p.signature(), plan=p) for n, p in plans.items()], mappings=mappings
    )
    if ha is not None:
        vms = {vmid: (node, g.hostpci) for node in order for vmid, g in inputs[node].current.guests.items()}
        cplan.ha, cplan.warnings = ha_changes(placements(vms, mappings, members or order), ha, scope=set(vms))
        cplan.ha_release = ha.release
    return cplan
