"""The topology tree: NUMA node -> host bridge -> root port -> switches -> GPU / NVSwitch (and,
asked for every device, network adapters and NVMe drives). Pure.

Built from the facts' PCI chains (``host_bridge``, ``upstream``) and the owners of
:mod:`gputopo.topo.owners`. A switch is one node (its upstream port): the downstream port a GPU
sits behind is part of that switch, as ``lspci -t`` draws it. Every GPU is its own node, however
many identical ones there are.
"""

from __future__ import annotations

from collections.abc import Mapping

from gputopo.model.facts import Facts, Gpu, MemberRole, PciFunction, Peripheral, address_key
from gputopo.topo.distance import matrix, nic_order
from gputopo.topo.model import (
    FREE,
    Companion,
    DeviceView,
    GpuView,
    OwnerCount,
    OwnerView,
    TopoReport,
    TreeNode,
)


def link_text(g: Gpu) -> str | None:
    """``'32GT/s x16'``; ``'2.5GT/s x16 (max 16GT/s)'`` for a link running below its best."""
    cur = _speed(g.link.current_speed)
    if cur is None:
        return None
    text = f"{cur}GT/s x{g.link.current_width or '?'}"
    best = _speed(g.link.max_speed)
    if best is not None and best != cur:
        text += f" (max {best}GT/s)"
    return text


def _speed(text: str | None) -> str | None:
    """'32.0 GT/s PCIe' -> '32'; '2.5 GT/s PCIe' -> '2.5'; None for anything else."""
    if not text:
        return None
    number = text.split()[0]
    try:
        value = float(number)
    except ValueError:
        return None
    return f"{value:g}"


def short_model(model: str | None) -> str | None:
    """'GB202GL [RTX PRO 6000 Blackwell Server Edition]' -> the name in brackets."""
    if model and model.endswith("]") and "[" in model:
        return model[model.index("[") + 1 : -1]
    return model


def gpu_view(g: Gpu, index: int, owner: OwnerView, gpus: frozenset[str] = frozenset()) -> GpuView:
    """The tree's view of GPU ``g`` (``index``: its place in address order). Its companions are
    its IOMMU group's other non-bridge members, plus (without groups) the other functions of its
    card that are not GPUs themselves (``gpus``: every GPU address; SR-IOV VFs are GPUs)."""
    companions = [
        Companion(address=m.address, role=m.role.value, **{"class": m.class_}, driver=m.driver)
        for m in g.iommu_members
        if m.role != MemberRole.BRIDGE
    ]
    listed = {c.address for c in companions} | gpus
    companions += [Companion(address=a, role="function") for a in g.functions if a not in listed]
    return GpuView(
        index=index,
        address=g.address,
        model=short_model(g.model) or f"{g.vendor}:{g.device}",
        driver=g.driver,
        iommu_group=g.iommu_group,
        minor=g.minor,
        numa_node=g.numa_node,
        link=link_text(g),
        boot_vga=g.boot_vga,
        owner=owner,
        companions=sorted(companions, key=lambda c: address_key(c.address)),
    )


def _host_key(hb: str) -> tuple[int, int]:
    if hb == "?":
        return (1 << 32, 0)
    dom, bus = hb.split(":")
    return int(dom, 16), int(bus, 16)


def _chain_nodes(d: PciFunction) -> list[TreeNode]:
    """The bridge nodes above ``d``: root ports, switches (downstream ports folded into their
    switch) and other bridges, top first."""
    out: list[TreeNode] = []
    up = d.upstream
    for i, b in enumerate(up):
        if b.kind == "switch_downstream" and i > 0 and up[i - 1].kind == "switch_upstream":
            continue
        if b.kind == "root_port":
            out.append(TreeNode(kind="root_port", id=b.address, label=f"root port {b.address}"))
        elif b.kind == "switch_upstream":
            out.append(
                TreeNode(
                    kind="switch", id=b.address, label=f"PCIe switch {b.address}", detail=short_model(b.model)
                )
            )
        else:
            out.append(
                TreeNode(
                    kind="bridge", id=b.address, label=f"bridge {b.address}", detail=b.kind.replace("_", " ")
                )
            )
    return out


def _sort(node: TreeNode) -> None:
    def key(n: TreeNode):
        if n.kind == "host_bridge":
            return _host_key(n.id), 0, 0, 0
        return address_key(n.id) if n.id.count(":") == 2 else (0, 0, 0, 0)

    node.children.sort(key=key)
    for c in node.children:
        _sort(c)


def device_node(d: Peripheral, kind: str, nic: int | None = None) -> TreeNode:
    """The tree's leaf for a network adapter (``kind`` nic, ``nic``: its NIC number) or an NVMe
    drive (nvme): ``NIC0 0000:21:00.0  mlx5_0``, its model and driver as the detail."""
    view = DeviceView(
        kind=kind,
        address=d.address,
        name=d.name,
        nic=nic,
        model=short_model(d.model),
        driver=d.driver,
        numa_node=d.numa_node,
    )
    head = f"NIC{nic}" if kind == "nic" else "NVMe"
    label = f"{head} {d.address}" + (f"  {d.name}" if d.name != d.address else "")
    detail = f"{view.model or f'{d.vendor}:{d.device}'} · {d.driver or 'no driver'}"
    return TreeNode(kind=kind, id=d.address, label=label, detail=detail, device=view)


