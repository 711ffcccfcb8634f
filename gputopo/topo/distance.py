"""GPU-to-GPU PCIe distance from the facts' PCI chains, in ``nvidia-smi topo -m``'s terms. Pure.

For two devices with chains of bridges below their host bridges (``PciFunction.upstream``):

* ``X``: the same device;
* same host bridge, a common bridge: ``PIX`` when the path between them crosses one bridge at
  most, counting a switch (its upstream port with its downstream ports) as one bridge, as NVML
  does ("all devices that only need traverse a single PCIe switch"); ``PXB`` when it crosses
  more (switches behind a switch);
* same host bridge, no common bridge (different root ports): ``PHB``;
* different host bridges on one NUMA node: ``NODE``; on different or unknown nodes: ``SYS``.

These are the levels of nvidia-smi's documented legend (``nvidia-smi topo -m``; its text is in
:data:`gputopo.topo.model.LEGEND`) and of NVML's ``nvmlGpuTopologyLevel_t`` (SINGLE: "all devices
that only need traverse a single PCIe switch", MULTIPLE: "... need not traverse a host bridge",
HOSTBRIDGE, NODE, SYSTEM). ``nvidia-smi topo -m`` on the ASUS ESC8000A-E12 in ``fixtures/real``
reports exactly this for its four GPUs (NODE within a socket, SYS across), its GPUs to its four
ConnectX-7 functions (NODE, SYS) and PIX for two functions of one NIC.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from gputopo.model.facts import Gpu, PciFunction, Peripheral, address_key
from gputopo.topo.model import LEVELS, DistanceMatrix, MatrixGpu, MatrixNic

RANK = {level: i for i, level in enumerate(LEVELS)}


def _unit(chain: Sequence, i: int) -> str:
    """The switch (or lone bridge) that bridge ``chain[i]`` belongs to: a downstream port belongs
    to the upstream port above it."""
    b = chain[i]
    if b.kind == "switch_downstream" and i > 0 and chain[i - 1].kind == "switch_upstream":
        return chain[i - 1].address
    return b.address


def distance(a: PciFunction, b: PciFunction) -> str:
    """The level between ``a`` and ``b``: one of X, PIX, PXB, PHB, NODE, SYS (see the module)."""
    if a.address == b.address:
        return "X"
    if a.host_bridge is None or b.host_bridge is None or a.host_bridge != b.host_bridge:
        if a.numa_node is not None and a.numa_node == b.numa_node:
            return "NODE"
        return "SYS"
    ca, cb = a.upstream, b.upstream
    k = 0
    while k < len(ca) and k < len(cb) and ca[k].address == cb[k].address:
        k += 1
    if k == 0:
        return "PHB"
    units = {_unit(ca, i) for i in range(k - 1, len(ca))} | {_unit(cb, i) for i in range(k - 1, len(cb))}
    return "PIX" if len(units) <= 1 else "PXB"


def nearest_switch(d: PciFunction) -> str | None:
    """The address of the switch (upstream port) closest above ``d``, or None when ``d`` hangs
    from a root port directly."""
    for b in reversed(d.upstream):
        if b.kind == "switch_upstream":
            return b.address
    return None


def locality_keys(d: PciFunction) -> tuple[Hashable, Hashable, Hashable]:
    """Keys that two devices share exactly when :func:`distance` puts them at ``PIX``, ``PXB``
    or ``PHB`` or closer: the switch (or lone bridge) right above the device, the root port, the
    host bridge. A device without a chain is alone at the first two; one whose host bridge is
    unknown at all three (such a device is NODE at best)."""
    if d.host_bridge is None:
        alone = ("alone", d.address)
        return alone, alone, alone
    chain = d.upstream
    if not chain:  # on the root bus: PHB to everything else under its host bridge
        alone = ("alone", d.address)
        return alone, alone, ("hb", d.host_bridge)
    return (
        ("unit", d.host_bridge, _unit(chain, len(chain) - 1)),
        ("port", d.host_bridge, chain[0].address),
        ("hb", d.host_bridge),
    )


def nic_order(nics: Sequence[Peripheral]) -> list[Peripheral]:
    """The network adapters as the matrix numbers them (NIC0 first): those with an RDMA device
    first, then the others, each part in address order. ``nvidia-smi topo -m`` lists only the
    first part (its NIC legend names RDMA devices), so their numbers agree with it."""
    return sorted(nics, key=lambda n: (not n.rdma, address_key(n.address)))


def matrix(gpus: Sequence[Gpu], nics: Sequence[Peripheral] = ()) -> DistanceMatrix:
    """The distance matrix of ``gpus`` in the order given (GPU0 first) and the network adapters
    ``nics`` (numbered by :func:`nic_order`), with each GPU's NUMA node and local CPUs, and
    notes on what sysfs could not say."""
    ordered = nic_order(nics)
    levels = [[distance(a, b) for b in gpus] for a in gpus]
    nic_levels = [[distance(n, d) for d in [*gpus, *ordered]] for n in ordered]
    notes = []
    unknown = [d.address for d in [*gpus, *ordered] if d.numa_node is None]
    if unknown:
        notes.append(f"NUMA node unknown for {', '.join(unknown)}: across host bridges they count as SYS")
    lost = [d.address for d in [*gpus, *ordered] if d.host_bridge is None]
    if lost:
        notes.append(f"PCI path unknown for {', '.join(lost)}: their distances are SYS or NODE at best")
    return DistanceMatrix(
        gpus=[
            MatrixGpu(index=i, address=g.address, numa_node=g.numa_node, cpus=g.local_cpulist, minor=g.minor)
            for i, g in enumerate(gpus)
        ],
        levels=levels,
        nics=[
            MatrixNic(index=k, name=n.name, address=n.address, numa_node=n.numa_node, rdma=bool(n.rdma))
            for k, n in enumerate(ordered)
        ],
        nic_levels=nic_levels,
        notes=notes,
    )


def worst(levels: Sequence[str]) -> str:
    """The farthest of ``levels`` (``X`` for none)."""
    return max(levels, key=RANK.__getitem__, default="X")
