"""Preflight: every problem that would make a plan fail or harm a workload, found before anything
stops. Changes nothing.

:func:`refuse_other_node` comes first, before anything is read: the Proxmox API must act on the
node whose sysfs and containers this process changes. What the plan as a whole needs is checked
here too (its containers exist, the Proxmox API answers);
everything else is each step's own ``preflight`` (:mod:`gputopo.actions`): IOMMU and drivers for
rebinds, processes holding a moving GPU (from ``<root>/proc``), running VMs outside the plan that
use a moving device, the login's right to change ``devN``, a running container for a drop-in.
"""

from __future__ import annotations

from pathlib import Path

from gputopo.actions import PreflightContext
from gputopo.errors import PreflightError, ProxmoxError
from gputopo.facts.host import node_name
from gputopo.facts.pci import read_drm_nodes
from gputopo.facts.procfs import read_holders
from gputopo.model.facts import Facts
from gputopo.model.state import CurrentState
from gputopo.plan.model import Plan
from gputopo.plan.select import pick_node
from gputopo.plan.spec import Spec
from gputopo.ports import Ports


def refuse_other_node(ports: Ports, root: str) -> None:
    """Raises PreflightError (exit 2, nothing changed) unless the node the API calls name is this
    host and the API serves it. sysfs writes, host files and ``pct`` always act on the machine
    whose root is ``root``; a node elsewhere would get its guests stopped and configured for GPUs
    this host moves. Checked by apply and recover themselves, whoever calls them."""
    host = node_name(root)
    node = ports.proxmox.node
    try:
        served = ports.proxmox.nodes()
    except ProxmoxError as e:
        raise PreflightError(f"cannot use the Proxmox API ({e}); nothing was changed") from None
    if node != host or host not in served:
        raise PreflightError(
            f"the Proxmox API serves node(s) {', '.join(served) or 'none'}, and gputopo would act on node {node}, "
            f"but this host is {host}: sysfs and pct act on this machine only; run it on the node itself "
            "(nothing was changed)"
        )


def preflight(
    p: Plan, facts: Facts, current: CurrentState, spec: Spec, ports: Ports, root: str, node: str | None = None
) -> list[str]:
    """Every problem that would make ``p`` fail or harm a workload, one line each ([] = go).

    A container of the spec that does not exist is the only problem reported: the plan was made
    for a host other than this one, so every other finding would follow from that mistake.
    """
    spec_node = pick_node(spec, facts, node)
    missing = [
        f"container {c.vmid} does not exist on node {spec_node.name}"
        for c in spec_node.containers
        if c.vmid not in current.containers
    ]
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
        facts=facts,
        current=current,
        ports=ports,
        actions=list(p.actions),
        api_ok=api_ok,
        driver_loaded=lambda name: (Path(root) / "sys/bus/pci/drivers" / name).is_dir(),
        holders=lambda paths: read_holders(root, paths),
        drm_nodes=lambda address: read_drm_nodes(root, address),
    )
    for a in p.actions:
        problems += a.preflight(ctx)
    return list(dict.fromkeys(problems))  # one line per problem, in the order found
