"""The ``map`` lines of a PCI resource mapping as plain ``key=value`` fields. Pure.

A line reads ``id=10de:2bb5,iommugroup=40,node=pve1,path=0000:81:00.0,subsystem-id=10de:204e``
(pve-guest-common ``PVE/Mapping/PCI.pm``: ``path`` may join devices passed together with ``;``).
"""

from __future__ import annotations

from functools import lru_cache

# A cluster's mapping holds one line per GPU and node, and every node's plan reads all of them:
# the same few thousand lines are split again and again, so the pure results are kept.
_CACHE = 1 << 16


@lru_cache(maxsize=_CACHE)
def _fields(entry: str) -> tuple[tuple[str, str], ...]:
    out: dict[str, str] = {}
    for part in entry.split(","):
        if "=" in part:
            k, v = part.split("=", 1)
            out[k.strip()] = v.strip()
    return tuple(out.items())


def map_fields(entry: str) -> dict[str, str]:
    """``{key: value}`` of one map line (a new dict each call); parts without ``=`` are ignored."""
    return dict(_fields(entry))


@lru_cache(maxsize=_CACHE)
def map_node(entry: str) -> str | None:
    """The ``node`` of one map line (None when it names none)."""
    return dict(_fields(entry)).get("node")


def map_paths(entry: str) -> list[str]:
    """The devices of one map line (``path=A;B`` -> [A, B]). A path without its function maps
    the whole device (pve-guest-common Mapping/PCI.pm ``path``): it stands for function 0, the
    GPU, so ``0000:07:00`` -> ``0000:07:00.0``."""
    return list(_paths(entry))


@lru_cache(maxsize=_CACHE)
def _paths(entry: str) -> tuple[str, ...]:
    paths = dict(_fields(entry)).get("path", "").split(";")
    return tuple(p if "." in p else f"{p}.0" for p in paths if p)


@lru_cache(maxsize=_CACHE)
def normalize_map_entry(entry: str) -> str:
    """A map entry in Proxmox's canonical form: keys sorted, hex lowercase."""
    fields = map_fields(entry)
    for k in ("id", "subsystem-id", "path"):
        if k in fields:
            fields[k] = fields[k].lower()
    return ",".join(f"{k}={v}" for k, v in sorted(fields.items()))
