"""Where a VM with GPUs runs and what its firmware must map: NUMA placement and the 64-bit MMIO
window, each with the reason the plan shows. Pure.

* Placement: the VM's vCPUs and QEMU's threads pinned (``affinity``) to the CPUs of its GPUs'
  NUMA node, ``numa: 1``, and guest node 0 bound to that host node (``numa0: ...,hostnodes=N,
  policy=bind``) so its memory, hugepages included, comes from the GPUs' socket: qemu-server
  (``Memory.pm``) otherwise spreads guest sockets over host nodes from 0, and takes hugepages
  there.
* MMIO: OVMF maps 64-bit BARs into one window, historically 32 GiB unless the ``-fw_cfg``
  entry ``opt/ovmf/X-PciMmio64Mb`` sets its size (edk2 ``OvmfPkg/RUNTIME_CONFIG.md``); a
  device whose BAR does not fit gets no BAR and its guest driver cannot use it. BARs are
  naturally aligned powers of two, so placed largest first they fill a power-of-two window
  without holes: the window gputopo asks for is the next power of two above their sum. SeaBIOS
  has no such setting.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gputopo.formats.hostpci import mmio64_mb
from gputopo.model.facts import Facts, Gpu, format_cpulist, parse_cpulist

OVMF_DEFAULT_MMIO64 = 32 << 30  # bytes: OVMF's historical 64-bit PCI MMIO window
GIB = 1 << 30


def gib(n: int) -> str:
    """Bytes as GiB for a human: ``128 GiB``, ``512.1 GiB``."""
    return f"{n / GIB:.1f}".rstrip("0").rstrip(".") + " GiB"


def bar64_bytes(g: Gpu) -> int:
    """The 64-bit memory BARs of one GPU, in bytes (what the 64-bit window must hold)."""
    return sum(b.size for b in g.bars if b.kind == "mem64")


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@dataclass
class Placement:
    """Where a VM's GPUs are: the NUMA nodes, the CPUs to pin to (None: unknown), why."""

    nodes: list[int] = field(default_factory=list)
    affinity: str | None = None
    unknown: list[str] = field(default_factory=list)  # GPUs whose NUMA node is unknown


def placement(facts: Facts, gpus: list[Gpu]) -> Placement:
    """The NUMA nodes of ``gpus`` and the CPUs of those nodes (``affinity``; empty text when the
    nodes have no CPUs). Unknown nodes leave the affinity unset."""
    out = Placement(
        nodes=sorted({g.numa_node for g in gpus if g.numa_node is not None}),
        unknown=[g.address for g in gpus if g.numa_node is None],
    )
    if out.unknown or not out.nodes:
        return out
    cpus: set[int] = set()
    for n in facts.host.numa_nodes:
        if n.id in out.nodes:
            cpus |= parse_cpulist(n.cpulist)
    out.affinity = format_cpulist(cpus)
    return out


@dataclass
class Mmio:
    """The 64-bit MMIO window a VM needs for ``count`` GPUs: ``need`` bytes of BARs, the window
    to set (MiB, None when the firmware's default or the current setting fits), the one now."""

    need: int
    largest: int
    count: int
    now_mb: int | None
    set_mb: int | None

    def fits_default(self) -> bool:
        return self.need <= OVMF_DEFAULT_MMIO64


def mmio(gpus: list[Gpu], count: int, args: str | None, asked_mb: int | None) -> Mmio:
    """The window for ``count`` of ``gpus`` (the largest BAR sets: Proxmox picks among a
    mapping's GPUs at start), given the VM's ``args`` and the spec's ``mmio64_mb``."""
    per_gpu = sorted((bar64_bytes(g) for g in gpus), reverse=True)[:count]
    need = sum(per_gpu)
    largest = max((b.size for g in gpus for b in g.bars if b.kind == "mem64"), default=0)
    now = mmio64_mb(args)
    if asked_mb is not None:
        want = asked_mb
    elif need <= (now << 20 if now else OVMF_DEFAULT_MMIO64):
        want = None
    else:
        want = next_pow2(need) >> 20
    return Mmio(need=need, largest=largest, count=count, now_mb=now, set_mb=want if want != now else None)


def mmio_note(m: Mmio) -> str:
    """Why the window is what it is, for the plan."""
    bars = f"{m.count} GPU(s) with {gib(m.need)} of 64-bit BARs (largest {gib(m.largest)})"
    if m.set_mb is not None:
        return (
            f"{bars} do not fit OVMF's default 32 GiB 64-bit MMIO window: args gets "
            f"-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string={m.set_mb} ({gib(m.set_mb << 20)}); "
            "without it the firmware gives a GPU no BAR and the guest driver cannot use it"
        )
    if m.now_mb is not None:
        return f"{bars} fit the window args already sets ({gib(m.now_mb << 20)})"
    return f"{bars} fit OVMF's default 32 GiB 64-bit MMIO window"


def phys_bits_note(window_mb: int, memory_mib: int, cpu: str | None) -> str | None:
    """A warning when the guest CPU may not address the window: OVMF puts it at the top of the
    guest's physical address space, which QEMU sizes from the CPU model's phys-bits (40 bits,
    1 TiB, unless the host's are passed through)."""
    words = (cpu or "").split(",")
    if words[0] == "host" or any(w in ("phys-bits=host",) for w in words):
        return None
    bits = next(
        (int(w.split("=", 1)[1]) for w in words if w.startswith("phys-bits=") and w[10:].isdigit()), 40
    )
    if (window_mb << 20) + (memory_mib << 20) + (4 * GIB) <= 1 << bits:
        return None
    return (
        f"the guest CPU addresses {gib(1 << bits)} ({bits} phys-bits) but needs room for a "
        f"{gib(window_mb << 20)} MMIO window above {gib(memory_mib << 20)} of RAM: set cpu: host "
        "or add phys-bits=host to the VM's cpu"
    )
