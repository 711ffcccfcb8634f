"""The HA placement step of a node's plan (:class:`gputopo.actions.ha.PlaceHa`). Pure.

On a member of a cluster whose HA configuration was read (``CurrentState.ha_config``), the
node places the HA-managed VMs of its scope (those anywhere that use a mapping its spec
manages, and its own) on the nodes whose map lines hold their GPUs: this node's lines as
planned, every other node's as they are now, this node's VMs with their configs as planned.
A node outside a cluster gets no step and no word; one whose login may not read the HA
configuration gets no step and a warning. The step plans again when it runs (see its module).
"""

from __future__ import annotations

from typing import Any

from gputopo.actions.ha import PlaceHa
from gputopo.actions.haplace import plan_placement
from gputopo.formats.hostpci import hostpci_keys
from gputopo.formats.mapline import map_node
from gputopo.model.state import CurrentState
from gputopo.plan.findings import Findings
from gputopo.plan.model import MappingTarget


def ha_step(
    node: str,
    mappings: dict[str, MappingTarget],
    current: CurrentState,
    configs: dict[int, dict[str, Any]],
    found: Findings,
    changing: bool = False,
) -> PlaceHa | None:
    """The node's HA placement step, its warnings added to ``found``. ``mappings``: the
    mappings its spec manages, as planned; ``configs``: its VMs' configs as planned (vmid ->
    config; the others as they are). None when nothing changes, unless ``changing`` (the plan
    writes map lines or VM configs): then the step is there even with no change as the other
    nodes' lines are now, since a node of the same rollout that applies at the same time may
    write its lines before this step runs, and each step plans again from what it reads then
    (of two nodes applying at once, the later HA step sees both nodes' lines)."""
    if current.ha_unread:
        found.warn(f"HA placement left alone: {current.ha_unread}")
    config = current.ha_config
    if config is None:
        return None
    lines = {mid: list(m.map) for mid, m in current.mappings.items()}
    for mid, target in mappings.items():
        others = [e for e in lines.get(mid, []) if map_node(e) != node]
        lines[mid] = others + [e for e in target.map if map_node(e) == node]
    own = {}
    for vmid, g in current.guests.items():
        cfg = configs.get(vmid, g.config)
        own[vmid] = [str(cfg[k]) for k in hostpci_keys(cfg)]
    changes, warnings, _scope = plan_placement(node, set(mappings), lines, config, own)
    for w in warnings:
        found.warn(w)
    if not changes and not changing:
        return None
    return PlaceHa(node=node, managed=sorted(mappings), release=config.release, changes=changes)
