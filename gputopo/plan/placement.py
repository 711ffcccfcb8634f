"""Where a container's GPUs should come from: close together on the PCIe tree. Pure.

Tensor parallelism exchanges activations between every pair of GPUs at every layer, so the
slowest pair sets the pace. :func:`choose` picks ``count`` GPUs whose farthest pair is as close
as the host allows, by the distance levels of :mod:`gputopo.topo.distance`: under one switch
(PIX, then PXB), else under one host bridge (PHB), else on one NUMA node (NODE), else anywhere
(SYS). Among groups that fit it takes the smallest, leaving bigger groups whole for the next
owner; ties go to the lowest address, so a host whose GPUs all sit alone behind root ports gets
the lowest addresses as before.
"""

from __future__ import annotations

from collections.abc import Sequence

from gputopo.model.facts import Gpu, address_key
from gputopo.topo.distance import RANK, distance, worst

# The levels to try, closest first; SYS (anything) is the fallback.
TIERS: tuple[str, ...] = ("PIX", "PXB", "PHB", "NODE")


def clusters(gpus: Sequence[Gpu], level: str) -> list[list[Gpu]]:
    """``gpus`` grouped so that GPUs at ``level`` or closer share a group (connected
    components), each group and the list in address order."""
    parent = list(range(len(gpus)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    limit = RANK[level]
    for i in range(len(gpus)):
        for j in range(i + 1, len(gpus)):
            if RANK[distance(gpus[i], gpus[j])] <= limit:
                parent[find(i)] = find(j)
    groups: dict[int, list[Gpu]] = {}
    for i, g in enumerate(gpus):
        groups.setdefault(find(i), []).append(g)
    out = [sorted(grp, key=lambda g: address_key(g.address)) for grp in groups.values()]
    return sorted(out, key=lambda grp: address_key(grp[0].address))


def choose(gpus: Sequence[Gpu], count: int) -> list[Gpu]:
    """``count`` of ``gpus`` as close together as possible (see the module), in address order.

    Returns all of ``gpus`` when there are no more than ``count``.
    """
    ordered = sorted(gpus, key=lambda g: address_key(g.address))
    return sorted(_choose(ordered, count, len(TIERS)), key=lambda g: address_key(g.address))


def _choose(gpus: list[Gpu], count: int, tiers: int) -> list[Gpu]:
    """Choose among ``gpus`` using the first ``tiers`` levels of :data:`TIERS`."""
    if count <= 0:
        return []
    if count >= len(gpus):
        return list(gpus)
    for t in range(tiers):
        fitting = [c for c in clusters(gpus, TIERS[t]) if len(c) >= count]
        if fitting:
            best = min(fitting, key=lambda c: (len(c), address_key(c[0].address)))
            return _fill(best, count, t)
    return _fill(gpus, count, tiers)


def _fill(gpus: list[Gpu], count: int, tiers: int) -> list[Gpu]:
    """``count`` of ``gpus`` (which no tighter group than ``TIERS[tiers]`` holds whole): whole
    groups of the next tighter level, largest first, then the best fit for what is left."""
    if tiers == 0:
        return gpus[:count]
    groups = clusters(gpus, TIERS[tiers - 1])
    out: list[Gpu] = []
    left = count
    while left > 0 and groups:
        fitting = [c for c in groups if len(c) >= left]
        if fitting:
            best = min(fitting, key=lambda c: (len(c), address_key(c[0].address)))
            return out + _choose(best, left, tiers - 1)
        largest = min(groups, key=lambda c: (-len(c), address_key(c[0].address)))
        groups.remove(largest)
        out += largest
        left -= len(largest)
    return out


def spread_warning(vmid: int, gpus: Sequence[Gpu]) -> str | None:
    """The warning for a container whose GPUs span NUMA nodes (their traffic crosses the link
    between sockets: SYS), naming the farthest pair; None when they do not."""
    nodes = sorted({g.numa_node for g in gpus} - {None})
    if len(nodes) < 2:
        return None
    known = [g for g in sorted(gpus, key=lambda g: address_key(g.address)) if g.numa_node is not None]
    pair = next((a, b) for i, a in enumerate(known) for b in known[i + 1 :] if a.numa_node != b.numa_node)
    return (
        f"container {vmid}: GPUs span NUMA nodes {nodes} (cross-socket traffic: "
        f"{pair[0].address} and {pair[1].address} are {distance(*pair)} apart)"
    )


def farthest(gpus: Sequence[Gpu]) -> str:
    """The farthest distance level between any two of ``gpus`` (``X`` for one or none)."""
    return worst([distance(a, b) for i, a in enumerate(gpus) for b in gpus[i + 1 :]])
