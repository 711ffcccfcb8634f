"""A container's ``devN`` entries by the GPU each stands for, not by the minor it had.

The nvidia driver gives a GPU the lowest free minor at each probe, with no memory of the one it
had (open-gpu-kernel-modules ``kernel-open/nvidia/nv.c`` l.5629-5644
``nv_linux_assign_minor_locked``, ``find_first_zero_bit``, called by ``nv_pci_probe`` in
``kernel-open/nvidia/nv-pci.c`` l.2126; the remove path clears the bit, l.2394). A GPU that
went to vfio-pci and came back may hold another minor, and its old ``/dev/nvidiaN`` (a node
nothing removes) may then reach another GPU. So a ``devN`` line saved before a change names the
right GPU only while the minors are the same: what an undo restores is each entry's GPU, by
address, with the minor that GPU has now (``/proc/driver/nvidia/gpus/<addr>/information``).
"""

from __future__ import annotations

import re
from typing import Any

from gputopo.formats.devn import dev_entries, dev_path
from gputopo.model.facts import Facts

GPU_NODE = re.compile(r"/dev/nvidia(\d+)")


def node_minor(value: str) -> int | None:
    """The minor of a devN value naming a GPU node (``/dev/nvidiaN``), else None."""
    m = GPU_NODE.fullmatch(dev_path(value))
    return int(m.group(1)) if m else None


def nvidia_minors(facts: Facts) -> dict[int, str]:
    """minor -> address of every GPU on the nvidia driver in ``facts``."""
    return {g.minor: g.address for g in facts.gpus if g.driver == "nvidia" and g.minor is not None}


def devn_addresses(config: dict[str, Any], minors: dict[int, str]) -> dict[str, str]:
    """devN key -> the address of the GPU its ``/dev/nvidiaN`` reaches, for the entries of
    ``config`` whose minor a GPU on nvidia holds (``minors``: minor -> address, read now)."""
    out = {}
    for k, v in dev_entries(config).items():
        m = node_minor(v)
        if m is not None and m in minors:
            out[k] = minors[m]
    return out


def with_minor(value: str, minor: int) -> str:
    """devN ``value`` with its ``/dev/nvidiaN`` path set to minor ``minor``, options kept."""
    path = dev_path(value)
    head = str(value).split(",", 1)[0]
    return str(value).replace(head, head.replace(path, f"/dev/nvidia{minor}"), 1)


def by_address(
    config: dict[str, Any], addresses: dict[str, str], minors: dict[str, int | None]
) -> tuple[dict[str, Any], list[str]]:
    """``config`` with each devN of ``addresses`` (devN -> address) naming its GPU's minor now
    (``minors``: address -> minor, read now). An entry whose GPU has no minor now (it is not
    back on nvidia) is left out: its old node may reach another GPU by now. Returns (the
    config, one line per entry left out, naming the devN, its GPU and what brings it back)."""
    out = dict(config)
    left = []
    for k, address in sorted(addresses.items()):
        if k not in out:
            continue
        minor = minors.get(address)
        if minor is None:
            left.append(
                f"left {k} ({dev_path(str(out.pop(k)))}) out: its GPU {address} is not on nvidia "
                "(its old node may reach another GPU); 'gputopo recover' gives it back once it is"
            )
            continue
        out[k] = with_minor(str(out[k]), minor)
    return out, left
