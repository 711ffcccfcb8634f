"""One PCI function: the pure parsers of its sysfs attributes and the reading of its directory.

Every function takes the host ``root``; the functions are read from
``<root>/sys/bus/pci/devices/<address>`` (a link into ``sys/devices``).
"""

from __future__ import annotations

import os

from gputopo.facts.files import link_name, list_dir, read_attr, sorted_addresses, stripped
from gputopo.model.facts import PciFunction, normalize_address

TYPE_CHECKING = False  # pathlib costs discovery's start-up; the annotations need it only
if TYPE_CHECKING:
    from pathlib import Path

PCI_DEVICES = "sys/bus/pci/devices"


# --- pure parsers ------------------------------------------------------------------------


def parse_hex_id(text: str | None, width: int = 4, zero_ok: bool = False) -> str | None:
    """``'0x10de\\n'`` -> ``'0x10de'``; None for missing, malformed, all-ones or all-zero ids.

    ``width`` is the number of hex digits (4 for vendor/device ids, 6 for the class).
    ``zero_ok`` keeps an all-zero id: a subsystem id of 0x0000 is a real value (Intel's X710
    reads ``8086:0000``), while a vendor or device id of 0 means the read failed.
    """
    if text is None:
        return None
    t = text.strip().lower()
    # isascii and isalnum leave int() only hex digits to accept: no sign, space or underscore
    if t[:2] != "0x" or not (t.isascii() and t[2:].isalnum()):
        return None
    try:
        value = int(t, 16)
    except ValueError:
        return None
    if (value == 0 and not zero_ok) or value >= (1 << (4 * width)) - 1:
        return None
    return t if len(t) == width + 2 else f"0x{value:0{width}x}"


def parse_subsystem_id(text: str | None) -> str | None:
    """A ``subsystem_vendor``/``subsystem_device`` attribute: like :func:`parse_hex_id`, but
    ``0x0000`` is kept."""
    return parse_hex_id(text, zero_ok=True)


def parse_int(text: str | None) -> int | None:
    """A decimal integer attribute (``'-1\\n'`` -> -1); None when missing or malformed."""
    if text is None:
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None


def parse_reset_method(text: str | None) -> list[str] | None:
    """``'flr bus\\n'`` -> ['flr', 'bus']; None when missing; [] when empty."""
    if text is None:
        return None
    return text.split()


# --- reading -----------------------------------------------------------------------------


def pci_devices_dir(root: str | Path) -> str:
    """``<root>/sys/bus/pci/devices``. Raises :class:`RootError` when the root has none."""
    d = os.path.join(str(root), PCI_DEVICES)
    if not os.path.isdir(d):
        from gputopo.errors import RootError  # here: discovery's start-up need not build them

        raise RootError(str(root), f"no {PCI_DEVICES}")
    return d


class AttrReader:
    """Reads each attribute of a root's PCI functions at most once (discovery looks at some
    attributes of every function before it reads the GPUs whole)."""

    def __init__(self, devdir: str):
        self.devdir = devdir
        self.cache: dict[tuple[str, str], str | None] = {}

    def attr(self, name: str, attr: str) -> str | None:
        """The text of ``<devdir>/<name>/<attr>``; None when it cannot be read."""
        key = (name, attr)
        if key not in self.cache:
            self.cache[key] = read_attr(f"{self.devdir}/{name}/{attr}")
        return self.cache[key]

    def link(self, name: str, attr: str) -> str | None:
        """The last component of the ``<devdir>/<name>/<attr>`` link; None when it is not one."""
        return link_name(f"{self.devdir}/{name}/{attr}")

    def ids(self, name: str) -> tuple[str | None, str | None, str | None]:
        """(vendor, device, class) of the device directory ``name``, each None when unreadable."""
        cache = self.cache
        if (name, "vendor") not in cache:  # discovery asks this of every function: no attr() calls
            base = f"{self.devdir}/{name}/"
            for attr in ("vendor", "device", "class"):
                cache[(name, attr)] = read_attr(base + attr)
        return (
            parse_hex_id(cache[(name, "vendor")]),
            parse_hex_id(cache[(name, "device")]),
            parse_hex_id(cache[(name, "class")], 6),
        )

    def subsystem(self, name: str) -> tuple[str | None, str | None]:
        """(subsystem vendor, subsystem device) of the device directory ``name``."""
        return (
            parse_subsystem_id(self.attr(name, "subsystem_vendor")),
            parse_subsystem_id(self.attr(name, "subsystem_device")),
        )


def read_function(rd: AttrReader, name: str, address: str) -> PciFunction:
    """Read the attributes of the device directory ``name`` into a PciFunction (model unset)."""
    vendor, device, klass = rd.ids(name)
    subsystem_vendor, subsystem_device = rd.subsystem(name)
    override = stripped(rd.attr(name, "driver_override"))
    group = rd.link(name, "iommu_group")
    numa = parse_int(rd.attr(name, "numa_node"))
    return PciFunction(
        address=address,
        vendor=vendor,
        device=device,
        **{"class": klass},
        subsystem_vendor=subsystem_vendor,
        subsystem_device=subsystem_device,
        driver=rd.link(name, "driver"),
        driver_override=None if override in (None, "", "(null)") else override,
        iommu_group=int(group) if group is not None and group.isdigit() else None,
        numa_node=numa if numa is not None and numa >= 0 else None,
        readable=vendor is not None and device is not None,
    )


def list_pci_functions(root: str | Path = "/") -> list[PciFunction]:
    """Every PCI function under ``<root>/sys/bus/pci/devices``, sorted by address.

    Unreadable ids (missing, 0xffff, 0x0000) come back as None with ``readable=False``;
    ``numa_node`` -1 comes back as None; ``model`` is not looked up here.
    Raises :class:`RootError` when the root has no ``sys/bus/pci/devices``.
    """
    devdir = pci_devices_dir(root)
    rd = AttrReader(devdir)
    return [read_function(rd, name, addr) for addr, name in sorted_addresses(devdir)]


def read_pci_function(root: str | Path, address: str) -> PciFunction | None:
    """One PCI function by address (any accepted spelling), or None when it is not there.

    Raises :class:`RootError` for a root without ``sys/bus/pci/devices`` and
    :class:`gputopo.errors.AddressError` for a malformed address.
    """
    devdir = pci_devices_dir(root)
    addr = normalize_address(address)
    for name in (addr, _wide_domain(addr)):
        if os.path.isdir(os.path.join(devdir, name)):
            return read_function(AttrReader(devdir), name, addr)
    return None


def _wide_domain(address: str) -> str:
    """The 8-digit-domain spelling some tools use (``00000000:01:00.0``)."""
    dom, rest = address.split(":", 1)
    return f"{int(dom, 16):08x}:{rest}"


def read_drm_nodes(root: str | Path, address: str) -> list[str]:
    """The ``/dev/dri`` names (``card1``, ``renderD128``) the kernel's DRM driver made for the
    function at ``address`` (its ``drm/`` directory in sysfs), sorted; [] when it has none.

    ``address`` is used as written (normalise it first). Raises nothing.
    """
    names = list_dir(os.path.join(str(root), PCI_DEVICES, address, "drm"))
    return sorted(n for n in names if n.startswith(("card", "renderD")))
