"""Topo: the host's PCIe tree with each GPU's owner and the distance matrix, as one
:class:`gputopo.topo.model.TopoReport` (its pictures are drawn from it by the pure
:mod:`gputopo.topo`)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from gputopo.topo.model import TopoReport
from gputopo.usecases.connect import Connection, host_root, pve_root


@dataclass(frozen=True)
class TopoRequest:
    """``gputopo topo``: the root, and ``every``: network adapters and NVMe drives too."""

    conn: Connection
    every: bool = False


def topo(req: TopoRequest) -> TopoReport:
    """The report; owners come from Proxmox's files (``--pve-root``, or the simulated host's).
    Raises RootError for a root without PCI functions or with one outside ``sys/devices``."""
    from gputopo.adapters.pvefiles import PveFiles
    from gputopo.errors import RootError
    from gputopo.facts.discover import discover
    from gputopo.facts.observe import observe
    from gputopo.facts.snapshot import opened_root
    from gputopo.model.reads import EVERY_GUEST
    from gputopo.topo.owners import owners_now
    from gputopo.topo.tree import build_report, unplaced

    root = host_root(req.conn)
    with opened_root(root) as r:
        facts = discover(r)
        if not os.listdir(os.path.join(r, "sys/bus/pci/devices")):
            raise RootError(root, "no PCI functions under sys/bus/pci/devices")
    lost = unplaced(facts)
    if lost:
        raise RootError(root, f"{lost[0]}: sys/bus/pci/devices entry does not lead into sys/devices")
    node = req.conn.node or (facts.host.hostname or "").split(".")[0]
    now = observe(facts, lambda _facts: EVERY_GUEST, proxmox=PveFiles(pve_root(req.conn), node)).current
    return build_report(facts, owners_now(facts, now, node), every=req.every)
