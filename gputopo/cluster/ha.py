"""HA placement of a cluster's VMs whose GPUs come from a mapping that spans several nodes.

The rules (``gputopo-vm<vmid>``: node-affinity rules on PVE 9, restricted groups on PVE 8) are
:mod:`gputopo.plan.ha`'s, which the cluster shares with every node (the reads
:mod:`gputopo.facts.ha`'s, the files :func:`gputopo.formats.hacfg.ha_files`): each node's own
apply writes the placement of the VMs in its scope (its plan's
:class:`gputopo.actions.ha.PlaceHa` step, journaled and rolled back with the node's other
steps), so ``gputopo cluster apply`` and any other path that runs a node's apply write it the
same way. What the cluster adds is the view of the placement once every node is done
(:func:`gputopo.cluster.plan.plan_cluster`) and its checks (:mod:`gputopo.cluster.verify`).
"""

from __future__ import annotations

from gputopo.actions.ha import HaChange
from gputopo.facts.ha import read_ha
from gputopo.formats.hacfg import GROUPS_CFG, PREFIX, RESOURCES_CFG, RULES_CFG, ha_files
from gputopo.model.state import HaConfig
from gputopo.plan import ha
from gputopo.plan.ha import Placement, ha_changes
from gputopo.plan.model import MappingTarget

HaState = HaConfig  # the name the cluster code and its callers know
RULES, GROUPS, RESOURCES = RULES_CFG, GROUPS_CFG, RESOURCES_CFG


def placements(
    vms: dict[int, tuple[str, list[str]]], mappings: dict[str, MappingTarget], order: list[str]
) -> list[Placement]:
    """Where each VM (vmid -> (its node, its ``hostpciN`` values)) can run, from the mappings as
    they will be (every node's lines) over the nodes in ``order`` (:func:`gputopo.plan.ha.placements`)."""
    return ha.placements(vms, {mid: list(m.map) for mid, m in mappings.items()}, order)


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
