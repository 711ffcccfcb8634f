"""Data models shared by every layer: the host facts that discovery produces.

This module imports nothing of gputopo's except ``record`` (and ``errors`` to raise one), nor re
or typing: the facts are plain records (:mod:`gputopo.model.record`), declared
like pydantic models, whose schema and validation pydantic provides on first use, so discovery
never waits for pydantic to load. The JSON form of
:class:`Facts` (``gputopo discover --json``) is a stable, documented schema (``gputopo schema facts``):

* ids are strings as sysfs spells them: ``vendor`` ``"0x10de"``, ``device`` ``"0x2bb5"``,
  ``class`` ``"0x030200"``;
* a PCI address is always ``dddd:bb:dd.f`` lowercase (4 or more domain digits);
* anything that could not be read is ``null``, never a made-up default (a NUMA node that is
  unknown is ``null``, not 0).
"""

from __future__ import annotations

from enum import Enum

from gputopo.model.record import Field, Literal, Record

# Importing typing would cost discovery's start-up a third of Python's own: annotations are text,
# and at run time Literal[...] is too (pydantic reads it when it builds the schema); type
# checkers read typing's.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Literal

SCHEMA_VERSION = 1

_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")

NVIDIA_VENDOR = "0x10de"


def normalize_address(text: str) -> str:
    """Return ``text`` as a canonical PCI address ``dddd:bb:dd.f`` (lowercase).

    Accepts the sysfs form ``0000:2a:00.0``, NVML's ``00000000:2A:00.0`` and the short
    ``2a:00.0`` (domain 0). Domains wider than 4 digits keep their significant digits
    (``10000:00:01.0``); NVML's 8-digit zero padding is trimmed to 4.

    Raises :class:`AddressError` for anything else.
    """
    address = canonical_address(text)
    if address is None:
        # here: discovery meets no bad address, and its start-up need not build the error classes
        from gputopo.errors import AddressError

        raise AddressError(text)
    return address


def canonical_address(text: str) -> str | None:
    """:func:`normalize_address` of ``text``, or None where that raises."""
    head, dot, fn = text.strip().rpartition(".")
    parts = head.split(":")
    if len(parts) == 2:
        parts.insert(0, "0")
    # [domain:]bus:dev.fn: 1-8, 1-2 and 1-2 hex digits and a function 0-7
    if not (dot and len(fn) == 1 and fn in "01234567" and len(parts) == 3):
        return None
    domain, bus, dev = parts
    if not (0 < len(domain) <= 8 and 0 < len(bus) <= 2 and 0 < len(dev) <= 2):
        return None
    if not _HEX_DIGITS.issuperset(domain + bus + dev) or int(dev, 16) > 0x1F:
        return None
    return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(dev, 16):02x}.{fn}"


def slot_of(address: str) -> str:
    """The ``dddd:bb:dd`` part of an address: the physical card's slot."""
    return address.rsplit(".", 1)[0]


def address_key(address: str) -> tuple[int, int, int, int]:
    """Sort key of a normalised address: (domain, bus, device, function) as numbers, so
    domain ``10000`` sorts after ``0001``."""
    dom, bus, rest = address.split(":")
    dev, fn = rest.split(".")
    return int(dom, 16), int(bus, 16), int(dev, 16), int(fn)


def parse_cpulist(text: str | None) -> set[int]:
    """The kernel's cpulist format: ``'0-3,8,10-11'`` -> {0, 1, 2, 3, 8, 10, 11}.

    An empty or missing list -> set(). Raises ValueError for text that is not a cpulist.
    """
    cpus: set[int] = set()
    for part in filter(None, (x.strip() for x in (text or "").split(","))):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def format_cpulist(cpus: set[int]) -> str:
    """The inverse of :func:`parse_cpulist`: {0, 1, 2, 3, 8} -> ``'0-3,8'``; set() -> ``''``."""
    runs: list[list[int]] = []
    for c in sorted(cpus):
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


class Model(Record):
    model_config = {"extra": "forbid", "populate_by_name": True}


class MemberRole(str, Enum):
    """How a device in a GPU's IOMMU group relates to that GPU."""

    GPU = "gpu"  # the GPU itself
    FUNCTION = "function"  # another function of the same card (HDMI audio, USB, UCSI)
    BRIDGE = "bridge"  # a PCI bridge (class 0x0604): the kernel leaves it alone
    FOREIGN = "foreign"  # anything else: an NVMe, a NIC, another GPU


BridgeKind = Literal[
    "root_port", "switch_upstream", "switch_downstream", "pcie_to_pci", "pci_to_pcie", "bridge"
]


