"""HA placement of a cluster's VMs whose GPUs come from a mapping that spans several nodes.

The rules (``gputopo-vm<vmid>``: node-affinity rules on PVE 9, restricted groups on PVE 8) are
:mod:`gputopo.actions.haplace`'s, which the cluster shares with every node: each node's own
apply writes the placement of the VMs in its scope (its plan's
:class:`gputopo.actions.ha.PlaceHa` step, journaled and rolled back with the node's other
steps), so ``gputopo cluster apply`` and any other path that runs a node's apply write it the
same way. What the cluster adds is the view of the placement once every node is done
(:func:`gputopo.cluster.plan.plan_cluster`) and its checks (:mod:`gputopo.cluster.verify`).
"""

from __future__ import annotations

from gputopo.actions import haplace
from gputopo.actions.haplace import (
    GROUPS,
    PREFIX,
    RESOURCES,
    RULES,
    HaChange,
    Placement,
    ha_changes,
    ha_files,
    read_ha,
)
from gputopo.model.state import HaConfig
from gputopo.plan.model import MappingTarget

HaState = HaConfig  # the name the cluster code and its callers know


def placements(
    vms: dict[int, tuple[str, list[str]]], mappings: dict[str, MappingTarget], order: list[str]
) -> list[Placement]:
    """Where each VM (vmid -> (its node, its ``hostpciN`` values)) can run, from the mappings as
    they will be (every node's lines) over the nodes in ``order`` (:func:`haplace.placements`)."""
    return haplace.placements(vms, {mid: list(m.map) for mid, m in mappings.items()}, order)


__all__ = [
    "GROUPS",
    "PREFIX",
    "RESOURCES",
    "RULES",
    "HaChange",
    "HaState",
    "Placement",
    "ha_changes",
    "ha_files",
    "placements",
    "read_ha",
]
