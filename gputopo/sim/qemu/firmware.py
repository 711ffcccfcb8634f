"""What a VM's firmware does with the BARs of its passed-through devices.

OVMF maps every 64-bit BAR into one 64-bit PCI MMIO window, historically 32 GiB unless the
``-fw_cfg`` entry ``opt/ovmf/X-PciMmio64Mb`` sets its size in MiB (edk2
``OvmfPkg/RUNTIME_CONFIG.md``). When the BARs do not fit, edk2's PCI bus driver drops the
requests it cannot place, largest first: that device gets no BAR, the guest sees it without
one and its driver cannot use it ("This PCI I/O region assigned to your NVIDIA device is
invalid"); the VM itself starts. SeaBIOS has no such setting: it is modelled with the same
32 GiB. BARs are naturally aligned powers of two, so devices placed largest first fill the
window without holes and "fits" is "the sum fits".
"""

from __future__ import annotations

from pathlib import Path

from gputopo.facts.bars import parse_resource
from gputopo.formats.hostpci import mmio64_mb

DEFAULT_WINDOW = 32 << 30


def bar64(root: Path, address: str) -> int:
    """Bytes of 64-bit memory BARs of the host device ``address`` (from its sysfs ``resource``)."""
    try:
        text = (root / "sys/bus/pci/devices" / address / "resource").read_text()
    except OSError:
        return 0
    return sum(b.size for b in parse_resource(text) if b.kind == "mem64")


def window(args: list[str] | None, bios: str) -> int:
    """The 64-bit MMIO window (bytes) of a VM whose QEMU got ``args`` (None: none of them)."""
    if bios == "ovmf" and args:
        mb = mmio64_mb(" ".join(args))
        if mb:
            return mb << 20
    return DEFAULT_WINDOW


def place(devices: list[str], need: dict[str, int], size: int) -> dict[str, bool]:
    """address -> whether it got its BARs, for ``devices`` with ``need`` bytes each in a window
    of ``size`` bytes: placed largest first; a request that does not fit is dropped."""
    out: dict[str, bool] = {}
    used = 0
    for a in sorted(devices, key=lambda a: (-need.get(a, 0), a)):
        fits = used + need.get(a, 0) <= size
        out[a] = fits
        used += need.get(a, 0) if fits else 0
    return out
