"""Model names of PCI devices: the root's ``pci.ids``, and udev's hwdb on the live host.

A model name is a nicety: nothing here is required, and nothing here raises.
"""

from __future__ import annotations

import os
import re

from gputopo.facts.files import read_whole

# Where distributions keep the PCI id database, relative to the root.
PCI_IDS_PATHS = ("usr/share/misc/pci.ids", "usr/share/hwdata/pci.ids", "usr/share/pci.ids")
_NEXT_BLOCK = re.compile(rb"\n[^\t#\n]")  # a line that is neither a device, a comment nor empty


def parse_pci_ids(text: str | bytes, wanted: set[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """Device names from a ``pci.ids`` database (its text, or its bytes as read) for the wanted
    ``('10de', '2bb5')`` pairs.

    Returns {(vendor, device): name}; ids are 4 lowercase hex digits without ``0x``, as the
    database writes them. Only the wanted vendors' blocks are read (the whole database is some
    40,000 lines, 1.3 MB). The class section at the end (``C xx``, then tab-indented lines)
    has no line that starts with a vendor id, and its first line ends the last vendor's block.
    """
    data = text.encode() if isinstance(text, str) else text
    end = len(data)
    names: dict[tuple[str, str], str] = {}
    for vendor in sorted({v for v, _ in wanted}):
        key = vendor.encode()
        if data.startswith(key):
            start = 0
        else:
            start = data.find(b"\n" + key, 0, end) + 1
            if start == 0:
                continue
        # the vendor's block: its line, then device lines (one tab) and subsystem lines (two),
        # up to the next line that starts with neither a tab nor a comment
        nxt = _NEXT_BLOCK.search(data, start, end)
        block = data[start : nxt.start() if nxt else end].decode("utf-8", "replace")
        for line in block.split("\n")[1:]:
            if line[:1] == "\t" and line[1:2] != "\t":
                did = line[1:5].lower()
                if (vendor, did) in wanted:
                    names[(vendor, did)] = line[5:].strip()
    return names


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


def load_pci_names(root: str, wanted: set[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """Names from the root's ``pci.ids``; on the live root ``/``, udev's hwdb fills the ids
    that ``pci.ids`` lacks (a distribution's ``pci.ids`` often predates the newest GPUs).

    A fixture or snapshot root is not this host, so its names come from its own ``pci.ids``
    only. Returns {(vendor, device): name} for the pairs some source names.
    """
    names: dict[tuple[str, str], str] = {}
    for rel in PCI_IDS_PATHS:
        data = _read_database(os.path.join(root, rel)) if wanted else None
        if data is not None:
            names = parse_pci_ids(data, wanted)
            break
    missing = wanted - set(names)
    if missing and os.path.realpath(root) == "/":
        names.update(udev_hwdb_names(missing))
    return names


def hwdb_modalias(vendor: str, device: str) -> str:
    """The hwdb lookup key for a PCI id: ``('10de', '2bb5')`` -> ``'pci:v000010DEd00002BB5'``."""
    return f"pci:v{int(vendor, 16):08X}d{int(device, 16):08X}"


def udev_hwdb_names(wanted: set[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """Device names (``ID_MODEL_FROM_DATABASE``) from the live host's udev hwdb, via pyudev.

    ``wanted`` holds ``('10de', '2bb5')`` pairs. Returns {pair: name} for the pairs the hwdb
    knows; {} when pyudev, libudev or a compiled hwdb (``hwdb.bin``) is unavailable. Never
    raises: a model name is a nicety, never required.
    """
    try:
        import pyudev
        from pyudev._util import udev_list_iterate

        ctx = pyudev.Context()
        # pyudev has no public hwdb API; its libudev binding declares the hwdb calls.
        lib = ctx._libudev
        hwdb = lib.udev_hwdb_new(ctx)
    except Exception:
        return {}
    if not hwdb:
        return {}
    out: dict[tuple[str, str], str] = {}
    try:
        for vendor, device in sorted(wanted):
            entry = lib.udev_hwdb_get_properties_list_entry(hwdb, hwdb_modalias(vendor, device).encode(), 0)
            props = dict(udev_list_iterate(lib, entry))
            name = props.get(b"ID_MODEL_FROM_DATABASE")
            if name:
                out[(vendor, device)] = name.decode("utf-8", "replace")
    except Exception:
        return out
    finally:
        lib.udev_hwdb_unref(hwdb)
    return out
