"""``gputopo export``: read the whole node and write it down as a spec, then check the spec by
planning it (edge layer: this is I/O; the spec itself comes from :mod:`gputopo.plan.export`).

The node's containers, VMs and mappings come from the Proxmox API (every guest of the node) or
from Proxmox's files; the inference unit of each container with GPUs from inside it, through
``pct exec`` (only with an API: the files cannot say what runs). A unit goes into the spec only
when planning with it changes nothing more than planning without it (gputopo manages it already).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gputopo.errors import ExecError, ProxmoxError
from gputopo.facts.current import hostpci_values, read_current
from gputopo.facts.guests import read_node_guests
from gputopo.facts.units import read_inference_units
from gputopo.model.facts import Facts
from gputopo.model.state import ContainerState, CurrentState, GuestState, MappingState
from gputopo.plan.export import Exported, export_spec
from gputopo.plan.planner import plan as make_plan
from gputopo.ports import HostFilesPort, Ports
from gputopo.topo.owners import container_minors

def read_node_state(node: str, *, pve_root: str | Path | None = None, ports: Ports | None = None) -> CurrentState:
    """Every container, VM and PCI mapping of ``node``: from the API of ``ports``, else the files.

    Raises ProxmoxError when the API fails.
    """
    if ports is None:
        return read_node_guests(pve_root or "/etc/pve", node)
    px = ports.proxmox
    state = CurrentState()
    for g in px.list_guests("lxc"):
        vmid = int(g["vmid"])
        status = px.guest_status("lxc", vmid)
        state.containers[vmid] = ContainerState(config=px.lxc_config(vmid),
                                                status="running" if status == "running" else "stopped")
    for g in px.list_guests("qemu"):
        vmid = int(g["vmid"])
        try:
            cfg = px.qemu_config(vmid)
        except ProxmoxError:
            continue
        status = px.guest_status("qemu", vmid)
        state.guests[vmid] = GuestState(status="running" if status == "running" else "stopped",
                                        hostpci=hostpci_values(cfg))
    for m in px.mappings(check_node=None):
        state.mappings[m["id"]] = MappingState(map=list(m.get("map") or []), description=m.get("description"),
                                               digest=m.get("digest"))
    return state


def _steps(facts: Facts, ex: Exported, node: str, read: Any) -> list[str]:
    spec = ex.spec
    p = make_plan(facts, spec, read(spec), node=node)
    return [a.describe() for a in p.actions]


def export_host(facts: Facts, node: str, *, pve_root: str | Path | None = None, ports: Ports | None = None,
                files: HostFilesPort | None = None) -> tuple[Exported, list[str]]:
    """(the exported spec, the steps a plan of it would still take: [] when it converges).

    Raises ProxmoxError when the API fails, PlanRefused when the host as it is cannot be planned.
    """
    state = read_node_state(node, pve_root=pve_root, ports=ports)
    by_minor = {g.minor for g in facts.gpus if g.driver == "nvidia" and g.minor is not None}
    units: dict[int, list] = {}
    notes: list[str] = []
    if ports is not None:
        for vmid, ct in sorted(state.containers.items()):
            if ct.status != "running" or not container_minors(ct.config) & by_minor:
                continue
            try:
                units[vmid] = read_inference_units(ports.exec, vmid)
            except ExecError as e:
                notes.append(f"container {vmid}: cannot look inside ({e})")
    else:
        notes.append("the containers' inference units were not looked for (give --sim, --api-url or --local)")

    def read(spec):
        if ports is not None:
            return read_current(spec, facts, proxmox=ports.proxmox, exec=ports.exec, files=ports.files, node=node)
        return read_current(spec, facts, pve_root=pve_root or "/etc/pve", files=files, node=node)

    base = export_spec(facts, state, node, units)
    steps = _steps(facts, base, node, read)
    manage = set()
    for vmid in sorted(units):
        if units[vmid] and len(_steps(facts, export_spec(facts, state, node, units, {vmid}), node, read)) <= len(steps):
            manage.add(vmid)
    ex = export_spec(facts, state, node, units, manage) if manage else base
    ex.notes = notes + ex.notes
    return ex, _steps(facts, ex, node, read) if manage else steps