class Bridge(Model):
    """A PCI bridge on the way from a host bridge down to a device.

    ``kind`` comes from the bridge's PCI Express capability (Device/Port Type: 4 root port,
    5 switch upstream port, 6 switch downstream port, 7 PCIe-to-PCI, 8 PCI-to-PCIe); where the
    configuration space cannot be read it is inferred from the bridge's place in the chain
    (first under the host bridge: root port; below it: a switch's upstream port, then its
    downstream port), or is ``bridge``.
    """

    address: str
    kind: BridgeKind
    vendor: str | None = None
    device: str | None = None
    model: str | None = None


class PciFunction(Model):
    """One PCI function as sysfs shows it."""

    address: str
    vendor: str | None = Field(description="'0x10de'; null when unreadable or 0xffff/0x0000")
    device: str | None
    class_: str | None = Field(alias="class", description="'0x030200'")
    subsystem_vendor: str | None = None
    subsystem_device: str | None = None
    driver: str | None = None
    driver_override: str | None = None
    iommu_group: int | None = None
    numa_node: int | None = None
    model: str | None = None
    readable: bool = Field(True, description="False when the ids read 0xffff/0x0000 or are missing")
    host_bridge: str | None = Field(
        None,
        description="Root bus 'dddd:bb' the device hangs from (sys/devices/pcidddd:bb); set by discover "
        "for GPUs, NVSwitches, network adapters and NVMe drives, null when the device link does not resolve there",
    )
    upstream: list[Bridge] = Field(
        default_factory=list,
        description="Bridges from the host bridge down to the device's parent, root port first; set by "
        "discover for GPUs, NVSwitches, network adapters and NVMe drives",
    )

    @property
    def is_bridge(self) -> bool:
        return bool(self.class_ and self.class_.startswith("0x0604"))

    @property
    def is_display(self) -> bool:
        return bool(self.class_ and self.class_.startswith("0x03"))

    @property
    def is_nvswitch(self) -> bool:
        return self.vendor == NVIDIA_VENDOR and bool(self.class_ and self.class_.startswith("0x0680"))


class Peripheral(PciFunction):
    """A network adapter or an NVMe drive near the GPUs, with the names its driver registered.

    A driver's class devices sit under the function's sysfs directory in a directory named
    after their class (drivers/base/core.c, get_device_parent(): the class "glue" directory),
    so ``sys/bus/pci/devices/<address>/infiniband/mlx5_0``, ``.../net/enp33s0f0np0`` and
    ``.../nvme/nvme0`` name what the function became. None of them without a driver (or on
    vfio-pci); a network interface moved into a container's namespace is not listed.
    """

    rdma: list[str] = Field(
        default_factory=list, description="RDMA devices (sysfs infiniband/), sorted: ['mlx5_0']; [] for none"
    )
    net: list[str] = Field(
        default_factory=list, description="Network interfaces (sysfs net/), sorted; [] for none"
    )
    nvme: list[str] = Field(
        default_factory=list, description="NVMe controllers (sysfs nvme/), sorted: ['nvme0']; [] for none"
    )

    @property
    def name(self) -> str:
        """What people call it: its RDMA device (as ``nvidia-smi topo -m``'s NIC legend does),
        else its network interface, else its NVMe controller, else its address."""
        for names in (self.rdma, self.net, self.nvme):
            if names:
                return names[0]
        return self.address


class GroupMember(Model):
    """Another device in a GPU's IOMMU group, with its role relative to that GPU."""

    address: str
    role: MemberRole
    vendor: str | None
    device: str | None
    class_: str | None = Field(alias="class")
    driver: str | None = None
    subsystem_vendor: str | None = None
    subsystem_device: str | None = None


class Link(Model):
    """PCIe link as sysfs reports it (``current_link_speed`` is text like '32.0 GT/s PCIe')."""

    current_speed: str | None = None
    current_width: int | None = None
    max_speed: str | None = None
    max_width: int | None = None


BarKind = Literal["mem32", "mem64", "io", "rom"]


class Bar(Model):
    """One non-empty region of a PCI function, from sysfs ``resource`` (one line per region:
    start, end and the kernel's resource flags, in hex). ``index`` 0-5 are the BARs, 6 the
    expansion ROM; ``size`` = end - start + 1."""

    index: int
    kind: BarKind = Field(description="mem32, mem64 (a 64-bit memory BAR), io or rom")
    prefetchable: bool = False
    start: int
    size: int
    flags: int = Field(description="The kernel's IORESOURCE_* flags as sysfs prints them")


