"""The VMs of ``vms.consumers``: their ``hostpciN`` lines, placement and firmware window, the
config update that writes them, and what stops and starts for it. Pure.

Only what gputopo owns is touched: the ``hostpciN`` lines that name the consumer's mapping (or
its ``repoint_to``), ``affinity``, ``numa``, ``numa0`` (unless the VM has a NUMA topology of
its own), ``hugepages`` when the spec sets it, and the ``X-PciMmio64Mb`` entry of ``args``.
Other ``hostpciN`` lines keep their index; new lines take the lowest free indices. The config
gputopo would write is checked against what qemu-server refuses only at VM start
(:func:`gputopo.formats.qemuconf.start_problems`) before any plan is made of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gputopo.actions import UpdateVmConfig
from gputopo.errors import PveFormatError
from gputopo.formats.hostpci import (
    MAX_HOSTPCI,
    format_hostpci,
    hostpci_index,
    hostpci_key,
    hostpci_keys,
    parse_hostpci,
)
from gputopo.formats.qemuconf import check_qemu_option, start_problems
from gputopo.model.facts import Facts, Gpu
from gputopo.model.state import CurrentState, GuestState
from gputopo.plan.findings import Findings
from gputopo.plan.model import VmTarget
from gputopo.plan.placement import explain
from gputopo.plan.vm.perms import check_writer
from gputopo.plan.vm.place import mmio, placement
from gputopo.plan.vm.safety import MapView, owners_text
from gputopo.plan.vm.spec import VmConsumer
from gputopo.plan.vm.tuning import check_firmware, mmio_keys, placement_keys


@dataclass
class VmPlan:
    targets: list[VmTarget] = field(default_factory=list)
    updates: list[UpdateVmConfig] = field(default_factory=list)
    restart: list[int] = field(default_factory=list)  # running VMs whose config changes
    start: list[int] = field(default_factory=list)  # stopped VMs the spec says run
    configs: dict[int, dict[str, Any]] = field(default_factory=dict)  # each consumer's config after the plan


def _lines(
    c: VmConsumer, mid: str, cfg: dict[str, str], n: int
) -> tuple[dict[str, str], list[str], str | None]:
    """(the hostpciN lines to have, the ones to delete, why it cannot) for ``n`` GPUs of ``mid``."""
    props = {"mapping": mid}
    if c.pcie:
        props["pcie"] = "1"
    if not c.rombar:
        props["rombar"] = "0"
    if c.x_vga:
        props["x-vga"] = "1"
    value = format_hostpci(props)
    names = {c.mapping.lower(), mid.lower(), (c.repoint_to or mid).lower()}
    owned, others = [], []
    for key, v in cfg.items():
        i = hostpci_index(key)
        if i is None:
            continue
        try:
            mine = parse_hostpci(v).get("mapping", "").lower() in names
        except PveFormatError:
            mine = False
        (owned if mine else others).append(i)
    free = [i for i in range(MAX_HOSTPCI) if i not in owned and i not in others]
    slots = (sorted(owned) + free)[:n]
    if len(slots) < n:
        return {}, [], f"needs {n} hostpci line(s), but only {len(slots)} of {MAX_HOSTPCI} indices are free"
    return (
        {hostpci_key(i): value for i in slots},
        [hostpci_key(i) for i in sorted(owned) if i not in slots],
        None,
    )


def _consumer(
    c: VmConsumer,
    facts: Facts,
    current: CurrentState,
    view: MapView,
    found: Findings,
    out: VmPlan,
    own: list[Gpu] | None = None,
) -> None:
    """Add consumer ``c``'s target, config update, stop and start to ``out``; its refusals and
    warnings to ``found`` (a refused consumer adds nothing to ``out``). ``own``: the GPUs of its
    mapping chosen for it (:mod:`gputopo.plan.vm.sets`)."""
    vm = f"VM {c.vmid}"
    g = current.guests.get(c.vmid)
    if g is None:
        found.refuse(None, f"{vm} does not exist on node {view.node}", "no-such-vm")
        return
    cfg = {k: str(v) for k, v in g.config.items() if k != "digest"}
    mid = _mapping_id(c, view, found)
    if mid is None:
        return
    notes: list[str] = []
    source = _source(c, mid, view, notes, found)
    if source is None:
        return
    target, avail = source
    n = _count(c, target, avail, view, found)
    if n is None:
        return
    start_count = len(found.refusals)
    hostpci, deletes, why = _lines(c, target, cfg, n)
    if why:
        found.refuse(None, f"{vm} {why}", "vm-hostpci")
        return
    want: dict[str, str] = dict(hostpci)
    if n:
        notes.insert(0, _lines_note(hostpci, target))
    gpus = [gg for a in avail if (gg := facts.gpu(a)) is not None]
    mine = _own_set(c, own, n, avail, target, facts, notes) or gpus
    check_firmware(c, cfg, n, found)
    if n:
        placement_keys(c, facts, cfg, mine, want, notes, found)
        mmio_keys(c, cfg, gpus, n, want, notes, found)
    if len(found.refusals) > start_count:
        return
    after = _config_after(c, cfg, want, deletes, found)
    if after is None:
        return
    out.configs[c.vmid] = after
    out.targets.append(_target(c, target, n, facts, mine, gpus, want, notes))
    _config_update(c.vmid, g, want, deletes, current.api_user, found, out)
    if c.start and g.status != "running":
        out.start.append(c.vmid)


def _target(
    c: VmConsumer,
    mapping: str,
    n: int,
    facts: Facts,
    mine: list[Gpu],
    gpus: list[Gpu],
    want: dict[str, str],
    notes: list[str],
) -> VmTarget:
    """What the plan says of consumer ``c``: its mapping, ``n`` GPUs, the NUMA nodes of those it
    is placed by (``mine``), the 64-bit MMIO window ``gpus`` need, its config lines and notes."""
    return VmTarget(
        vmid=c.vmid,
        mapping=mapping,
        gpus=n,
        numa_nodes=placement(facts, mine).nodes,
        mmio64_need=mmio(gpus, n, None, None).need if n else 0,
        config=want,
        notes=notes,
    )


def _config_update(
    vmid: int,
    g: GuestState,
    want: dict[str, str],
    deletes: list[str],
    api_user: str | None,
    found: Findings,
    out: VmPlan,
) -> None:
    """Add the update that sets ``want`` and deletes ``deletes`` in VM ``vmid``'s config
    (nothing when it has them already) to ``out``, and its restart when it runs."""
    cfg = {k: str(v) for k, v in g.config.items() if k != "digest"}
    sets = {k: v for k, v in want.items() if cfg.get(k) != v}
    if sets or deletes:
        check_writer(vmid, sets, deletes, api_user, found)
        out.updates.append(UpdateVmConfig(vmid=vmid, set=sets, delete=deletes, digest=g.config.get("digest")))
        if g.status == "running":
            out.restart.append(vmid)


def _mapping_id(c: VmConsumer, view: MapView, found: Findings) -> str | None:
    """The id of the mapping ``c`` names, as Proxmox spells it; None (refused) when the cluster
    has no such mapping. One the spec manages exists even while it has no GPU (Proxmox has none
    then)."""
    managed = next((m for m in view.managed if m.lower() == c.mapping.lower()), None)
    mid = view.find(c.mapping) or view.find(c.mapping, after=False) or managed
    if mid is None:
        have = ", ".join(sorted(set(view.after) | view.managed)) or "none"
        found.refuse(
            None,
            f"VM {c.vmid}: mapping {c.mapping} is not a mapping of this cluster (have: {have})",
            "no-such-mapping",
        )
    return mid


def _source(
    c: VmConsumer, mid: str, view: MapView, notes: list[str], found: Findings
) -> tuple[str, list[str]] | None:
    """(the mapping its lines name, the addresses left to it there) once mapping ``mid``'s GPUs
    that go to a container are gone, as ``c.when_gpus_leave`` says; None when refused."""
    vm = f"VM {c.vmid}"
    leaving, dirty = view.leaving(mid), view.container_gpus(mid) if view.find(mid) else {}
    gone = {**leaving, **dirty}
    target, avail = view.find(mid) or mid, [a for a in view.paths(mid) if a not in dirty]
    if gone and c.when_gpus_leave == "refuse":
        found.refuse(
            None,
            (
                f"{vm} uses mapping {mid}, whose GPU(s) go to a container ({owners_text(gone)}): set "
                f"when_gpus_leave (remove or repoint) for {vm} in vms.consumers"
            ),
            "vm-mapping",
        )
        return None
    if c.when_gpus_leave == "repoint" and (gone or not avail):
        rid = view.find(c.repoint_to or "")
        if rid is None or view.container_gpus(rid):
            why = "does not exist" if rid is None else "lists container GPUs too"
            found.refuse(None, f"{vm}: cannot repoint to mapping {c.repoint_to}, which {why}", "vm-mapping")
            return None
        notes.append(
            f"mapping {mid} has no GPU left for it: its lines name {rid}"
            if not gone
            else f"GPU(s) of {mid} go to a container ({owners_text(gone)}): its lines now name {rid}"
        )
        return rid, view.paths(rid)
    if gone:
        notes.append(
            f"GPU(s) of {mid} go to a container ({owners_text(gone)}): their hostpci lines are removed"
        )
        return target, [] if dirty else avail
    return target, avail


def _count(c: VmConsumer, target: str, avail: list[str], view: MapView, found: Findings) -> int | None:
    """How many GPUs of ``avail`` it gets: all unless ``c.gpus`` says; fewer than it asks with a
    warning, or None (refused) when ``when_gpus_leave`` is refuse."""
    n = c.gpus or len(avail)
    if n <= len(avail):
        return n
    if c.when_gpus_leave == "refuse":
        found.refuse(
            None,
            f"VM {c.vmid} asks {n} GPU(s) of mapping {target}, which has {len(avail)} on node {view.node}",
            "vm-gpus",
        )
        return None
    found.warn(f"VM {c.vmid} gets {len(avail)} of the {n} GPU(s) it asks from mapping {target}")
    return len(avail)


def _lines_note(hostpci: dict[str, str], target: str) -> str:
    """The note on its hostpciN lines: the value each line really gets (pcie=1 and what else
    applies), not only the mapping."""
    values = sorted(set(hostpci.values()))
    lines = (
        f"{', '.join(hostpci_keys(hostpci))}: {values[0]}"
        if len(values) == 1
        else ", ".join(f"{k}: {hostpci[k]}" for k in hostpci_keys(hostpci))
    )
    return f"{lines}; Proxmox gives each line a free GPU of mapping {target} when the VM starts"


def _own_set(
    c: VmConsumer,
    own: list[Gpu] | None,
    n: int,
    avail: list[str],
    target: str,
    facts: Facts,
    notes: list[str],
) -> list[Gpu] | None:
    """``own``, its own set (vms/sets.py), when it takes part of its mapping, its lines still
    name that mapping and the set is all there (with a note saying so); None otherwise."""
    if not (
        own
        and n == len(own) < len(avail)
        and target.lower() == c.mapping.lower()
        and {g.address for g in own} <= set(avail)
    ):
        return None
    notes.append(
        f"its GPUs: {explain(own, None, facts.nics)}; the map lines of {target} list each consumer's "
        "GPUs in turn, so started in the order of vms.consumers it gets these (Proxmox gives a "
        "line the first free one)"
    )
    return own


def _config_after(
    c: VmConsumer, cfg: dict[str, str], want: dict[str, str], deletes: list[str], found: Findings
) -> dict[str, str] | None:
    """Its config once ``want`` is set and ``deletes`` deleted; None (refused) when qemu-server
    would refuse it. Every key is checked: a line Proxmox cannot parse is dropped on its next
    write of the config."""
    after = {**{k: v for k, v in cfg.items() if k not in deletes}, **want}
    problems = [
        f"unable to parse value of '{k}' - {w}"
        for k, v in sorted(after.items())
        if (w := check_qemu_option(k, v))
    ] + start_problems(after)
    for p in problems:
        found.refuse(None, f"VM {c.vmid}: {p}", "vm-config")
    return None if problems else after


def plan_consumers(
    consumers: list[VmConsumer],
    facts: Facts,
    current: CurrentState,
    view: MapView,
    found: Findings,
    sets: dict[int, list[Gpu]] | None = None,
) -> VmPlan:
    """The :class:`VmPlan` of ``consumers``; refusals and warnings are added to ``found``.
    ``sets``: vmid -> the GPUs of its mapping chosen for it (:mod:`gputopo.plan.vm.sets`)."""
    out = VmPlan()
    for c in consumers:
        _consumer(c, facts, current, view, found, out, (sets or {}).get(c.vmid))
    return out
