"""Where an owner's GPUs should come from: close together on the PCIe tree, where they are now
when that is as close, near a network adapter. Pure.

Tensor parallelism exchanges activations between every pair of GPUs at every layer, so the
slowest pair sets the pace. :func:`choose` picks ``count`` GPUs whose farthest pair is as close
as the host allows, by the distance levels of :mod:`gputopo.topo.distance`: under one switch
(PIX, then PXB), else under one host bridge (PHB), else on one NUMA node (NODE), else anywhere
(SYS). These levels nest (two GPUs under one switch share its root port, host bridge and
node), so the candidates at the closest level that fits are the groups of that level with room,
and every ``count`` of one such group is equally close. Among them:

1. the set that moves the fewest GPUs wins: the owner's GPUs now (``held``) stay where they
   are, since each GPU moved is an unbind, a bind and a restart of its owner for a set that is
   no closer;
2. then the one nearest a network adapter (its GPUs' RDMA goes through the adapter under the
   same switch or root port); for an owner that holds GPUs now, the adapter nearest those;
3. then the smallest group, leaving bigger groups whole for the next owner; the lowest address
   last, so a host whose GPUs all sit alone behind root ports gets the lowest addresses.

Groups are found from each device's :func:`~gputopo.topo.distance.locality_keys` (linear in the
GPUs), not from the distance of every pair.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from gputopo.errors import SpecError
from gputopo.model.facts import Gpu, PciFunction, address_key
from gputopo.topo.distance import RANK, distance, locality_keys, worst
from gputopo.topo.model import LEVELS

# The levels to try, closest first; SYS (anything) is the fallback.
TIERS: tuple[str, ...] = ("PIX", "PXB", "PHB", "NODE")
# A network adapter this close to a GPU is its own (under the same switch or root port).
NIC_LEVEL = "PXB"


def clusters(gpus: Sequence[Gpu], level: str) -> list[list[Gpu]]:
    """``gpus`` grouped so that GPUs at ``level`` or closer share a group (connected
    components), each group and the list in address order."""
    tier = TIERS.index(level) if level in TIERS else len(TIERS)
    parent: dict[object, object] = {}

    def find(k: object) -> object:
        while parent.setdefault(k, k) != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    roots: list[object] = []
    for g in gpus:
        if tier == len(TIERS):
            keys: list[object] = [("all",)]
        elif tier < 3:
            keys = [locality_keys(g)[tier]]
        else:  # NODE: one host bridge, or one known NUMA node across host bridges
            keys = [locality_keys(g)[2]] + ([("numa", g.numa_node)] if g.numa_node is not None else [])
        first = find(keys[0])
        for k in keys[1:]:
            other = find(k)
            if other != first:
                parent[other] = first
        roots.append(keys[0])
    groups: dict[object, list[Gpu]] = {}
    for g, k in zip(gpus, roots):
        groups.setdefault(find(k), []).append(g)
    out = [sorted(grp, key=lambda g: address_key(g.address)) for grp in groups.values()]
    return sorted(out, key=lambda grp: address_key(grp[0].address))


def choose(
    gpus: Sequence[Gpu],
    count: int,
    held: Collection[str] = (),
    nics: Sequence[PciFunction] = (),
) -> list[Gpu]:
    """``count`` of ``gpus`` as close together as possible (see the module), in address order.

    ``held``: the addresses the owner has now (kept when that is as close); ``nics``: the host's
    network adapters. Returns all of ``gpus`` when there are no more than ``count``.
    """
    ordered = sorted(gpus, key=lambda g: address_key(g.address))
    if count <= 0:
        return []
    if count >= len(ordered):
        return ordered
    keep = frozenset(held)
    adapters = _own_nics([g for g in ordered if g.address in keep], nics) or list(nics)
    tier = len(TIERS)
    fitting = [ordered]
    for t, level in enumerate(TIERS):
        found = [c for c in clusters(ordered, level) if len(c) >= count]
        if found:
            tier, fitting = t, found
            break
    best = min(
        fitting,
        key=lambda c: (
            -min(count, _kept(c, keep)),
            _nic_rank(c, adapters),
            len(c),
            address_key(c[0].address),
        ),
    )
    return sorted(_take(best, count, keep, tier - 1, adapters), key=lambda g: address_key(g.address))


def _kept(gpus: Sequence[Gpu], keep: frozenset[str]) -> int:
    return sum(1 for g in gpus if g.address in keep)


def _own_nics(gpus: Sequence[Gpu], nics: Sequence[PciFunction]) -> list[PciFunction]:
    """The adapters under the same switch or root port as one of ``gpus``."""
    return [n for n in nics if any(RANK[distance(g, n)] <= RANK[NIC_LEVEL] for g in gpus)]


def _nic_rank(gpus: Sequence[Gpu], nics: Sequence[PciFunction]) -> int:
    """How far the nearest of ``nics`` is from the farthest of ``gpus`` (0 without adapters)."""
    if not nics:
        return 0
    return min(max(RANK[distance(g, n)] for g in gpus) for n in nics)


def _take(
    pool: list[Gpu], count: int, keep: frozenset[str], tier: int, nics: Sequence[PciFunction]
) -> list[Gpu]:
    """``count`` of ``pool`` (a group no tighter level than ``TIERS[tier + 1]`` holds whole):
    every GPU of ``keep`` it has (or the closest ``count`` of them), then whole groups of
    ``TIERS[tier]`` with kept GPUs, then whole free groups largest first, then the best fit."""
    if count >= len(pool):
        return list(pool)
    mine = [g for g in pool if g.address in keep]
    if len(mine) >= count:
        return choose(mine, count, (), nics)
    if tier < 0:  # one switch: all as close; kept ones first, then the lowest addresses
        return mine + [g for g in pool if g.address not in keep][: count - len(mine)]
    spare = count - len(mine)  # GPUs to add to the kept ones
    groups = clusters(pool, TIERS[tier])
    out: list[Gpu] = []
    partial: list[list[Gpu]] = []
    with_kept = sorted(
        (c for c in groups if _kept(c, keep)),
        key=lambda c: (-_kept(c, keep), len(c), address_key(c[0].address)),
    )
    for c in with_kept:
        extra = len(c) - _kept(c, keep)
        if extra <= spare:
            out += c
            spare -= extra
        else:
            partial.append(c)
    for c in partial:
        k = _kept(c, keep)
        add = min(spare, len(c) - k)
        out += _take(c, k + add, keep, tier - 1, nics)
        spare -= add
    free = [c for c in groups if not _kept(c, keep)]
    while spare > 0 and free:
        fits = [c for c in free if len(c) >= spare]
        if fits:
            best = min(fits, key=lambda c: (_nic_rank(c, nics), len(c), address_key(c[0].address)))
            return out + _take(best, spare, keep, tier - 1, nics)
        largest = min(free, key=lambda c: (-len(c), address_key(c[0].address)))
        free.remove(largest)
        out += largest
        spare -= len(largest)
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
    if len(gpus) < 2:
        return "X"
    for level in TIERS[:3]:
        if len(clusters(gpus, level)) == 1:
            return level
    # across host bridges: NODE only when every GPU is on the same known NUMA node
    nodes = {g.numa_node for g in gpus}
    return "NODE" if len(nodes) == 1 and None not in nodes else "SYS"


def _short(addresses: list[str]) -> str:
    """``0000:3a:00.0, 3b, 3c``: the first address in full, the others by what differs (the
    bus alone for function 0 of device 0 in the same domain)."""
    if not addresses:
        return ""
    first = addresses[0]
    out = [first]
    for a in addresses[1:]:
        if a[:4] == first[:4]:
            out.append(a[5:7] if a.endswith(":00.0") else a[5:])
        else:
            out.append(a)
    return ", ".join(out)


def _bridge_name(kind: str) -> str:
    return {"switch_upstream": "switch", "switch_downstream": "switch port", "root_port": "root port"}.get(
        kind, "bridge"
    )


def _where(gpus: Sequence[Gpu], level: str) -> str:
    """Where ``gpus`` (``level`` apart at most) meet: the switch, bridge, host bridge or node."""
    g = gpus[0]
    if level in ("PIX", "PXB") and g.upstream:
        depth = min(len(x.upstream) for x in gpus)
        common = 0
        while common < depth and all(x.upstream[common].address == g.upstream[common].address for x in gpus):
            common += 1
        i = common - 1
        chain = g.upstream
        if chain[i].kind == "switch_downstream" and i > 0 and chain[i - 1].kind == "switch_upstream":
            i -= 1  # a switch is its upstream port with its downstream ports
        return f"under {_bridge_name(chain[i].kind)} {chain[i].address}"
    if level == "PHB":
        return f"under host bridge {g.host_bridge}"
    nodes = sorted({x.numa_node for x in gpus if x.numa_node is not None})
    if level == "NODE":
        return f"on NUMA node {nodes[0]}"
    return f"across NUMA nodes {', '.join(map(str, nodes))}" if len(nodes) > 1 else "across host bridges"


def nearest_nic(gpus: Sequence[Gpu], nics: Sequence[PciFunction]) -> tuple[PciFunction, str] | None:
    """The network adapter nearest the farthest of ``gpus`` and that level; None without any."""
    if not nics or not gpus:
        return None
    best = min(nics, key=lambda n: (max(RANK[distance(g, n)] for g in gpus), address_key(n.address)))
    return best, worst([distance(g, best) for g in gpus])


def _adapter(nic: PciFunction) -> str:
    """``mlx5_0 (0000:21:00.0)`` for an adapter with a name, else its address."""
    name = getattr(nic, "name", nic.address)
    return nic.address if name == nic.address else f"{name} ({nic.address})"


def nic_warning(
    container: str,
    gpus: Sequence[Gpu],
    elsewhere: Mapping[str, str],
    every_gpu: Sequence[Gpu],
    nics: Sequence[PciFunction],
) -> str | None:
    """The one warning about network adapters for ``container`` (its text, e.g.
    ``container:101``) getting ``gpus``, or None.

    ``elsewhere``: address -> the VM owner (text) of each GPU the plan gives a VM;
    ``every_gpu``: the host's GPUs. GPUDirect RDMA wants a GPU and an adapter under one switch
    (:data:`NIC_LEVEL`), so the warning says, in this order:

    * the split leaves the container's GPUs NODE or SYS from every adapter while the GPUs under
      an adapter's switch (its switch partners) go to a VM: it names the adapter, those GPUs
      and the container's;
    * else, no adapter closer than SYS to the container's farthest GPU.
    """
    if not nics or not gpus:
        return None
    best = min(RANK[distance(g, n)] for g in gpus for n in nics)
    if best >= RANK["NODE"]:
        lost: list[tuple[int, tuple, PciFunction, list[Gpu]]] = []
        for n in nics:
            partners = [g for g in every_gpu if RANK[distance(g, n)] <= RANK[NIC_LEVEL]]
            gone = [g for g in partners if g.address in elsewhere]
            if gone:
                near = min(RANK[distance(g, n)] for g in gpus)
                lost.append((near, address_key(n.address), n, gone))
        if lost:
            near, _, nic, gone = min(lost, key=lambda x: x[:2])
            vms = sorted({elsewhere[g.address] for g in gone})
            mine = sorted(gpus, key=lambda g: address_key(g.address))
            return (
                f"{container}: network adapter {_adapter(nic)} shares its switch with "
                f"{_short([g.address for g in gone])}, which go to {', '.join(vms)}; the container's GPUs "
                f"{_short([g.address for g in mine])} have no adapter closer than {LEVELS[best]} "
                f"({LEVELS[near]} to this one): GPUDirect RDMA needs a GPU and an adapter under one switch"
            )
    nic = nearest_nic(gpus, nics)
    if nic is not None and nic[1] == "SYS":
        return (
            f"{container}: no network adapter closer than SYS to its GPUs (nearest {_adapter(nic[0])}): "
            "RDMA between them and the network would cross sockets"
        )
    return None


def explain(gpus: Sequence[Gpu], held: Collection[str] | None, nics: Sequence[PciFunction] = ()) -> str:
    """Why these GPUs, in one line: ``0000:3a:00.0, 3b, 3c: PIX under switch 0000:38:00.0;
    keeps 2 of 3 in place`` (no ``keeps`` part when ``held`` is None), and the nearest network
    adapter when it is under the same switch or root port."""
    ordered = sorted(gpus, key=lambda g: address_key(g.address))
    level = farthest(ordered)
    where = "one GPU" if len(ordered) == 1 else f"{level} {_where(ordered, level)}"
    text = f"{_short([g.address for g in ordered])}: {where}"
    if held is not None:
        kept = sum(1 for g in ordered if g.address in set(held))
        text += f"; keeps {kept} of {len(ordered)} in place"
    nic = nearest_nic(ordered, nics)
    if nic is not None and RANK[nic[1]] <= RANK[NIC_LEVEL]:
        text += f"; network adapter {_adapter(nic[0])} at {nic[1]}"
    return text


def split(
    gpus: Sequence[Gpu],
    container_now: Collection[str] = (),
    vm_now: Collection[str] = (),
    container_sizes: Collection[int] | None = None,
) -> tuple[list[Gpu], list[Gpu]]:
    """(the container's GPUs, the VM mapping's) for ``--split auto``: every GPU goes to one side.

    The candidates for the container's side are each group of :func:`clusters` at every level
    and, per level, the groups dealt to two sides as evenly as they go (largest first, to the
    lighter side); the other side is the rest. The best split has, in this order: the worse of
    the two sides' farthest pairs as close as possible; the fewest NUMA nodes both sides use;
    the sides' sizes closest; the two farthest pairs closest together; the fewest GPUs changing
    owner (``container_now``, ``vm_now``: the addresses each side has now); the container on the
    lowest address. On a host of two NUMA nodes with GPUs alone behind their root ports (the seed
    host) that is the NUMA split. ``container_sizes``: the GPU counts the container's served
    model runs on (a tensor-parallel size that divides its heads and holds its weights:
    :func:`gputopo.capacity.estimate.min_gpus`); only splits giving it one of them are
    candidates, the container's side grown to the smallest when no cluster has that many.
    Returns ([], gpus) for fewer than two GPUs.
    """
    ordered = sorted(gpus, key=lambda g: address_key(g.address))
    if len(ordered) < 2:
        return [], ordered
    ct_now, vm_now_set = frozenset(container_now), frozenset(vm_now)
    candidates: dict[frozenset[str], list[Gpu]] = {}
    for level in TIERS:
        groups = clusters(ordered, level)
        for c in groups:
            candidates.setdefault(frozenset(g.address for g in c), c)
        if len(groups) > 1:
            sides: tuple[list[Gpu], list[Gpu]] = ([], [])
            for c in sorted(groups, key=lambda c: (-len(c), address_key(c[0].address))):
                min(sides, key=len).extend(c)
            for side in sides:
                candidates.setdefault(frozenset(g.address for g in side), side)

    def score(addrs: frozenset[str]) -> tuple:
        ct = [g for g in ordered if g.address in addrs]
        vm = [g for g in ordered if g.address not in addrs]
        wc, wv = RANK[farthest(ct)], RANK[farthest(vm)]
        shared = {g.numa_node for g in ct} & {g.numa_node for g in vm} - {None}
        moves = sum(1 for g in ct if g.address not in ct_now) + sum(
            1 for g in vm if g.address not in vm_now_set
        )
        return (max(wc, wv), len(shared), abs(len(ct) - len(vm)), wc + wv, moves, address_key(ct[0].address))

    if container_sizes is not None:
        _sized_candidates(ordered, candidates, container_sizes, ct_now)
    ok = container_sizes if container_sizes is not None else range(1, len(ordered))
    best = min((a for a in candidates if 0 < len(a) < len(ordered) and len(a) in ok), key=score)
    return [g for g in ordered if g.address in best], [g for g in ordered if g.address not in best]


def _sized_candidates(
    ordered: list[Gpu],
    candidates: dict[frozenset[str], list[Gpu]],
    sizes: Collection[int],
    now: frozenset[str],
) -> None:
    """Add to ``candidates`` a container side of each allowed size that none has: the GPUs it
    has now first, then by address (the closest set is then among the scored ones only when a
    cluster has that size). Raises SpecError when no size leaves the VM a GPU."""
    usable = sorted(n for n in sizes if 0 < n < len(ordered))
    if not usable:
        why = (
            f"needs {min(sizes)} or more of the {len(ordered)} GPUs: none would be left for the VM"
            if sizes
            else f"does not fit the {len(ordered)} GPUs at any tensor-parallel size"
        )
        raise SpecError("--split", "auto", f"the container's served model {why}")
    have = {len(a) for a in candidates}
    keep_first = sorted(ordered, key=lambda g: (g.address not in now, address_key(g.address)))
    for n in usable:
        if n not in have:
            side = keep_first[:n]
            candidates.setdefault(frozenset(g.address for g in side), side)