class Gpu(PciFunction):
    """A GPU (display-class function) with everything gputopo needs to place it."""

    numa_source: Literal["sysfs", "cpulist"] | None = Field(
        None, description="Where numa_node came from; null when unknown"
    )
    iommu_members: list[GroupMember] = Field(
        default_factory=list, description="Every other device in the IOMMU group"
    )
    functions: list[str] = Field(
        default_factory=list, description="Other functions of the same card (same slot)"
    )
    boot_vga: bool | None = None
    link: Link = Field(default_factory=Link)
    sriov_numvfs: int | None = None
    sriov_totalvfs: int | None = None
    reset_method: list[str] | None = None
    minor: int | None = Field(None, description="/dev/nvidiaN minor from proc/driver/nvidia")
    uuid: str | None = Field(None, description="GPU UUID from proc/driver/nvidia, when bound")
    local_cpulist: str | None = Field(
        None, description="CPUs local to the GPU (sysfs local_cpulist, canonical form); null when unreadable"
    )
    bars: list[Bar] = Field(
        default_factory=list,
        description="Its non-empty memory and I/O regions (sysfs resource); [] when unreadable",
    )

    @property
    def companions(self) -> list[str]:
        """Addresses that must move together with this GPU: its group's non-bridge members."""
        return [m.address for m in self.iommu_members if m.role != MemberRole.BRIDGE]

    @property
    def foreign_members(self) -> list[GroupMember]:
        return [m for m in self.iommu_members if m.role == MemberRole.FOREIGN]


class NumaNode(Model):
    id: int
    cpulist: str = ""
    has_cpus: bool = True


class Modules(Model):
    """Kernel modules of interest, from ``proc/modules`` (True = loaded)."""

    vfio: bool = False
    vfio_pci: bool = False
    vfio_iommu_type1: bool = False
    nvidia: bool = False
    nvidia_uvm: bool = False
    nvidia_drm: bool = False
    nvidia_modeset: bool = False


class HostFacts(Model):
    hostname: str | None = None
    kernel: str | None = None
    cmdline: str = ""
    iommu_enabled: bool = Field(False, description="True when sys/kernel/iommu_groups has groups")
    iommu_group_count: int = 0
    iommu_mode: Literal["pt", "translated", "off"] | None = Field(
        None, description="From the kernel command line: iommu=pt => pt, *_iommu=off => off"
    )
    modules: Modules = Field(default_factory=Modules)
    sev_snp: bool | None = Field(None, description="SEV-SNP active; null when unknown")
    nvidia_driver_version: str | None = None
    numa_nodes: list[NumaNode] = Field(default_factory=list)
    vfio_groups: list[int] = Field(default_factory=list, description="Groups with /dev/vfio/<n>")
    nvidia_device_nodes: list[str] = Field(
        default_factory=list, description="Existing /dev/nvidia* nodes (names under /dev)"
    )
    char_majors: dict[str, int] = Field(
        default_factory=dict,
        description="Character majors of nvidia's dynamic regions (nvidia-uvm, nvidia-caps) from "
        "/proc/devices; {} when it lists none",
    )


class Facts(Model):
    """Everything discovery learnt about a host. ``gpus`` are sorted by address."""

    schema_version: int = SCHEMA_VERSION
    root: str = "/"
    gpus: list[Gpu] = Field(default_factory=list)
    nvswitches: list[PciFunction] = Field(default_factory=list)
    nics: list[Peripheral] = Field(
        default_factory=list,
        description="Network adapters (class 02; SR-IOV VFs left out) with their place in the PCI tree: "
        "placement keeps GPUs near the one their RDMA goes through",
    )
    nvme: list[Peripheral] = Field(
        default_factory=list,
        description="NVMe drives (class 0108; SR-IOV VFs left out) with their place in the PCI tree "
        "(gputopo topo --all); [] in facts read before they were recorded",
    )
    host: HostFacts = Field(default_factory=HostFacts)
    warnings: list[str] = Field(default_factory=list, description="Things read but not understood")

    def gpu(self, address: str) -> Gpu | None:
        for g in self.gpus:
            if g.address == address:
                return g
        return None

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, indent=2)


class Holder(Record, frozen=True):
    """A process that holds a device node open.

    ``comm`` is the kernel's short name (``?`` when unreadable); ``cmdline`` the command line
    with its arguments joined by spaces (None for a process without one, such as a kernel
    thread or a zombie); ``container`` the LXC container it runs in (None on the host);
    ``unit`` the systemd unit it belongs to, inside that container or on the host (its cgroup's
    ``<name>.service``), None when it has none.
    """

    pid: int
    comm: str
    cmdline: str | None
    container: int | None
    unit: str | None = None


def nvidia_gpus(facts: Facts) -> list[Gpu]:
    """The NVIDIA GPUs of ``facts`` (display-class functions of vendor 10de), by address."""
    return sorted((g for g in facts.gpus if g.vendor == NVIDIA_VENDOR), key=lambda g: g.address)
