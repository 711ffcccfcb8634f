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
    NUMA_KEY,
    format_hostpci,
    hostpci_index,
    hostpci_key,
    hostpci_keys,
    parse_hostpci,
    with_mmio64_mb,
)
from gputopo.formats.qemuconf import check_qemu_option, is_q35, memory_mib, start_problems
from gputopo.model.facts import Facts, Gpu
from gputopo.model.state import CurrentState
from gputopo.plan.findings import Findings
from gputopo.plan.model import VmTarget
from gputopo.plan.placement import explain
from gputopo.plan.vm.perms import check_writer
from gputopo.plan.vm.place import gib, mmio, mmio_note, phys_bits_note, placement
from gputopo.plan.vm.safety import MapView, owners_text
from gputopo.plan.vm.spec import VmConsumer


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
    vm = f"VM {c.vmid}"
    g = current.guests.get(c.vmid)
    if g is None:
        found.refuse(None, f"{vm} does not exist on node {view.node}", "no-such-vm")
        return
    cfg = {k: str(v) for k, v in g.config.items() if k != "digest"}
    # a mapping the spec manages exists for it even while it has no GPU (Proxmox has none then)
    managed = next((m for m in view.managed if m.lower() == c.mapping.lower()), None)
    mid = view.find(c.mapping) or view.find(c.mapping, after=False) or managed
    if mid is None:
        have = ", ".join(sorted(set(view.after) | view.managed)) or "none"
        found.refuse(
            None,
            f"{vm}: mapping {c.mapping} is not a mapping of this cluster (have: {have})",
            "no-such-mapping",
        )
        return
    leaving, dirty = view.leaving(mid), view.container_gpus(mid) if view.find(mid) else {}
    gone = {**leaving, **dirty}
    target, avail = view.find(mid) or mid, [a for a in view.paths(mid) if a not in dirty]
    notes: list[str] = []
    if gone and c.when_gpus_leave == "refuse":
        found.refuse(
            None,
            (
                f"{vm} uses mapping {mid}, whose GPU(s) go to a container ({owners_text(gone)}): set "
                f"when_gpus_leave (remove or repoint) for {vm} in vms.consumers"
            ),
            "vm-mapping",
        )
        return
    if c.when_gpus_leave == "repoint" and (gone or not avail):
        rid = view.find(c.repoint_to or "")
        if rid is None or view.container_gpus(rid):
            why = "does not exist" if rid is None else "lists container GPUs too"
            found.refuse(None, f"{vm}: cannot repoint to mapping {c.repoint_to}, which {why}", "vm-mapping")
            return
        target, avail = rid, view.paths(rid)
        notes.append(
            f"mapping {mid} has no GPU left for it: its lines name {rid}"
            if not gone
            else f"GPU(s) of {mid} go to a container ({owners_text(gone)}): its lines now name {rid}"
        )
    elif gone:
        avail = [] if dirty else avail
        notes.append(
            f"GPU(s) of {mid} go to a container ({owners_text(gone)}): their hostpci lines are removed"
        )
    n = c.gpus or len(avail)
    if n > len(avail):
        if c.when_gpus_leave == "refuse":
            found.refuse(
                None,
                f"{vm} asks {n} GPU(s) of mapping {target}, which has {len(avail)} on node {view.node}",
                "vm-gpus",
            )
            return
        found.warn(f"{vm} gets {len(avail)} of the {n} GPU(s) it asks from mapping {target}")
        n = len(avail)
    start_count = len(found.refusals)
    hostpci, deletes, why = _lines(c, target, cfg, n)
    if why:
        found.refuse(None, f"{vm} {why}", "vm-hostpci")
        return
    want: dict[str, str] = dict(hostpci)
    if n:
        # the value each line really gets (pcie=1 and what else applies), not only the mapping
        values = sorted(set(hostpci.values()))
        lines = (
            f"{', '.join(hostpci_keys(hostpci))}: {values[0]}"
            if len(values) == 1
            else ", ".join(f"{k}: {hostpci[k]}" for k in hostpci_keys(hostpci))
        )
        notes.insert(0, f"{lines}; Proxmox gives each line a free GPU of mapping {target} when the VM starts")
    gpus = [gg for a in avail if (gg := facts.gpu(a)) is not None]
    # its own set (vms/sets.py) when it takes part of its mapping, its lines still name that
    # mapping and the set is all there
    mine = gpus
    if (
        own
        and n == len(own) < len(avail)
        and target.lower() == c.mapping.lower()
        and {g.address for g in own} <= set(avail)
    ):
        mine = own
        notes.append(
            f"its GPUs: {explain(own, None, facts.nics)}; the map lines of {target} list each consumer's "
            "GPUs in turn, so started in the order of vms.consumers it gets these (Proxmox gives a "
            "line the first free one)"
        )
    bios = cfg.get("bios", "seabios")
    if c.pcie and n and not is_q35(cfg):
        found.refuse(
            None,
            f"{vm} is i440fx (machine: {cfg.get('machine', 'default')}) but pcie=1 needs "
            "machine q35: set machine: q35 or pcie: false",
            "vm-machine",
        )
    if c.x_vga and n and bios == "ovmf":
        found.refuse(
            None,
            f"{vm}: x-vga=1 is dropped with bios ovmf (qemu-server passes it to SeaBIOS "
            "only): set x-vga: false",
            "vm-x-vga",
        )
    if n:
        _place(c, facts, cfg, mine, want, notes, found)
        m = mmio(gpus, n, cfg.get("args"), c.mmio64_mb)
        if not m.fits_default() and bios != "ovmf":
            found.refuse(
                None,
                (
                    f"{vm} boots SeaBIOS, which cannot map {gib(m.need)} of 64-bit BARs ({n} GPU(s), largest BAR "
                    f"{gib(m.largest)}): set bios: ovmf (with an efidisk0)"
                ),
                "vm-seabios",
            )
        elif c.mmio64_mb is not None and m.need > c.mmio64_mb << 20:
            found.refuse(
                None,
                f"{vm}: mmio64_mb {c.mmio64_mb} is smaller than its GPUs' {gib(m.need)} of 64-bit BARs",
                "vm-mmio",
            )
        elif bios == "ovmf":
            if m.set_mb is not None:
                want["args"] = with_mmio64_mb(cfg.get("args"), m.set_mb)
                pb = phys_bits_note(m.set_mb, memory_mib(cfg), cfg.get("cpu"))
                if pb:
                    found.warn(f"{vm}: {pb}")
            notes.append(mmio_note(m))
    if len(found.refusals) > start_count:
        return
    sets = {k: v for k, v in want.items() if cfg.get(k) != v}
    after = {**{k: v for k, v in cfg.items() if k not in deletes}, **want}
    # every key: a line Proxmox cannot parse is dropped on its next write of the config
    problems = [
        f"unable to parse value of '{k}' - {w}"
        for k, v in sorted(after.items())
        if (w := check_qemu_option(k, v))
    ] + start_problems(after)
    if problems:
        for p in problems:
            found.refuse(None, f"{vm}: {p}", "vm-config")
        return
    out.configs[c.vmid] = after
    out.targets.append(
        VmTarget(
            vmid=c.vmid,
            mapping=target,
            gpus=n,
            numa_nodes=placement(facts, mine).nodes,
            mmio64_need=mmio(gpus, n, None, None).need if n else 0,
            config=want,
            notes=notes,
        )
    )
    if sets or deletes:
        check_writer(c.vmid, sets, deletes, current.api_user, found)
        out.updates.append(
            UpdateVmConfig(vmid=c.vmid, set=sets, delete=deletes, digest=g.config.get("digest"))
        )
        if g.status == "running":
            out.restart.append(c.vmid)
    if c.start and g.status != "running":
        out.start.append(c.vmid)


