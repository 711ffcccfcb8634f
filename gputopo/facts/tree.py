"""Where each GPU and NVSwitch hangs in the PCI hierarchy: its host bridge and the bridges above it.

The kernel places every PCI function's directory under its parent bridge's, starting from the
host bridge's ``sys/devices/pci<domain>:<bus>`` (drivers/pci/probe.c registers a bus's devices
as children of its bridge device), and ``sys/bus/pci/devices/<address>`` links there. So the
chain of bridges from the host bridge down to a device is read from where that link resolves:

``sys/devices/pci0000:00/0000:00:01.1/0000:01:00.0/0000:02:00.0/0000:03:00.0``
-> host bridge ``0000:00``, bridges ``00:01.1`` (root port), ``01:00.0``, ``02:00.0``.

A bridge's kind is the Device/Port Type of its PCI Express capability, read from ``config``
(readable in full by root; others see only 64 bytes and get the kind inferred from the chain).
Pure ``parse_*`` functions do the work; :func:`add_topology` is what discovery calls.
"""

from __future__ import annotations

import os

from gputopo.facts.files import address_of, addresses_in, read_text
from gputopo.facts.names import load_pci_names
from gputopo.facts.pci import parse_hex_id
from gputopo.model.facts import Bridge, Facts, PciFunction, format_cpulist, parse_cpulist

PCI_DEVICES = "sys/bus/pci/devices"
SYS_DEVICES = "sys/devices"

# PCI Express capability, Device/Port Type (PCIe base spec 7.5.3.2; linux/pci_regs.h PCI_EXP_TYPE_*)
PORT_KINDS = {
    4: "root_port",
    5: "switch_upstream",
    6: "switch_downstream",
    7: "pcie_to_pci",
    8: "pci_to_pcie",
}
_CAP_EXP = 0x10
_HEX = frozenset("0123456789abcdefABCDEF")


def _host_bridge(part: str) -> str | None:
    """``'pci0000:00'`` -> ``'0000:00'`` (domain of 4 digits or more, bus of 2, normalised);
    None for any other path component."""
    if not part.startswith("pci"):
        return None
    domain, colon, bus = part[3:].partition(":")
    if bus[-1:] == "\n":
        bus = bus[:-1]  # as a regular expression's $ would have it
    if not colon or len(domain) < 4 or len(bus) != 2 or not _HEX.issuperset(domain + bus):
        return None
    return f"{int(domain, 16):04x}:{int(bus, 16):02x}"


# --- pure parsers ------------------------------------------------------------------------


def parse_device_path(rel: str) -> tuple[str | None, list[str]]:
    """Split a device's path below ``sys/devices`` into (host bridge, PCI addresses).

    ``'pci0000:00/0000:00:01.1/0000:01:00.0'`` -> ``('0000:00', ['0000:00:01.1', '0000:01:00.0'])``:
    the addresses run from the host bridge down to the device itself (the last one). Components
    before the first ``pciDDDD:BB`` (a platform device) are skipped; a nested ``pciDDDD:BB`` (a
    VMD domain below a PCI device) keeps the outer host bridge and the addresses on both sides.
    Returns (None, []) when the path holds no host bridge.
    """
    host: str | None = None
    addresses: list[str] = []
    for part in [p for p in rel.split("/") if p and p != "."]:
        bridge = _host_bridge(part)
        if bridge is not None:
            if host is None:
                host = bridge
            continue
        if host is None:
            continue
        addr = address_of(part)
        if addr is not None:  # else not a PCI function (e.g. a 'usb1' directory): not in the chain
            addresses.append(addr)
    return (host, addresses) if host is not None else (None, [])


def parse_pcie_port_type(config: bytes | None) -> int | None:
    """The Device/Port Type of a function's PCI Express capability, from its config space.

    Walks the capability list from offset 0x34 (when the Status register says there is one) to
    the capability with id 0x10 and returns bits 7:4 of its capabilities register (0 endpoint,
    4 root port, 5 upstream port, 6 downstream port, 7 PCIe-to-PCI bridge, ...). None when the
    bytes are too short (a non-root reader sees 64), all ones (a device off the bus), or have no
    such capability.
    """
    if not config or len(config) < 0x40 or config[0:2] == b"\xff\xff":
        return None
    status = int.from_bytes(config[0x06:0x08], "little")
    if not status & 0x10:
        return None
    ptr = config[0x34] & 0xFC
    seen: set[int] = set()
    while ptr and ptr not in seen and ptr + 4 <= len(config):
        seen.add(ptr)
        if config[ptr] == _CAP_EXP:
            return (int.from_bytes(config[ptr + 2 : ptr + 4], "little") >> 4) & 0xF
        ptr = config[ptr + 1] & 0xFC
    return None


