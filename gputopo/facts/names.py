"""Model names of PCI devices: the root's ``pci.ids``, and udev's database on the live host.

A model name is a nicety: nothing here is required, and nothing here raises.
"""

from __future__ import annotations

import os

from gputopo.facts.files import read_whole

TYPE_CHECKING = False  # collections.abc costs discovery's start-up; the annotations need it only
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

# Where distributions keep the PCI id database, relative to the root.
PCI_IDS_PATHS = ("usr/share/misc/pci.ids", "usr/share/hwdata/pci.ids", "usr/share/pci.ids")


def parse_pci_ids(text: str | bytes, wanted: set[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """Device names from a ``pci.ids`` database (its text, or its bytes as read) for the wanted
    ``('10de', '2bb5')`` pairs.

    Returns {(vendor, device): name}; ids are 4 lowercase hex digits without ``0x``, as the
    database writes them. Only the wanted vendors' blocks are read (the whole database is some
    40,000 lines, 1.3 MB). The class section at the end (``C xx``, then tab-indented lines)
    has no line that starts with a vendor id, and its first line ends the last vendor's block.
    """
    data = text.encode() if isinstance(text, str) else text
    names: dict[tuple[str, str], str] = {}
    for vendor in sorted({v for v, _ in wanted}):
        block = _vendor_block(data, vendor)
        if block is None:
            continue
        lowered = block.lower()
        for v, did in wanted:
            name = _device_name(block, lowered, did) if v == vendor else None
            if name is not None:
                names[(vendor, did)] = name
    return names


# (database, {vendor: its block or None}): the blocks of the last database looked in, since
# discovery looks names up twice (its devices, then the bridges above them)
_BLOCKS: tuple[bytes, dict[str, bytes | None]] = (b"", {})


def _vendor_block(data: bytes, vendor: str) -> bytes | None:
    """The block of ``vendor`` in the database ``data``: its line (the first line that starts
    with its id), then device lines (one tab) and subsystem lines (two), up to the next line
    that starts with neither a tab nor a comment; None when no line starts with the id."""
    global _BLOCKS
    if _BLOCKS[0] is not data:
        _BLOCKS = (data, {})
    blocks = _BLOCKS[1]
    if vendor not in blocks:
        key = vendor.encode()
        # the id itself is rare elsewhere (a subsystem line's vendor now and then), whereas
        # searching for a newline and the id stops at every line
        start = data.find(key)
        while start > 0 and data[start - 1] != 0x0A:
            start = data.find(key, start + 1)
        blocks[vendor] = data[start : _block_end(data, start)] if start >= 0 else None
    return blocks[vendor]


def _device_name(block: bytes, lowered: bytes, did: str) -> str | None:
    """The name on the last device line of a vendor's ``block`` (``lowered``: the same, in
    lower case) whose id, in any case, is ``did``; None when no line is."""
    if len(did) != 4:  # not an id as the database writes one: only a line that is just it
        lines = block.decode("utf-8", "replace").split("\n")[1:]
        found = [
            ln[5:].strip() for ln in lines if ln[:1] == "\t" and ln[1:2] != "\t" and ln[1:5].lower() == did
        ]
        return found[-1] if found else None
    at = lowered.rfind(b"\n\t" + did.encode())
    if at < 0:
        return None
    line_end = block.find(b"\n", at + 1)
    return block[at + 6 : line_end if line_end >= 0 else len(block)].decode("utf-8", "replace").strip()


# Every byte but the three a line inside a vendor's block may start with (a tab: a device or
# subsystem line; ``#``: a comment; a newline: an empty line) made ``x``: in a stretch of the
# database so translated, ``\nx`` is the first line after the block.
_LINE_STARTS = bytes(b if b in b"\t#\n" else 0x78 for b in range(256))


def _block_end(data: bytes, start: int) -> int:
    """Where the vendor block starting at ``start`` ends: the newline before the first line
    that starts with neither a tab, a comment sign nor a newline; else the end of ``data``."""
    pos, size = start, 1 << 14
    while pos < len(data) - 1:
        at = data[pos : pos + size + 1].translate(_LINE_STARTS).find(b"\nx")
        if at >= 0:
            return pos + at
        pos, size = pos + size, size * 2  # the next stretch starts with this one's last byte
    return len(data)


# path -> ((mtime, size), bytes): the last pci.ids read. Discovery looks names up twice (its
# GPUs, then the bridges above them) in a database of 1.3 MB.
_DATABASE: dict[str, tuple[tuple[int, int], bytes]] = {}


def _read_database(path: str) -> bytes | None:
    """The bytes of the ``pci.ids`` at ``path``, read again only when the file changed."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (st.st_mtime_ns, st.st_size)
    hit = _DATABASE.get(path)
    if hit is not None and hit[0] == key:
        return hit[1]
    data = read_whole(path)
    _DATABASE.clear()
    if data is not None:
        _DATABASE[path] = (key, data)
    return data


def load_pci_names(root: str, wanted: Mapping[str, tuple[str, str]]) -> dict[str, str]:
    """Model names of the wanted PCI functions (address -> ``('10de', '2bb5')``), by address.

    The root's ``pci.ids`` names each function by its ids. On the live root ``/``, a function
    whose ids ``pci.ids`` lacks (a distribution's ``pci.ids`` often predates the newest GPUs)
    is named by its own entry in udev's database (:func:`udev_names`). A fixture or snapshot
    root is not this host, so its names come from its own ``pci.ids`` only. Returns
    {address: name} for the functions some source names.
    """
    pairs = set(wanted.values())
    by_ids: dict[tuple[str, str], str] = {}
    for rel in PCI_IDS_PATHS:
        data = _read_database(os.path.join(root, rel)) if pairs else None
        if data is not None:
            by_ids = parse_pci_ids(data, pairs)
            break
    names = {a: by_ids[ids] for a, ids in wanted.items() if ids in by_ids}
    missing = [a for a in wanted if a not in names]
    if missing and os.path.realpath(root) == "/":
        names.update(udev_names(missing))
    return names


def udev_names(addresses: Iterable[str]) -> dict[str, str]:
    """Model names (``ID_MODEL_FROM_DATABASE``) of live PCI functions from udev's database,
    through pyudev's public API (``Devices.from_name(context, 'pci', address).properties``).

    udev puts the name there when it processes the device's events: its default rules import
    the hwdb for every device with a modalias (``50-udev-default.rules``: ``IMPORT{builtin}=
    "hwdb --subsystem=$env{SUBSYSTEM}"``), so it is the name udev itself shows, subsystem
    included where the hwdb has one. Where udev keeps no database (a container, a host root
    that is not this machine) nothing is named here and ``pci.ids`` stays the only source.
    Returns {address: name} for the functions whose entry has one; never raises: a model name
    is a nicety, never required.
    """
    try:
        import pyudev

        context = pyudev.Context()
    except Exception:
        return {}
    out: dict[str, str] = {}
    for address in sorted(set(addresses)):
        try:
            name = pyudev.Devices.from_name(context, "pci", address).properties.get("ID_MODEL_FROM_DATABASE")
        except Exception:  # gone from the bus, or udev has no entry for it
            continue
        if name:
            out[address] = name
    return out
