"""Preflight: every problem that would make a plan fail or harm a workload, found before anything
stops. Changes nothing.

What the plan as a whole needs is checked here (its containers exist, the Proxmox API answers);
everything else is each step's own ``preflight`` (:mod:`gputopo.actions`): IOMMU and drivers for
rebinds, processes holding a moving GPU (from ``<root>/proc``), running VMs outside the plan that
use a moving device, the login's right to change ``devN``, a running container for a drop-in.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from gputopo.actions import Holder, PreflightContext
from gputopo.errors import ProxmoxError
from gputopo.facts.discover import find_holders
from gputopo.model.facts import Facts
from gputopo.model.state import CurrentState
from gputopo.plan.model import Plan
from gputopo.plan.select import pick_node
from gputopo.plan.spec import Spec
from gputopo.ports import Ports


def parse_cgroup_container(text: str) -> int | None:
    """The LXC container a process runs in, from ``/proc/<pid>/cgroup`` text (``0::/lxc/101/ns/..``,
    cgroup v1 ``4:devices:/lxc/101``, or the payload cgroup ``/lxc.payload.101/``); None on the host."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        m = re.search(r"/lxc(?:\.payload)?[./](\d+)(?:/|$)", path)
        if m:
            return int(m.group(1))
    return None


def _read_text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _cmdline(root: str, pid: int) -> str | None:
    try:
        raw = (Path(root) / "proc" / str(pid) / "cmdline").read_bytes()
    except OSError:
        return None
    text = raw.replace(b"\0", b" ").decode(errors="replace").strip()
    return text or None


def read_holders(root: str, paths: list[str]) -> dict[str, list[Holder]]:
    """Device node -> the processes holding it open, with their command line and container."""
    out: dict[str, list[Holder]] = {}
    for path, procs in find_holders(root, paths).items():
        out[path] = [Holder(pid=pid, comm=comm, cmdline=_cmdline(root, pid),
                            container=parse_cgroup_container(_read_text(Path(root) / "proc" / str(pid) / "cgroup")))
                     for pid, comm in procs]
    return out


def drm_nodes(root: str, address: str) -> list[str]:
    """The /dev/dri names (``card1``, ``renderD128``) the kernel's DRM driver made for a device."""
    try:
        names = os.listdir(Path(root) / "sys/bus/pci/devices" / address / "drm")
    except OSError:
        return []
    return sorted(n for n in names if n.startswith(("card", "renderD")))


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
        drm_nodes=lambda address: drm_nodes(root, address),
    )
    for a in p.actions:
        problems += a.preflight(ctx)
    return list(dict.fromkeys(problems))  # one line per problem, in the order found
