"""What ``gputopo export`` reads of a node (edge layer: this is I/O; the spec is made from it by
:mod:`gputopo.plan.export`, which also checks it by planning).

Every container, VM and PCI mapping of the node, through :func:`gputopo.facts.observe.observe`
from the API or Proxmox's files; the inference unit of each running container with GPUs from
inside it, through ``pct exec`` (only with an API: the files cannot say what runs).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gputopo.errors import ExecError
from gputopo.facts.observe import observe
from gputopo.facts.units import read_inference_units
from gputopo.formats.systemctl import InferenceUnit
from gputopo.model.facts import Facts
from gputopo.model.reads import EVERY_GUEST
from gputopo.model.state import CurrentState
from gputopo.ports import ExecPort, ProxmoxReadPort
from gputopo.topo.owners import container_minors


@dataclass
class NodeNow:
    """A node as export reads it: every guest and mapping, the units found in its containers
    (vmid -> units), and what could not be looked at."""

    state: CurrentState
    units: dict[int, list[InferenceUnit]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def read_node(facts: Facts, proxmox: ProxmoxReadPort, exec: ExecPort | None) -> NodeNow:
    """Every guest and mapping of ``proxmox``'s node, and (with ``exec``) the inference units of
    its running containers that hold a GPU. Raises ProxmoxError when the source fails."""
    state = observe(facts, lambda _facts: EVERY_GUEST, proxmox=proxmox).current
    now = NodeNow(state)
    if exec is None:
        now.notes.append(
            "the containers' inference units were not looked for (give --sim, --api-url or --local)"
        )
        return now
    by_minor = {g.minor for g in facts.gpus if g.driver == "nvidia" and g.minor is not None}
    for vmid, ct in sorted(state.containers.items()):
        if ct.status != "running" or not container_minors(ct.config) & by_minor:
            continue
        try:
            now.units[vmid] = read_inference_units(exec, vmid)
        except ExecError as e:
            now.notes.append(f"container {vmid}: cannot look inside ({e})")
    return now
