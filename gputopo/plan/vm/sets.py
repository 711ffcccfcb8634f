"""Which GPUs of a mapping each of its VM consumers should get, and the ``map`` line order that
gives them those. Pure.

Proxmox gives a VM's ``hostpciN: mapping=NAME`` line the first of the mapping's ``map`` lines for
the node whose device is not used yet (qemu-server ``PVE/QemuServer/PCI.pm``,
``choose_hostpci_devices``: it walks the alternatives in their order and reserves the first it
can). So the order of the ``map`` lines decides which GPUs a VM gets: gputopo lists the set it
chose for each consumer in turn, in the order of ``vms.consumers``, then the mapping's other
GPUs. Started in that order (as apply starts them), each VM takes its own set, and its CPUs and
memory are pinned to the NUMA node of that set rather than of the whole mapping.

The sets are chosen like a container's (:func:`gputopo.plan.placement.choose`), the largest
consumer first, so that two consumers do not share a switch while another switch has room.
"""

from __future__ import annotations

from gputopo.model.facts import Gpu, PciFunction, address_key
from gputopo.plan import placement
from gputopo.plan.vm.spec import VmConsumer


def consumer_sets(
    consumers: list[VmConsumer], mapping_gpus: dict[str, list[Gpu]], nics: list[PciFunction]
) -> dict[int, list[Gpu]]:
    """vmid -> the GPUs of its mapping (``mapping_gpus``: mapping name, lowercase -> its GPUs on
    this node) chosen for it, in address order. A consumer left fewer than it asks gets none."""
    by_mapping: dict[str, list[VmConsumer]] = {}
    for c in consumers:
        by_mapping.setdefault(c.mapping.lower(), []).append(c)
    out: dict[int, list[Gpu]] = {}
    for name, cs in by_mapping.items():
        left = sorted(mapping_gpus.get(name, []), key=lambda g: address_key(g.address))
        for c in sorted(cs, key=lambda c: -(c.gpus or len(left))):  # stable: spec order on ties
            n = c.gpus or len(left)
            if not left or n > len(left):
                continue
            chosen = placement.choose(left, n, (), nics)
            out[c.vmid] = chosen
            taken = {g.address for g in chosen}
            left = [g for g in left if g.address not in taken]
    return out


def map_order(consumers: list[VmConsumer], sets: dict[int, list[Gpu]], mapping: str) -> list[str] | None:
    """The addresses of ``mapping`` in the order its ``map`` lines should list them: each
    consumer's set in the order of ``consumers``; None when no consumer has a set (address
    order)."""
    order: list[str] = []
    for c in consumers:
        if c.mapping.lower() == mapping.lower() and c.vmid in sets:
            order += [g.address for g in sets[c.vmid]]
    return order or None
