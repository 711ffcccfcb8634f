"""Which GPUs each owner of the spec gets, and what refuses or warns about that choice. Pure."""

from __future__ import annotations

from gputopo.errors import SpecError
from gputopo.model.facts import NVIDIA_VENDOR, Facts, Gpu, MemberRole, nvidia_gpus
from gputopo.model.owner import Owner
from gputopo.model.state import CurrentState
from gputopo.plan import placement
from gputopo.plan.devices import DEFAULT_LEGACY_MAJORS
from gputopo.plan.findings import Findings
from gputopo.plan.spec import Container, GpuSelector, Node, Spec, VmMapping
from gputopo.topo.distance import RANK, distance
from gputopo.topo.owners import owners_now

VFIO = "vfio-pci"


def pick_node(spec: Spec, facts: Facts, node: str | None) -> Node:
    """The spec's node for this host: ``node`` if given, the only one, or the host's name.

    Raises SpecError when none fits, or when the chosen node is not this host (a host whose
    name is unknown is not checked).
    """
    # Proxmox names a node after the short hostname; a spec node of another name would write
    # mapping lines and guest configs for a node this host is not
    host = (facts.host.hostname or "").split(".")[0]
    if node is None and len(spec.nodes) > 1 and host:
        node = host
    chosen = spec.node(node)
    if host and chosen.name != host:
        raise SpecError(
            "spec",
            f"nodes[{spec.nodes.index(chosen)}].name",
            f"node {chosen.name!r} is not this host, which is {host!r}",
        )
    return chosen


def _select(
    sel: GpuSelector, candidates: list[Gpu], facts: Facts, owner: Owner, found: Findings
) -> list[Gpu]:
    if sel.numa is not None:
        # a node the host does not have is a typo that would silently select no GPU at all
        have = sorted(n.id for n in facts.host.numa_nodes)
        for n in sel.numa:
            if have and n not in have:
                found.refuse(
                    None,
                    f"{owner}: this host has no NUMA node {n} (it has {', '.join(map(str, have))})",
                    "no-such-numa-node",
                )
        return [g for g in candidates if g.numa_node in sel.numa]
    if sel.addresses is not None:
        out = []
        switches = {s.address for s in facts.nvswitches}
        for a in sel.addresses:
            g = facts.gpu(a)
            if g is not None:
                out.append(g)
            elif a in switches:
                found.refuse(a, f"is an NVSwitch, not a GPU ({owner})", "nvswitch")
            else:
                found.refuse(a, f"no such GPU on this host ({owner})", "no-such-gpu")
        return out
    return []  # count: resolved after the explicit selectors


def held_now(facts: Facts, current: CurrentState, node: str) -> dict[Owner, set[str]]:
    """owner -> the addresses it has now: a container the GPUs on nvidia its config grants, a
    VM mapping the GPUs on vfio-pci its ``map`` lines name for ``node``."""
    out: dict[Owner, set[str]] = {}
    for address, view in owners_now(facts, current, node).items():
        for vmid in view.containers:
            out.setdefault(Owner.container(vmid), set()).add(address)
        if view.mapping:
            out.setdefault(Owner.vm(view.mapping), set()).add(address)
    return out


def held_by(held: dict[Owner, set[str]], owners: list[Owner]) -> dict[Owner, set[str]]:
    """``held`` (:func:`held_now`) keyed by ``owners``, the spec's: Proxmox's mapping ids are
    case-insensitive, so a spec's mapping name finds the mapping's GPUs however it is spelt."""
    by_text = {str(o).lower(): addrs for o, addrs in held.items()}
    return {o: by_text[str(o).lower()] for o in owners if str(o).lower() in by_text}


def _count_choice(
    owner: Owner, count: int, free: list[Gpu], held: dict[Owner, set[str]], nics: list, counted: set[Owner]
) -> list[Gpu]:
    """``count`` of ``free`` for ``owner`` (:func:`placement.choose`), leaving the GPUs another
    ``count`` owner has now to that owner when a set as close is found without them."""
    mine = held.get(owner, set())
    theirs = {a for o in counted if o != owner for a in held.get(o, set())} - mine
    best = placement.choose(free, count, mine, nics)
    if theirs & {g.address for g in best}:
        rest = [g for g in free if g.address not in theirs]
        if len(rest) >= count:
            alt = placement.choose(rest, count, mine, nics)
            moves = len({g.address for g in best} - mine), len({g.address for g in alt} - mine)
            if RANK[placement.farthest(alt)] <= RANK[placement.farthest(best)] and moves[1] <= moves[0]:
                return alt
    return best


