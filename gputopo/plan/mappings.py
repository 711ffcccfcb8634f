"""The PCI mappings the spec manages: their ``map`` lines for this node, kept for other nodes. Pure."""

from __future__ import annotations

from gputopo.actions import DeleteMapping, SetMapping
from gputopo.formats.mapline import map_node, map_paths, normalize_map_entry
from gputopo.formats.pcicfg import MapEntry, format_map_entry
from gputopo.model.facts import Gpu
from gputopo.model.owner import Owner
from gputopo.model.state import CurrentState, MappingState
from gputopo.plan.model import MappingTarget
from gputopo.plan.spec import Container, VmMapping


def map_entry(gpu: Gpu, node: str) -> str:
    """``id=vvvv:dddd,iommugroup=N,node=<node>,path=<addr>,subsystem-id=vvvv:dddd`` for a GPU.

    Raises PveFormatError when the GPU's ids cannot form a valid entry.
    """
    subsystem = None
    if gpu.subsystem_vendor and gpu.subsystem_device:
        subsystem = f"{_hex(gpu.subsystem_vendor)}:{_hex(gpu.subsystem_device)}"
    return format_map_entry(
        MapEntry(
            id=f"{_hex(gpu.vendor)}:{_hex(gpu.device)}",
            node=node,
            path=gpu.address,
            iommugroup=gpu.iommu_group,
            subsystem_id=subsystem,
        )
    )


def _hex(value: str | None) -> str:
    text = (value or "").lower()
    return text[2:] if text.startswith("0x") else text


def mapping_changes(
    node_name: str,
    cts: dict[Owner, Container],
    vms: dict[Owner, VmMapping],
    selected: dict[Owner, list[Gpu]],
    current: CurrentState,
    orders: dict[str, list[str] | None] | None = None,
) -> tuple[dict[str, MappingTarget], list[SetMapping | DeleteMapping], set[str]]:
    """(every managed mapping's target, the actions, the ids whose ``map`` changes).

    ``orders``: mapping id -> the order its lines for this node must have (its consumers' sets,
    :mod:`gputopo.plan.vm.sets`): a mapping in another order is written again; without one the
    lines are in address order and their order does not matter.
    Entries of other nodes are kept; a description set outside the spec is kept too. Each
    action owns ``node_name``'s lines only and carries the ones it saw (``base``), so that a
    write never loses another node's lines and never overwrites an edit by hand.
    """
    managed: list[tuple[str, list[Gpu], str | None, str]] = [
        (m.name, selected.get(o, []), m.description, "VM passthrough") for o, m in vms.items()
    ] + [(c.mapping, selected.get(o, []), None, f"container {c.vmid}") for o, c in cts.items() if c.mapping]
    mappings: dict[str, MappingTarget] = {}
    actions: list[SetMapping | DeleteMapping] = []
    changed: set[str] = set()
    for mid, gpus, description, purpose in managed:
        cur = current.mappings.get(mid)
        other_nodes = [e for e in (cur.map if cur else []) if map_node(e) != node_name]
        base = [e for e in (cur.map if cur else []) if map_node(e) == node_name]
        order = (orders or {}).get(mid)
        ours = _node_entries(gpus, node_name, order)
        want = other_nodes + ours
        desc = description or (cur.description if cur and cur.description else None)
        if desc is None and ours:
            desc = f"{len(ours)} GPU(s) for {purpose} (gputopo)"
        mappings[mid] = MappingTarget(map=want, description=desc if want else None)
        step, map_changes = _step(mid, cur, want, desc, base, ours, order is not None, node_name)
        if step is not None:
            actions.append(step)
        if map_changes:
            changed.add(mid)
    return mappings, actions, changed


def _node_entries(gpus: list[Gpu], node: str, order: list[str] | None) -> list[str]:
    """The map lines of ``gpus`` for ``node``: in ``order`` (addresses), those it does not name
    last, each group in address order."""
    rank = {a: i for i, a in enumerate(order or [])}
    return [
        map_entry(g, node) for g in sorted(gpus, key=lambda g: (rank.get(g.address, len(rank)), g.address))
    ]


def _step(
    mid: str,
    cur: MappingState | None,
    want: list[str],
    desc: str | None,
    base: list[str],
    ours: list[str],
    ordered: bool,
    node: str,
) -> tuple[SetMapping | DeleteMapping | None, bool]:
    """(the step that makes mapping ``mid``'s lines ``want`` and its description ``desc``, None
    when it already is so; whether its ``map`` changes). ``ordered``: which GPU a VM gets follows
    the order of the node's lines (``ours``), so lines in another order are a change."""
    if not want:
        if cur is None:
            return None, False
        return DeleteMapping(id=mid, digest=cur.digest, node=node, base=base), True
    if cur is None:
        return SetMapping(id=mid, map=want, description=desc, create=True, node=node, base=base), True
    same_map = sorted(map(normalize_map_entry, cur.map)) == sorted(map(normalize_map_entry, want))
    if ordered:
        same_map = same_map and list(map(normalize_map_entry, base)) == list(map(normalize_map_entry, ours))
    if same_map and (cur.description or None) == desc:
        return None, False
    step = SetMapping(
        id=mid, map=want, description=desc, create=False, digest=cur.digest, node=node, base=base
    )
    return step, not same_map


def shrink_other_mappings(
    node_name: str, managed: set[str], current: CurrentState, container_gpus: set[str]
) -> tuple[dict[str, MappingTarget], list[SetMapping | DeleteMapping], set[str]]:
    """(targets, actions, changed ids) for ``vms.other_mappings: shrink``: every mapping the spec
    does not manage loses its map lines for this node's GPUs that a container gets; one left
    with no line is deleted (Proxmox requires at least one)."""
    targets: dict[str, MappingTarget] = {}
    actions: list[SetMapping | DeleteMapping] = []
    for mid, cur in sorted(current.mappings.items()):
        if mid in managed:
            continue
        keep = [
            e
            for e in cur.map
            if not (map_node(e) == node_name and any(p in container_gpus for p in map_paths(e)))
        ]
        if len(keep) == len(cur.map):
            continue
        # like mapping_changes: the step owns this node's lines only and carries those it saw, so
        # another node writing the same mapping meanwhile keeps its lines
        base = [e for e in cur.map if map_node(e) == node_name]
        targets[mid] = MappingTarget(map=keep, description=cur.description if keep else None)
        actions.append(
            SetMapping(
                id=mid,
                map=keep,
                description=cur.description,
                create=False,
                digest=cur.digest,
                node=node_name,
                base=base,
            )
            if keep
            else DeleteMapping(id=mid, digest=cur.digest, node=node_name, base=base)
        )
    return targets, actions, set(targets)
