"""A PCI function's BARs from sysfs ``resource``: what a VM's firmware must map for it.

The kernel's ``resource_show`` (drivers/pci/pci-sysfs.c) prints one line per resource,
``0x%016llx 0x%016llx 0x%016llx\\n``: the start and end address as the CPU sees them and the
resource's ``IORESOURCE_*`` flags (include/linux/ioport.h); an empty resource reads all zeros.
Lines 0-5 are the BARs, line 6 the expansion ROM, the rest SR-IOV BARs (endpoints) or bridge
windows (bridges). A 96 GB RTX PRO 6000 Blackwell with resizable BAR shows BAR1 as a 128 GiB
64-bit prefetchable region: the size a VM's 64-bit MMIO window must hold for it.
"""

from __future__ import annotations

from gputopo.facts.pci import AttrReader
from gputopo.model.facts import Bar, BarKind

# include/linux/ioport.h
IORESOURCE_IO = 0x00000100
IORESOURCE_MEM = 0x00000200
IORESOURCE_PREFETCH = 0x00002000
IORESOURCE_MEM_64 = 0x00100000
ROM_INDEX = 6  # PCI_ROM_RESOURCE


def parse_resource(text: str | None) -> list[Bar]:
    """The non-empty BARs and ROM (lines 0-6) of a ``resource`` file's text, by index.

    A line of another shape ends the list there (nothing after it can be trusted); None or an
    empty text gives []. Never raises.
    """
    bars: list[Bar] = []
    for index, line in enumerate((text or "").splitlines()[: ROM_INDEX + 1]):
        parts = line.split()
        if len(parts) != 3:
            break
        try:
            start, end, flags = (int(p, 16) for p in parts)
        except ValueError:
            break
        if not flags & (IORESOURCE_IO | IORESOURCE_MEM) or end <= start:
            continue
        kind: BarKind
        if flags & IORESOURCE_IO:
            kind = "io"
        elif index == ROM_INDEX:
            kind = "rom"
        else:
            kind = "mem64" if flags & IORESOURCE_MEM_64 else "mem32"
        bars.append(
            Bar(
                index=index,
                kind=kind,
                prefetchable=bool(flags & IORESOURCE_PREFETCH),
                start=start,
                size=end - start + 1,
                flags=flags,
            )
        )
    return bars


def read_bars(rd: AttrReader, name: str) -> list[Bar]:
    """The BARs of the function whose ``sys/bus/pci/devices`` entry is ``name`` ([] when its
    ``resource`` cannot be read)."""
    return parse_resource(rd.attr(name, "resource"))


def format_size(size: int) -> str:
    """A region size as lspci writes it: ``128G``, ``32M``, ``512K``, ``128`` (bytes)."""
    for unit, shift in (("T", 40), ("G", 30), ("M", 20), ("K", 10)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift}{unit}"
    return str(size)