def assign(
    facts: Facts,
    cts: dict[Owner, Container],
    vms: dict[Owner, VmMapping],
    found: Findings,
    held: dict[Owner, set[str]] | None = None,
) -> tuple[dict[Owner, list[Gpu]], dict[str, Owner]]:
    """(owner -> its GPUs, address -> its owner): numa and address selectors first, then counts
    from what is left (:mod:`placement`: the closest set, the owner's GPUs now kept when that is
    as close; ``held``: owner -> its addresses now), then ``rest``. A GPU claimed twice is
    refused; its first owner is kept."""
    held = held_by(held or {}, [*cts, *vms])
    candidates = nvidia_gpus(facts)
    owners: dict[str, list[Owner]] = {}
    selected: dict[Owner, list[Gpu]] = {}

    def claim(owner: Owner, gpus: list[Gpu]) -> None:
        selected.setdefault(owner, [])
        for g in gpus:
            if g not in selected[owner]:
                selected[owner].append(g)
                owners.setdefault(g.address, []).append(owner)

    explicit = [(o, c.gpus) for o, c in cts.items()] + [
        (o, m.gpus) for o, m in vms.items() if m.gpus != "rest"
    ]
    for owner, sel in explicit:
        claim(owner, _select(sel, candidates, facts, owner, found))
    counted = {owner for owner, sel in explicit if sel.count is not None}
    for owner, sel in explicit:
        if sel.count is not None:
            free = [g for g in candidates if g.address not in owners and not (owner.is_vm and g.boot_vga)]
            if len(free) < sel.count:
                found.refuse(None, f"{owner} wants {sel.count} GPU(s), only {len(free)} unclaimed", "count")
            claim(owner, _count_choice(owner, sel.count, free, held, facts.nics, counted))
    for owner, m in vms.items():
        if m.gpus == "rest":
            rest = []
            for g in candidates:
                if g.address in owners:
                    continue
                if g.boot_vga:
                    found.warn(f"{g.address}: boot VGA device; left with the host, not in {m.name}")
                    continue
                rest.append(g)
            claim(owner, rest)

    for addr, who in sorted(owners.items()):
        if len(who) > 1:
            found.refuse(addr, f"claimed by both {who[0]} and {who[1]}", "double-claim")
    if any(isinstance(sel, GpuSelector) and sel.numa is not None for _, sel in explicit):
        for g in candidates:
            if g.numa_node is None and g.address not in owners:
                found.warn(
                    f"{g.address}: NUMA node unknown; no numa selector matches it (left with the host)"
                )
    return selected, {addr: who[0] for addr, who in owners.items()}


def check_locality(
    facts: Facts,
    selected: dict[Owner, list[Gpu]],
    held: dict[Owner, set[str]],
    spec: Spec,
    found: Findings,
) -> list[str]:
    """One line per owner with GPUs saying why those (:func:`placement.explain`); refuses (policy
    ``locality: strict``) or warns about an owner whose farthest pair is SYS, and warns (one line
    at most, :func:`placement.nic_warning`) about a container left without its closest network
    adapter: the GPUs under the adapter's switch go to a VM, or no adapter is closer than SYS."""
    lines = []
    to_vm = {g.address: str(o) for o, gs in selected.items() if o.is_vm for g in gs}
    for owner, gpus in sorted(selected.items(), key=lambda kv: str(kv[0])):
        if not gpus:
            continue
        lines.append(f"{owner}: {placement.explain(gpus, held.get(owner, set()), facts.nics)}")
        level = placement.farthest(gpus)
        if level == "SYS":
            pair = _sys_pair(gpus)
            text = f"{owner}: its GPUs are SYS apart ({pair[0]} and {pair[1]}: across NUMA nodes or host bridges)"
            if spec.policy.locality == "strict":
                found.refuse(None, f"{text}; locality: strict refuses that", "locality")
            elif owner.is_vm:  # a container's is the NUMA spread warning
                found.warn(text)
        if owner.is_container:
            text = placement.nic_warning(str(owner), gpus, to_vm, facts.gpus, facts.nics)
            if text:
                found.warn(text)
    return lines


