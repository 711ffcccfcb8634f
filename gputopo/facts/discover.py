"""Discovery: read a host root (sysfs, procfs, dev) and assemble :class:`gputopo.model.facts.Facts`.

Read-only. Every function takes the host ``root`` (a directory holding ``sys/``, ``proc/``,
``dev/``); nothing hard-codes ``/sys``. The parts are read where they live:
:mod:`gputopo.facts.pci` (one PCI function), :mod:`gputopo.facts.host` (modules, IOMMU, NUMA,
SEV-SNP, the driver version), :mod:`gputopo.facts.names` (model names), :mod:`gputopo.facts.bars` (BAR sizes) and
:mod:`gputopo.facts.procfs` (processes holding device nodes); this module picks the GPUs and
NVSwitches and puts each one together.

Model names come from the root's ``pci.ids``; on the live root ``/`` udev's database (through
pyudev) names what ``pci.ids`` does not know, and the nvidia driver's "Model:" line is the last
resort. None of them is required.
"""

from __future__ import annotations

import os

from gputopo.facts.bars import read_bars
from gputopo.facts.files import addresses_in, class_devices, read_text, sorted_addresses, stripped
from gputopo.facts.host import (
    IOMMU_GROUPS,
    NODE_DIR,
    IommuGroups,
    numa_from_cpulist,
    read_host_facts,
    read_numa,
)
from gputopo.facts.names import load_pci_names
from gputopo.facts.pci import AttrReader, parse_int, parse_reset_method, pci_devices_dir, read_function
from gputopo.model.facts import (
    NVIDIA_VENDOR,
    Facts,
    Gpu,
    GroupMember,
    Link,
    MemberRole,
    PciFunction,
    Peripheral,
    address_key,
    parse_cpulist,
    slot_of,
)

TYPE_CHECKING = False  # typing and pathlib cost discovery's start-up; annotations need them only
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Literal

NVIDIA_GPUS = "proc/driver/nvidia/gpus"

DEFAULT_GPU_MATCH: list[tuple[str | None, str | None]] = [(NVIDIA_VENDOR, "0x03")]

_LOWER_HEX = frozenset("0123456789abcdef")

Ids = tuple[str | None, str | None, str | None]


# --- pure parsers ------------------------------------------------------------------------


def parse_gpu_match(text: str) -> tuple[str | None, str | None]:
    """``'0x1234:0x03'`` / ``'1234'`` / ``':0x0302'`` -> (vendor, class prefix), lowercased.

    Empty parts mean "any". Raises :class:`gputopo.errors.InputError` for hex that is not hex.
    """
    vendor, _, klass = text.strip().partition(":")
    out: list[str | None] = []
    for part, what in ((vendor, "vendor"), (klass, "class prefix")):
        part = part.strip().lower()
        if not part:
            out.append(None)
            continue
        digits = part[2:] if part.startswith("0x") else part
        if not (0 < len(digits) <= 6 and _LOWER_HEX.issuperset(digits)):
            from gputopo.errors import InputError  # here: discovery's start-up need not build them

            raise InputError(f"--gpu-match {text!r}: {what} {part!r} is not hex")
        out.append("0x" + (digits.zfill(4) if what == "vendor" else digits))
    return out[0], out[1]


def parse_nvidia_information(text: str) -> dict[str, str]:
    """``/proc/driver/nvidia/gpus/<bdf>/information`` -> {field: value}.

    Each line is ``Key:<spaces/tabs>value``; keys keep their spelling (``'GPU UUID'``,
    ``'Device Minor'``). Lines without a colon are ignored.
    """
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip():
            out[key.strip()] = value.strip()
    return out


def _matches(vendor: str | None, klass: str | None, rules: list[tuple[str | None, str | None]]) -> bool:
    for v, c in rules:
        if v is not None and vendor != v:
            continue
        if c is not None and not (klass and klass.startswith(c)):
            continue
        return True
    return False


# --- the parts of a GPU ------------------------------------------------------------------


def _gpu_numa(
    rd: AttrReader, name: str, addr: str, nodes: dict[int, set[int]], warnings: list[str]
) -> tuple[int | None, Literal["sysfs", "cpulist"] | None]:
    """(NUMA node, where it came from): sysfs ``numa_node`` when the firmware gave one, else
    the one node holding every CPU of ``local_cpulist``; (None, None) with a warning otherwise."""
    raw_numa = parse_int(rd.attr(name, "numa_node"))
    if raw_numa is not None and raw_numa >= 0:
        if nodes and raw_numa not in nodes:
            warnings.append(f"{addr}: numa_node {raw_numa} is not a node under {NODE_DIR}")
        return raw_numa, "sysfs"
    local_text = rd.attr(name, "local_cpulist")
    try:
        local = parse_cpulist(local_text)
    except ValueError:
        local = set()
    node = numa_from_cpulist(local, nodes)
    if node is not None:
        return node, "cpulist"
    warnings.append(
        f"{addr}: NUMA node unknown (numa_node {raw_numa if raw_numa is not None else 'missing'}, "
        f"local_cpulist {(local_text or 'missing').strip()!r} names no single node)"
    )
    return None, None


