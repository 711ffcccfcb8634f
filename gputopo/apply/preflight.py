"""Preflight: every problem that would make a plan fail or harm a workload, found before anything
stops. Changes nothing.

What the plan as a whole needs is checked here (its containers exist, the Proxmox API answers);
everything else is each step's own ``preflight`` (:mod:`gputopo.actions`): IOMMU and drivers for
rebinds, processes holding a moving GPU (from ``<root>/proc``), running VMs outside the plan that
use a moving device, the login's right to change ``devN``, a running container for a drop-in.
"""

from __future__ import annotations

from pathlib import Path

from gputopo.actions import PreflightContext
from gputopo.errors import ProxmoxError
from gputopo.facts.pci import read_drm_nodes
from gputopo.facts.procfs import read_holders
from gputopo.model.facts import Facts
from gputopo.model.state import CurrentState
from gputopo.plan.model import Plan
from gputopo.plan.select import pick_node
from gputopo.plan.spec import Spec
from gputopo.ports import Ports


def preflight(p: Plan, facts: Facts, current: CurrentState, spec: Spec, ports: Ports, root: str,
              node: str | None = None) -> list[str]:
    """Every problem that would make ``p`` fail or harm a workload, one line each ([] = go).

    A container of the spec that does not exist is the only problem reported: the plan was made
    for a host other than this one, so every other finding would follow from that mistake.
    """
    spec_node = pick_node(spec, facts, node)
    missing = [f"container {c.vmid} does not exist on node {spec_node.name}"
               for c in spec_node.containers if c.vmid not in current.containers]
    if missing:
        return missing
    problems: list[str] = []
    try:
        ports.proxmox.version()
        api_ok = True
    except ProxmoxError as e:
        problems.append(f"the Proxmox API is not reachable: {e}")
        api_ok = False
    ctx = PreflightContext(
        facts=facts, current=current, ports=ports, actions=list(p.actions), api_ok=api_ok,
        driver_loaded=lambda name: (Path(root) / "sys/bus/pci/drivers" / name).is_dir(),
        holders=lambda paths: read_holders(root, paths),
        drm_nodes=lambda address: read_drm_nodes(root, address),
    )
    for a in p.actions:
        problems += a.preflight(ctx)
    return list(dict.fromkeys(problems))  # one line per problem, in the order found