def bridge_kinds(port_types: list[int | None]) -> list[str]:
    """The kind of each bridge of a chain (root port first) from its port type, or by place.

    A known port type decides (:data:`PORT_KINDS`; other types are ``bridge``). Without one, the
    first bridge under the host bridge is a root port, a bridge below a root port or a
    downstream port is a switch's upstream port, and one below an upstream port is a downstream
    port: the only way PCI Express links can nest.
    """
    kinds: list[str] = []
    for i, t in enumerate(port_types):
        if t is not None:
            kinds.append(PORT_KINDS.get(t, "bridge"))
        elif i == 0:
            kinds.append("root_port")
        elif kinds[-1] in ("root_port", "switch_downstream"):
            kinds.append("switch_upstream")
        elif kinds[-1] == "switch_upstream":
            kinds.append("switch_downstream")
        else:
            kinds.append("bridge")
    return kinds


# --- reading -----------------------------------------------------------------------------


def _read_bytes(path: str, size: int = 256) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read(size)
    except OSError:
        return None


def read_device_path(root: str, name: str) -> str | None:
    """Where ``sys/bus/pci/devices/<name>`` leads, relative to the root's ``sys/devices``;
    None when it is not a link or leads elsewhere (a damaged root)."""
    link = os.path.join(root, PCI_DEVICES, name)
    try:
        target = os.readlink(link)
    except OSError:
        return None
    # The kernel's link is relative ('../../../devices/pci0000:00/...') and every directory
    # under sys/devices is a real one: joining the link's text is what resolving it would
    # give, for one system call instead of one per path component.
    real = os.path.normpath(os.path.join(os.path.dirname(link), target))
    base = os.path.normpath(os.path.join(root, SYS_DEVICES))
    if not real.startswith(base + os.sep) or not os.path.isdir(real):
        return None
    return real[len(base) + 1 :]


def add_topology(root: str, facts: Facts) -> None:
    """Fill ``host_bridge`` and ``upstream`` of every GPU, NVSwitch, network adapter and NVMe drive
    of ``facts``, and each GPU's ``local_cpulist``, from the host under ``root``. A device whose link does not resolve
    under ``sys/devices`` keeps ``host_bridge`` null and gets a warning. Never raises."""
    entries = addresses_in(os.path.join(root, PCI_DEVICES))
    devices: list[PciFunction] = [*facts.gpus, *facts.nvswitches, *facts.nics, *facts.nvme]
    chains: dict[str, tuple[str | None, list[str]]] = {}
    for dev in devices:
        name = entries.get(dev.address)
        rel = read_device_path(root, name) if name else None
        if rel is None:
            facts.warnings.append(
                f"{dev.address}: {PCI_DEVICES}/{name or dev.address} does not resolve under "
                f"{SYS_DEVICES}; its place in the PCI tree is unknown"
            )
            chains[dev.address] = (None, [])
            continue
        host, addrs = parse_device_path(rel)
        chains[dev.address] = (host, addrs[:-1] if addrs and addrs[-1] == dev.address else addrs)

    bridges: dict[str, tuple[int | None, str | None, str | None]] = {}
    for _, chain in chains.values():
        for a in chain:
            if a in bridges:
                continue
            d = os.path.join(root, PCI_DEVICES, entries.get(a, a))
            bridges[a] = (
                parse_pcie_port_type(_read_bytes(os.path.join(d, "config"))),
                parse_hex_id(read_text(os.path.join(d, "vendor"))),
                parse_hex_id(read_text(os.path.join(d, "device"))),
            )
    names = load_pci_names(root, {a: (v[2:], d[2:]) for a, (_, v, d) in bridges.items() if v and d})

    for dev in devices:
        host, chain = chains[dev.address]
        dev.host_bridge = host
        kinds = bridge_kinds([bridges[a][0] for a in chain])
        dev.upstream = [
            Bridge(
                address=a,
                kind=k,
                vendor=bridges[a][1],
                device=bridges[a][2],
                model=names.get(a),
            )
            for a, k in zip(chain, kinds)
        ]
    for g in facts.gpus:
        name = entries.get(g.address)
        text = read_text(os.path.join(root, PCI_DEVICES, name, "local_cpulist")) if name else None
        try:
            g.local_cpulist = format_cpulist(parse_cpulist(text)) if text is not None else None
        except ValueError:
            g.local_cpulist = None