def _group_members(
    rd: AttrReader, addr: str, group: list[str], ids: dict[str, Ids], name_of: dict[str, str]
) -> list[GroupMember]:
    """The devices of ``group`` other than ``addr``, by address, each with its role: another
    function of the same card, a bridge, or a foreign device."""
    members = []
    for m in sorted(group, key=address_key):
        if m == addr:
            continue
        mv, md, mc = ids.get(m, (None, None, None))
        mname = name_of.get(m)
        if slot_of(m) == slot_of(addr):
            role = MemberRole.FUNCTION
        elif mc and mc.startswith("0x0604"):
            role = MemberRole.BRIDGE
        else:
            role = MemberRole.FOREIGN
        sv, sd = rd.subsystem(mname) if mname else (None, None)
        members.append(
            GroupMember(
                address=m,
                role=role,
                vendor=mv,
                device=md,
                **{"class": mc},
                driver=rd.link(mname, "driver") if mname else None,
                subsystem_vendor=sv,
                subsystem_device=sd,
            )
        )
    return members


def _add_nvidia_information(g: Gpu, root: str, info_dir: str | None, warnings: list[str]) -> None:
    """Set ``g``'s minor, UUID and (when pci.ids had none) model from the nvidia driver's
    ``information`` file under ``info_dir``; warn when a GPU on nvidia has none."""
    if info_dir is None:
        if g.driver == "nvidia":
            warnings.append(f"{g.address}: bound to nvidia but not listed under {NVIDIA_GPUS}")
        return
    text = read_text(os.path.join(root, NVIDIA_GPUS, info_dir, "information"))
    if text is None:
        warnings.append(f"{g.address}: {NVIDIA_GPUS}/{info_dir}/information unreadable")
        return
    info = parse_nvidia_information(text)
    g.minor = parse_int(info.get("Device Minor"))
    g.uuid = info.get("GPU UUID") or None
    if g.model is None and info.get("Model"):
        g.model = info["Model"]


def _fill_gpu(g: Gpu, rd: AttrReader, name: str) -> None:
    """Set ``g``'s boot_vga, link, SR-IOV and reset attributes from its directory ``name``."""
    boot = parse_int(rd.attr(name, "boot_vga"))
    if boot is not None:
        g.boot_vga = boot == 1
    elif g.class_ and g.class_.startswith("0x03") and not g.class_.startswith("0x0300"):
        # The kernel offers boot_vga only on VGA-class functions; a 3D controller never is.
        g.boot_vga = False
    g.link = Link(
        current_speed=stripped(rd.attr(name, "current_link_speed")),
        current_width=parse_int(rd.attr(name, "current_link_width")),
        max_speed=stripped(rd.attr(name, "max_link_speed")),
        max_width=parse_int(rd.attr(name, "max_link_width")),
    )
    g.sriov_numvfs = parse_int(rd.attr(name, "sriov_numvfs"))
    g.sriov_totalvfs = parse_int(rd.attr(name, "sriov_totalvfs"))
    g.reset_method = parse_reset_method(rd.attr(name, "reset_method"))


def _peripheral(f: PciFunction, path: str) -> Peripheral:
    """``f`` (a network adapter or NVMe drive) with the names its driver gave it under ``path``."""
    return Peripheral(
        **f.model_dump(by_alias=True),
        rdma=class_devices(path, "infiniband"),
        net=class_devices(path, "net"),
        nvme=class_devices(path, "nvme"),
    )


# --- discovery ---------------------------------------------------------------------------


class _Bus:
    """The PCI functions of a root sorted by what discovery makes of them: each one's ids and
    directory name by address, the functions of each slot, and the addresses of the GPUs,
    NVSwitches, network adapters and NVMe drives (not their SR-IOV VFs), in address order."""

    def __init__(self, rd: AttrReader, rules: list[tuple[str | None, str | None]], warnings: list[str]):
        entries = sorted_addresses(rd.devdir)
        self.name_of = dict(entries)
        self.ids: dict[str, Ids] = {}
        self.by_slot: dict[str, list[str]] = {}
        self.gpus: list[str] = []
        self.nvswitches: list[str] = []
        self.nics: list[str] = []
        self.nvme: list[str] = []
        for addr, name in entries:
            vendor, device, klass = self.ids[addr] = rd.ids(name)
            self.by_slot.setdefault(slot_of(addr), []).append(addr)
            if vendor is None or device is None:
                warnings.append(
                    f"{addr}: vendor/device ids unreadable (0xffff, 0x0000 or missing); "
                    "the device may have fallen off the bus"
                )
                continue
            if vendor == NVIDIA_VENDOR and klass and klass.startswith("0x0680"):
                self.nvswitches.append(addr)
            elif _matches(vendor, klass, rules):
                self.gpus.append(addr)
            elif klass and klass.startswith(("0x02", "0x0108")):
                if not os.path.lexists(f"{rd.devdir}/{name}/physfn"):  # a VF sits where its PF does
                    (self.nics if klass.startswith("0x02") else self.nvme).append(addr)

    def named(self) -> dict[str, tuple[str, str]]:
        """The functions discovery names from pci.ids: {address: (vendor, device)}, no ``0x``."""
        return {
            a: (self.ids[a][0][2:], self.ids[a][1][2:])
            for a in self.gpus + self.nvswitches + self.nics + self.nvme
        }


