"""Tolerant reads under a host root: small attribute files, links and listings.

Discovery must not fail on an odd device, so these return None or [] where the kernel (or a
snapshot) has nothing to give; the callers decide what a missing value means.
"""

from __future__ import annotations

import os

from gputopo.model.facts import canonical_address

# The classes whose devices name a network adapter or an NVMe drive: a driver's class devices
# sit under the PCI function in a directory named after their class (drivers/base/core.c,
# get_device_parent(): the class "glue" directory), e.g. <function>/infiniband/mlx5_0.
CLASS_DEVICE_DIRS = ("infiniband", "net", "nvme")


def class_devices(path: str, klass: str) -> list[str]:
    """The class devices ``klass`` (one of :data:`CLASS_DEVICE_DIRS`) a driver registered under
    the function directory ``path``, sorted; [] when there are none or it is unreadable."""
    try:
        return sorted(os.listdir(os.path.join(path, klass)))
    except OSError:
        return []


def read_text(path: str) -> str | None:
    """The text of a small attribute file (at most 64 KiB), or None when it cannot be read."""
    # os.open/os.read: a file object per attribute costs more than the read itself, and
    # discovery reads a few attributes of every PCI function
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        data = os.read(fd, 65536)
        while data and len(data) < 65536:  # procfs may answer a read in parts
            more = os.read(fd, 65536 - len(data))
            if not more:
                break
            data += more
        return data.decode("utf-8", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def read_attr(path: str) -> str | None:
    """The text of a sysfs attribute, or None when it cannot be read.

    One read: the kernel formats an attribute whole, at most a page, and hands it over on the
    first read (fs/sysfs/file.c, sysfs_kf_seq_show); a second read would only say "end".
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 65536).decode("utf-8", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def read_whole(path: str) -> bytes | None:
    """The whole content of a file of any size (``pci.ids``), or None when it cannot be read."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def stripped(text: str | None) -> str | None:
    """``text`` without surrounding whitespace; None stays None."""
    return text.strip() if text is not None else None


def link_name(path: str) -> str | None:
    """The last component of the link at ``path``; None when it is not a link."""
    try:
        return os.path.basename(os.readlink(path))
    except OSError:
        return None


def list_dir(path: str) -> list[str]:
    """The entries of ``path``; [] when it is missing or cannot be listed."""
    try:
        return os.listdir(path)
    except OSError:
        return []


# entry name -> its normalised address, or None: discovery meets each name in several listings
_ADDRESS_OF: dict[str, str | None] = {}
_LOWER_HEX = frozenset("0123456789abcdef")


def _canonical(name: str) -> bool:
    """Whether ``name`` is an address as the kernel writes it (``0000:e1:00.0``), checked
    without a regular expression (compiling one costs discovery's start-up more than this)."""
    return (
        len(name) == 12
        and name[4] == name[7] == ":"
        and name[10] == "."
        and name[8] in "01"
        and name[11] in "01234567"
        and _LOWER_HEX.issuperset(name[:4] + name[5:7] + name[9])
    )


def address_of(name: str) -> str | None:
    """The normalised PCI address an entry ``name`` spells (``00000000:E1:00.0`` ->
    ``0000:e1:00.0``), or None when it is not one."""
    try:
        return _ADDRESS_OF[name]
    except KeyError:
        pass
    # how the kernel names them is already normalised
    addr = name if _canonical(name) else canonical_address(name)
    _ADDRESS_OF[name] = addr
    return addr


def addresses_in(path: str) -> dict[str, str]:
    """{normalised address: entry name} for the entries of ``path`` named like PCI addresses
    (any spelling, e.g. ``00000000:E1:00.0``); {} when ``path`` cannot be listed."""
    out: dict[str, str] = {}
    for name in list_dir(path):
        addr = address_of(name)
        if addr is not None:
            out[addr] = name
    return out


def sorted_addresses(path: str) -> list[tuple[str, str]]:
    """(normalised address, entry name) pairs of :func:`addresses_in`, sorted by address."""
    # Normalised addresses differ only in the domain's width, the rest is fixed-width lowercase
    # hex: (length, text) orders them as address_key does, at a fraction of the cost.
    return sorted(addresses_in(path).items(), key=lambda p: (len(p[0]), p[0]))
