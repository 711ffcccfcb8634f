"""Model names of PCI devices: the root's ``pci.ids``, and udev's hwdb on the live host.

A model name is a nicety: nothing here is required, and nothing here raises.
"""

from __future__ import annotations

import os

from gputopo.facts.files import read_whole

# Where distributions keep the PCI id database, relative to the root.
PCI_IDS_PATHS = ("usr/share/misc/pci.ids", "usr/share/hwdata/pci.ids", "usr/share/pci.ids")


def parse_pci_ids(text: str, wanted: set[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """Device names from a ``pci.ids`` database for the wanted ``('10de', '2bb5')`` pairs.

    Returns {(vendor, device): name}; ids are 4 lowercase hex digits without ``0x``.
    Stops reading at the class section (``C xx``), where names are no longer device names.
    """
    want_vendors = {v for v, _ in wanted}
    names: dict[tuple[str, str], str] = {}
    vendor: str | None = None
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        if line[0] != "\t":
            if line.startswith("C "):
                break
            vid = line[:4].lower()
            vendor = vid if vid in want_vendors else None
            continue
        if vendor is None or line.startswith("\t\t"):
            continue
        did = line[1:5].lower()
        if (vendor, did) in wanted:
            names[(vendor, did)] = line[5:].strip()
    return names


def load_pci_names(root: str, wanted: set[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """Names from the root's ``pci.ids``; on the live root ``/``, udev's hwdb fills the ids
    that ``pci.ids`` lacks (a distribution's ``pci.ids`` often predates the newest GPUs).

    A fixture or snapshot root is not this host, so its names come from its own ``pci.ids``
    only. Returns {(vendor, device): name} for the pairs some source names.
    """
    names: dict[tuple[str, str], str] = {}
    for rel in PCI_IDS_PATHS:
        text = read_whole(os.path.join(root, rel)) if wanted else None
        if text is not None:
            names = parse_pci_ids(text, wanted)
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