class _Reading:
    """One discovery's readers and tables: what it reads once (the IOMMU groups, the NUMA
    nodes, the model names, the nvidia driver's GPU directories) and each device then looks up.
    A NUMA node whose cpulist does not parse adds a line to ``warnings``."""

    def __init__(self, root: str, rd: AttrReader, bus: _Bus, warnings: list[str]):
        self.root, self.rd, self.bus, self.warnings = root, rd, bus, warnings
        self.groups = IommuGroups(root)
        self.nodes = read_numa(root, warnings)
        self.names = load_pci_names(root, bus.named())
        self.nv_dirs = addresses_in(os.path.join(root, NVIDIA_GPUS))

    def function(self, addr: str) -> PciFunction:
        """The function at ``addr`` whole: its attributes, model name and IOMMU group."""
        f = read_function(self.rd, self.bus.name_of[addr], addr)
        if f.vendor and f.device:
            f.model = self.names.get(addr)
        listed = self.groups.group_of(addr, hint=f.iommu_group)
        f.iommu_group = listed if listed is not None else f.iommu_group
        return f

    def peripheral(self, addr: str) -> Peripheral:
        """The network adapter or NVMe drive at ``addr``."""
        return _peripheral(self.function(addr), f"{self.rd.devdir}/{self.bus.name_of[addr]}")

    def gpu(self, addr: str) -> Gpu:
        """The GPU at ``addr``: the function, its NUMA node, IOMMU group's members, the other
        functions of its card, link, BARs and what the nvidia driver says of it."""
        rd, name, warnings = self.rd, self.bus.name_of[addr], self.warnings
        g = Gpu(**self.function(addr).model_dump(by_alias=True))
        g.numa_node, g.numa_source = _gpu_numa(rd, name, addr, self.nodes, warnings)
        if g.iommu_group is not None:
            members = self.groups.members(g.iommu_group)
            g.iommu_members = _group_members(rd, addr, members, self.bus.ids, self.bus.name_of)
        g.functions = [a for a in self.bus.by_slot[slot_of(addr)] if a != addr]
        _fill_gpu(g, rd, name)
        g.bars = read_bars(rd, name)
        _add_nvidia_information(g, self.root, self.nv_dirs.get(addr), warnings)
        return g


def discover(
    root: str | Path = "/",
    *,
    all_vendors: bool = False,
    gpu_match: list[tuple[str | None, str | None]] | None = None,
) -> Facts:
    """Read the host under ``root`` and return its :class:`Facts`.

    GPUs are the functions matching ``gpu_match`` ((vendor, class prefix) pairs, None = any;
    default NVIDIA display class); ``all_vendors`` adds every display-class function.
    NVIDIA NVSwitches go to ``facts.nvswitches``, network adapters and NVMe drives (not their
    SR-IOV VFs) to ``facts.nics`` and ``facts.nvme``, with the names their drivers registered.
    Anything unreadable is null and, where it matters, explained in ``facts.warnings``;
    discovery itself does not fail on odd devices.
    Raises :class:`RootError` when ``root`` holds no ``sys/bus/pci/devices``.
    """
    root_s = str(root)
    rd = AttrReader(pci_devices_dir(root_s))
    rules = list(gpu_match) if gpu_match is not None else list(DEFAULT_GPU_MATCH)
    if all_vendors:
        rules.append((None, "0x03"))
    warnings: list[str] = []
    bus = _Bus(rd, rules, warnings)
    reading = _Reading(root_s, rd, bus, warnings)
    host = read_host_facts(root_s, reading.groups, reading.nodes, warnings)
    if not reading.groups.count:
        warnings.append(f"no IOMMU groups under {IOMMU_GROUPS}: the IOMMU is off; passthrough is impossible")
    facts = Facts(
        root=root_s,
        gpus=[reading.gpu(a) for a in bus.gpus],
        nvswitches=[reading.function(a) for a in bus.nvswitches],
        nics=[reading.peripheral(a) for a in bus.nics],
        nvme=[reading.peripheral(a) for a in bus.nvme],
        host=host,
        warnings=warnings,
    )
    from gputopo.facts.tree import add_topology  # here: tree.py uses this module's pci.ids parser

    add_topology(root_s, facts)
    return facts
