"""Tolerant reads under a host root: small attribute files, links and listings.

Discovery must not fail on an odd device, so these return None or [] where the kernel (or a
snapshot) has nothing to give; the callers decide what a missing value means.
"""

from __future__ import annotations

import os

from gputopo.errors import AddressError
from gputopo.model.facts import address_key, normalize_address


def read_text(path: str) -> str | None:
    """The text of a small attribute file (at most 64 KiB), or None when it cannot be read."""
    try:
        with open(path, "rb") as f:
            return f.read(65536).decode("utf-8", "replace")
    except OSError:
        return None


def read_whole(path: str) -> str | None:
    """The whole text of a file of any size (``pci.ids``), or None when it cannot be read."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
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


def addresses_in(path: str) -> dict[str, str]:
    """{normalised address: entry name} for the entries of ``path`` named like PCI addresses
    (any spelling, e.g. ``00000000:E1:00.0``); {} when ``path`` cannot be listed."""
    out: dict[str, str] = {}
    for name in list_dir(path):
        try:
            out[normalize_address(name)] = name
        except AddressError:
            continue
    return out


def sorted_addresses(path: str) -> list[tuple[str, str]]:
    """(normalised address, entry name) pairs of :func:`addresses_in`, sorted by address."""
    return sorted(addresses_in(path).items(), key=lambda p: address_key(p[0]))