def _sys_pair(gpus: list[Gpu]) -> tuple[str, str]:
    ordered = sorted(gpus, key=lambda g: g.address)
    for i, a in enumerate(ordered):
        for b in ordered[i + 1 :]:
            if distance(a, b) == "SYS":
                return a.address, b.address
    return ordered[0].address, ordered[-1].address


def check_vm_gpus(facts: Facts, vm_addresses: set[str], found: Findings) -> None:
    """Refuse every VM GPU that cannot be passed through safely."""
    if vm_addresses and not facts.host.modules.vfio_pci:
        found.warn("vfio-pci module is not loaded; apply will refuse until it is (modprobe vfio-pci)")
    for g in (facts.gpu(a) for a in sorted(vm_addresses)):
        assert g is not None
        if not facts.host.iommu_enabled:
            found.refuse(
                g.address, "IOMMU is off; VM passthrough needs it (amd_iommu/intel_iommu=on)", "iommu-off"
            )
            continue
        if g.boot_vga:
            found.refuse(g.address, "is the boot VGA device; it cannot go to a VM", "boot-vga")
        if g.is_nvswitch:
            found.refuse(g.address, "is an NVSwitch, not a GPU", "nvswitch")
        if g.sriov_numvfs:
            found.refuse(
                g.address, f"has {g.sriov_numvfs} SR-IOV VFs enabled; it must not be unbound", "sriov"
            )
        if g.iommu_group is None:
            found.refuse(g.address, "has no IOMMU group; it cannot be passed to a VM", "no-group")
        for m in g.foreign_members:
            if m.address not in vm_addresses:
                found.refuse(
                    g.address,
                    f"IOMMU group {g.iommu_group} also holds {m.address} (class {m.class_ or '?'}), "
                    "which is not moving with it",
                    "shared-group",
                )


def check_container(
    c: Container,
    owner: Owner,
    gpus: list[Gpu],
    spec: Spec,
    owner_of: dict[str, Owner],
    found: Findings,
    majors: dict[str, int] | None = None,
) -> None:
    """Refuse or warn about what container ``c`` gets: non-NVIDIA GPUs, NUMA spread, unknown
    minors, guessed legacy majors (neither the spec nor ``/proc/devices``, ``majors``, gives
    them), a tensor-parallel size the service cannot use."""
    for g in gpus:
        if g.vendor != NVIDIA_VENDOR:
            found.refuse(g.address, f"is not an NVIDIA GPU; {owner} needs the nvidia driver", "not-nvidia")
    nodes = {g.numa_node for g in gpus} - {None}
    if len(nodes) > 1 and not spec.policy.allow_cross_numa:
        found.warn(placement.spread_warning(c.vmid, gpus))
    for g in gpus:
        if g.numa_node is None:
            found.warn(f"{g.address}: NUMA node unknown (container {c.vmid})")
        for m in g.iommu_members:
            if m.role != MemberRole.BRIDGE and m.driver == VFIO and m.address not in owner_of:
                found.warn(f"{g.address}: group member {m.address} is on vfio-pci (container {c.vmid})")
        if g.minor is None and c.device_mode == "devN":
            found.warn(
                f"{g.address}: /dev/nvidia minor unknown until nvidia binds it; apply adds its device "
                f"to container {c.vmid} after the switch"
            )
        elif g.minor is None:
            found.warn(
                f"{g.address}: /dev/nvidia minor unknown until nvidia binds it; plan again after apply "
                f"to add its device to container {c.vmid}"
            )
    if c.device_mode == "legacy" and gpus:
        guessed = sorted(set(DEFAULT_LEGACY_MAJORS) - set(c.legacy_majors or {}) - set(majors or {}))
        if guessed:
            # these majors are dynamic: a wrong one silently denies the node inside the container
            found.warn(
                f"container {c.vmid}: legacy device lines use guessed char majors for "
                f"{', '.join(f'{k} {DEFAULT_LEGACY_MAJORS[k]}' for k in guessed)}; "
                "set legacy_majors from /proc/devices"
            )
    tp = len(gpus)
    if c.service is None or tp == 0:
        return
    problems = []
    if tp & (tp - 1):
        problems.append("is not a power of two")
    heads = c.service.attention_heads
    if heads and heads % tp:
        problems.append(f"does not divide the {heads} attention heads")
    if problems:
        text = f"container {c.vmid}: tensor parallel {tp} {' and '.join(problems)}"
        if spec.policy.tp_check == "error":
            found.refuse(None, text, "tp")
        else:
            found.warn(text)
