"""The topology view's data: owners, the tree and the PCIe distance matrix (``gputopo topo --json``).

Data only. The JSON form of :class:`TopoReport` is documented by ``gputopo schema topo``; like
the facts, anything unknown is ``null``, never a made-up default.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from gputopo.model.documents import VERSION
from gputopo.model.owner import Owner
from gputopo.model.strict import Strict

# nvidia-smi topo -m's legend, closest first (NV# needs NVML: sysfs cannot show NVLinks).
LEVELS: tuple[str, ...] = ("X", "PIX", "PXB", "PHB", "NODE", "SYS")
LEGEND: dict[str, str] = {
    "X": "Self",
    "SYS": "Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)",
    "NODE": "Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node",
    "PHB": "Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)",
    "PXB": "Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)",
    "PIX": "Connection traversing at most a single PCIe bridge",
}


class OwnerView(Strict):
    """Who has a GPU as the picture shows it: containers (its ``/dev/nvidiaN`` is in their
    ``devN``), a VM mapping (the GPU is in the mapping's ``map`` lines and on vfio-pci) with the
    VMs using it, or nobody. Unlike a plan's :class:`gputopo.model.owner.Owner` it can name
    several containers or VMs, because a host can be in that state."""

    kind: Literal["container", "vm", "free"]
    containers: list[int] = Field(default_factory=list, description="Containers granted the GPU's node")
    mapping: str | None = Field(None, description="The PCI mapping naming the GPU (kind vm)")
    vms: list[int] = Field(
        default_factory=list, description="VMs whose hostpci uses the mapping or the address"
    )

    @classmethod
    def of(cls, owner: Owner, vms: list[int] | None = None) -> OwnerView:
        """A plan's container or VM mapping (``vms``: the VMs using the mapping) as the picture
        shows it. Raises ValueError for the host, which leaves a GPU as it is: the picture shows
        what it has now."""
        if owner.is_container:
            return cls(kind="container", containers=[owner.vmid])
        if owner.is_vm:
            return cls(kind="vm", mapping=owner.name, vms=list(vms or []))
        raise ValueError(f"{owner} leaves a GPU as it is; the picture shows its owner now")

    @property
    def owner(self) -> Owner | None:
        """The plan's :class:`Owner` this is: one container or a VM mapping; None for free,
        several containers, or VMs that name the GPU by address."""
        if self.kind == "container" and len(self.containers) == 1:
            return Owner.container(self.containers[0])
        if self.kind == "vm" and self.mapping:
            return Owner.vm(self.mapping)
        return None

    @property
    def key(self) -> str:
        """A stable identity, the JSON's and the SVG's: the :attr:`owner`'s text
        (``container:101``, ``vm:pro6000-vm``), else ``container:101,102``, ``vm:#201`` or
        ``free``."""
        owner = self.owner
        if owner is not None:
            return str(owner)
        if self.kind == "container":
            return "container:" + ",".join(map(str, self.containers))
        if self.kind == "vm":
            return "vm:#" + ",".join(map(str, self.vms))
        return "free"

    @property
    def rank(self) -> int:
        """Containers first, then VMs, then free."""
        return _RANK[self.kind]

    @property
    def sort_key(self) -> tuple[int, str, tuple[int, ...]]:
        """Containers by vmid, then VMs named by address (by vmid), then VM mappings by name,
        then free."""
        if self.kind == "container":
            return self.rank, "", tuple(self.containers)
        if self.kind == "vm":
            return (self.rank, self.mapping, ()) if self.mapping else (self.rank, "", tuple(self.vms))
        return self.rank, "", ()

    @property
    def label(self) -> str:
        """For people: ``container 101``, ``VM mapping pro6000-vm``, ``VM 201``, ``free``."""
        if self.kind == "container":
            return ("containers " if len(self.containers) > 1 else "container ") + ", ".join(
                map(str, self.containers)
            )
        if self.kind == "vm":
            if self.mapping:
                used = f" · VM {', '.join(map(str, self.vms))}" if self.vms else ""
                return f"VM mapping {self.mapping}{used}"
            return "VM " + ", ".join(map(str, self.vms))
        return "free"


_RANK = {"container": 0, "vm": 1, "free": 2}

FREE = OwnerView(kind="free")


class Companion(Strict):
    """A device that moves with a GPU (its IOMMU group's non-bridge members)."""

    address: str
    role: str = Field(description="function | foreign (see the facts' MemberRole)")
    class_: str | None = Field(None, alias="class")
    driver: str | None = None

    model_config = ConfigDict(populate_by_name=True)


class GpuView(Strict):
    """One GPU as the tree shows it; identical GPUs stay separate entries."""

    index: int = Field(description="Position in address order (the matrix's GPU<index>)")
    address: str
    model: str | None = None
    driver: str | None = None
    iommu_group: int | None = None
    minor: int | None = None
    numa_node: int | None = None
    link: str | None = Field(None, description="Current link, e.g. '32GT/s x16'")
    boot_vga: bool | None = None
    owner: OwnerView = Field(default_factory=lambda: FREE.model_copy())
    companions: list[Companion] = Field(default_factory=list)


class DeviceView(Strict):
    """A network adapter or NVMe drive as the tree shows it (``gputopo topo --all``)."""

    kind: Literal["nic", "nvme"]
    address: str
    name: str = Field(
        description="Its RDMA device, else network interface, else NVMe controller, else its address"
    )
    nic: int | None = Field(None, description="The matrix's NIC<index> (network adapters)")
    model: str | None = None
    driver: str | None = None
    numa_node: int | None = None


class TreeNode(Strict):
    """A node of the tree: NUMA node -> host bridge -> root port -> switches -> GPU / NVSwitch
    (and, with ``--all``, network adapters and NVMe drives)."""

    kind: Literal["numa", "host_bridge", "root_port", "switch", "bridge", "gpu", "nvswitch", "nic", "nvme"]
    id: str = Field(description="'numa:0' / 'numa:?', a host bridge 'dddd:bb', else a PCI address")
    label: str
    detail: str | None = Field(
        None, description="Second line: CPUs of a NUMA node, a bridge's model, an adapter's model and driver"
    )
    gpu: GpuView | None = None
    device: DeviceView | None = Field(None, description="A network adapter or NVMe drive (kind nic, nvme)")
    children: list[TreeNode] = Field(default_factory=list)

    def walk(self):
        """This node and every node below it, depth first."""
        yield self
        for c in self.children:
            yield from c.walk()


class MatrixGpu(Strict):
    index: int
    address: str
    numa_node: int | None = None
    cpus: str | None = Field(None, description="The GPU's local CPUs (nvidia-smi's CPU Affinity)")
    minor: int | None = None


class MatrixNic(Strict):
    index: int = Field(description="NIC<index>: adapters with an RDMA device first, each part by address")
    name: str = Field(
        description="The NIC legend's name: its RDMA device, else network interface, else address"
    )
    address: str
    numa_node: int | None = None
    rdma: bool = Field(description="It has an RDMA device (nvidia-smi topo -m lists only those)")


class DistanceMatrix(Strict):
    """GPU-to-GPU and GPU-to-network-adapter PCIe distance, as ``nvidia-smi topo -m`` names
    it, computed from sysfs."""

    gpus: list[MatrixGpu] = Field(default_factory=list)
    levels: list[list[str]] = Field(
        default_factory=list, description="levels[i][j]: GPU i to GPU j: X, PIX, PXB, PHB, NODE, SYS"
    )
    nics: list[MatrixNic] = Field(default_factory=list, description="The network adapters, NIC0 first")
    nic_levels: list[list[str]] = Field(
        default_factory=list,
        description="nic_levels[k]: NIC k to GPU0.. then to NIC0.. (GPU i to NIC k is nic_levels[k][i])",
    )
    legend: dict[str, str] = Field(default_factory=lambda: dict(LEGEND))
    notes: list[str] = Field(default_factory=list)


class OwnerCount(Strict):
    key: str
    label: str
    gpus: int


class TopoReport(Strict):
    """``gputopo topo --json``: the tree and the matrix of one host."""

    schema_version: int = VERSION
    hostname: str | None = None
    owners: list[OwnerCount] = Field(default_factory=list, description="Each owner and how many GPUs it has")
    tree: list[TreeNode] = Field(default_factory=list, description="One root per NUMA node with devices")
    matrix: DistanceMatrix = Field(default_factory=DistanceMatrix)
    warnings: list[str] = Field(default_factory=list)