def _place(
    c: VmConsumer,
    facts: Facts,
    cfg: dict[str, str],
    gpus: list[Any],
    want: dict[str, str],
    notes: list[str],
    found: Findings,
) -> None:
    """Add the affinity, numa, numa0 and hugepages keys (with their reasons) to ``want``."""
    vm = f"VM {c.vmid}"
    pl = placement(facts, gpus)
    if len(pl.nodes) > 1:
        where = ", ".join(f"{g.address} on {g.numa_node}" for g in gpus if g.numa_node is not None)
        found.warn(
            f"{vm}: its GPUs span NUMA nodes {', '.join(map(str, pl.nodes))} ({where}): "
            "its memory and half its GPU traffic cross sockets"
        )
    if pl.unknown:
        found.warn(f"{vm}: NUMA node unknown for {', '.join(pl.unknown)}; its CPUs are not pinned")
    nodes = ",".join(map(str, pl.nodes))
    if c.affinity and pl.affinity is not None:
        if not pl.affinity:
            found.refuse(
                None,
                f"{vm}: NUMA node {nodes} has no CPUs, and an empty affinity fails at VM "
                "start: set affinity: false",
                "vm-affinity",
            )
            return
        want["affinity"] = pl.affinity
        notes.append(
            f"affinity {pl.affinity}: the CPUs of NUMA node {nodes}, where its GPUs are; its vCPUs and "
            "QEMU's threads stay on that socket"
        )
    if c.numa:
        want["numa"] = "1"
        custom = sorted(k for k in cfg if NUMA_KEY.match(k) and k != "numa0")
        hotplug = "memory" in cfg.get("hotplug", "").split(",")
        if len(pl.nodes) == 1 and not custom and not hotplug:
            sockets, cores = int(cfg.get("sockets", "1")), int(cfg.get("cores", "1"))
            vcpus = sockets * cores
            cpus = "0" if vcpus == 1 else f"0-{vcpus - 1}"
            want["numa0"] = f"cpus={cpus},hostnodes={nodes},memory={memory_mib(cfg)},policy=bind"
            notes.append(
                f"numa: 1, numa0 hostnodes={nodes},policy=bind: its memory comes from node {nodes} "
                "(qemu-server otherwise takes guest memory and hugepages from host node 0 upwards)"
            )
        elif custom or hotplug:
            why = f"its own NUMA topology ({', '.join(custom)})" if custom else "memory hotplug"
            found.warn(f"{vm} has {why}; numa0 is left alone, its memory is not bound to node {nodes or '?'}")
    if c.hugepages:
        want["hugepages"] = c.hugepages
        size = {"2": "2 MiB", "1024": "1 GiB", "any": "1 GiB where possible, else 2 MiB"}[c.hugepages]
        notes.append(
            f"hugepages {c.hugepages}: guest memory in {size} pages, taken on node {nodes or '?'} at "
            "start (they must be free there)"
        )


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