def build_tree(facts: Facts, owners: Mapping[str, OwnerView], every: bool = False) -> list[TreeNode]:
    """One root per NUMA node holding GPUs or NVSwitches (an unknown node last), each GPU with
    its owner from ``owners`` (free when missing); ``every``: network adapters and NVMe drives
    too, under the same root ports and switches."""
    cpus = {n.id: n.cpulist for n in facts.host.numa_nodes}
    roots: dict[str, TreeNode] = {}
    index = {g.address: i for i, g in enumerate(facts.gpus)}
    all_gpus = frozenset(index)
    devices: list[tuple[PciFunction, TreeNode]] = []
    for g in facts.gpus:
        view = gpu_view(g, index[g.address], owners.get(g.address, FREE), all_gpus)
        devices.append((g, TreeNode(kind="gpu", id=g.address, label=g.address, gpu=view)))
    for s in facts.nvswitches:
        devices.append(
            (
                s,
                TreeNode(
                    kind="nvswitch", id=s.address, label=f"NVSwitch {s.address}", detail=short_model(s.model)
                ),
            )
        )
    if every:
        devices += [(n, device_node(n, "nic", k)) for k, n in enumerate(nic_order(facts.nics))]
        devices += [(d, device_node(d, "nvme")) for d in facts.nvme]
    for d, leaf in devices:
        nid = "?" if d.numa_node is None else str(d.numa_node)
        if nid not in roots:
            detail = None
            if d.numa_node in cpus:
                detail = f"CPUs {cpus[d.numa_node]}" if cpus[d.numa_node] else "no CPUs"
            roots[nid] = TreeNode(
                kind="numa",
                id=f"numa:{nid}",
                label="NUMA node unknown" if nid == "?" else f"NUMA node {nid}",
                detail=detail,
            )
        parent = roots[nid]
        hb = d.host_bridge or "?"
        parent = _child(
            parent,
            TreeNode(
                kind="host_bridge", id=hb, label="host bridge unknown" if hb == "?" else f"host bridge {hb}"
            ),
        )
        for node in _chain_nodes(d):
            parent = _child(parent, node)
        parent.children.append(leaf)
    out = [roots[k] for k in sorted(roots, key=lambda k: (k == "?", int(k) if k != "?" else 0))]
    for r in out:
        _sort(r)
    return out


def _child(parent: TreeNode, node: TreeNode) -> TreeNode:
    """``parent``'s child with ``node``'s id, added when missing."""
    for c in parent.children:
        if c.id == node.id and c.kind == node.kind:
            return c
    parent.children.append(node)
    return node


def owner_counts(views: list[GpuView]) -> list[OwnerCount]:
    """Each owner with its GPU count: containers, then VMs, then free;
    within a kind by key text."""
    counts: dict[str, tuple[OwnerView, OwnerCount]] = {}
    for v in views:
        _, c = counts.setdefault(
            v.owner.key, (v.owner, OwnerCount(key=v.owner.key, label=v.owner.label, gpus=0))
        )
        c.gpus += 1
    return [c for o, c in sorted(counts.values(), key=lambda oc: (oc[0].rank, oc[0].key))]


def gpu_views(tree: list[TreeNode]) -> list[GpuView]:
    """Every GPU of ``tree`` in tree order."""
    return [n.gpu for r in tree for n in r.walk() if n.gpu is not None]


def build_report(facts: Facts, owners: Mapping[str, OwnerView], every: bool = False) -> TopoReport:
    """The tree and the distance matrix of ``facts`` with ``owners`` (``gputopo topo --json``);
    ``every``: the tree shows network adapters and NVMe drives too (``--all``). The matrix
    always has the network adapters, as ``nvidia-smi topo -m`` does."""
    tree = build_tree(facts, owners, every)
    report = TopoReport(
        hostname=facts.host.hostname,
        owners=owner_counts(gpu_views(tree)),
        tree=tree,
        matrix=matrix(facts.gpus, facts.nics),
        warnings=list(facts.warnings),
    )
    if facts.nvswitches:
        report.matrix.notes.append(
            f"{len(facts.nvswitches)} NVSwitch(es): GPUs may also reach each other over NVLink (nvidia-smi's NV#), "
            "which sysfs does not show"
        )
    return report


def unplaced(facts: Facts) -> list[str]:
    """Addresses of GPUs and NVSwitches whose place in the PCI tree is unknown (their sysfs
    link does not lead into ``sys/devices``: a damaged root)."""
    return [d.address for d in [*facts.gpus, *facts.nvswitches] if d.host_bridge is None]
