"""A container's ``devN`` entries and gputopo's legacy ``lxc.*`` device lines: keys, values, and
which of them are nvidia's (the ones gputopo manages). Pure.

Proxmox's container config holds ``dev0`` .. ``dev255`` (pve-container ``LXC/Config.pm``,
``$MAX_DEVICES``); a value is ``[path=]/dev/...[,gid=..][,mode=0NNN][,uid=..][,deny-write=..]``.
"""

from __future__ import annotations

import re
from typing import Any

from gputopo.formats.lxcdev import format_dev_value

DEV_KEY = re.compile(r"^dev(\d+)$")
MAX_DEV_INDEX = 255


def is_devn_key(key: str) -> bool:
    """True for a container's ``devN`` key (any N)."""
    return DEV_KEY.match(key) is not None


def devn_key(n: int) -> str:
    """The config key of device entry ``n``: ``dev<n>``."""
    return f"dev{n}"


def dev_sort(key: str) -> int:
    """Sort key of a config key: N for ``devN``, after every devN for anything else."""
    m = DEV_KEY.match(key)
    return int(m.group(1)) if m else 10_000


def by_dev_index(d: dict[str, str]) -> list[tuple[str, str]]:
    """The items of a ``{devN: value}`` dict in index order."""
    return sorted(d.items(), key=lambda kv: dev_sort(kv[0]))


def format_dev(path: str, gid: int | None, mode: str | None) -> str:
    """A devN value in Proxmox's canonical form: the path, then the options sorted by key."""
    return format_dev_value(path, gid=gid, mode=mode or None)


def dev_path(value: str) -> str:
    """The device path of a devN value (``path=`` spelled or not)."""
    first = str(value).split(",", 1)[0]
    return first[5:] if first.startswith("path=") else first


def is_nvidia_dev(value: str) -> bool:
    """True when a devN value passes an nvidia node (``/dev/nvidia*``)."""
    return dev_path(value).startswith("/dev/nvidia")


GPU_NODE = re.compile(r"^nvidia\d+$")


def gpu_nodes(names: list[str]) -> list[str]:
    """The GPU nodes (``/dev/nvidiaN``, one per GPU; not nvidiactl or nvidia-uvm) among the
    names of an ``ls /dev``, as paths, in the order given."""
    return [f"/dev/{n}" for n in names if GPU_NODE.match(n)]


def is_nvidia_lxc(key: str, value: str, majors: set[int]) -> bool:
    """True when the raw ``lxc.*`` line ``key: value`` is an nvidia mount entry or a device rule
    for one of the char ``majors``: a line gputopo manages."""
    if key == "lxc.mount.entry":
        return value.strip().startswith("/dev/nvidia")
    if key.startswith("lxc.cgroup2.devices.allow") or key.startswith("lxc.cgroup.devices.allow"):
        m = re.match(r"^c\s+(\d+):", value.strip())
        return bool(m) and int(m.group(1)) in majors
    return False


def dev_entries(config: dict[str, Any]) -> dict[str, str]:
    """Every ``devN`` entry of a container config, values as text."""
    return {k: str(v) for k, v in config.items() if is_devn_key(k)}


def free_dev_key(used: dict[str, Any] | set[str]) -> str:
    """The lowest ``devN`` key not in ``used``. Raises ValueError when all 256 are taken."""
    for i in range(MAX_DEV_INDEX + 1):
        if devn_key(i) not in used:
            return devn_key(i)
    raise ValueError(f"every dev0..dev{MAX_DEV_INDEX} is in use")


def resolve_devices(
    config: dict[str, Any],
    set_: dict[str, str],
    delete: list[str],
    resolve: list[str],
    gid: int | None,
    mode: str | None,
    minors: dict[str, int | None],
) -> dict[str, str]:
    """The devN entries to add, besides ``set_``, for the ``resolve`` GPUs whose ``minors`` are
    now known: each new value at the lowest devN index that ``config`` (after ``set_`` and
    ``delete``) leaves free. Values already present are not added again.

    Raises KeyError naming a GPU whose minor is still unknown (it is not on nvidia).
    """
    after = {k: v for k, v in dev_entries(config).items() if k not in delete}
    after.update(set_)
    present = set(after.values())
    out: dict[str, str] = {}
    for address in resolve:
        minor = minors.get(address)
        if minor is None:
            raise KeyError(address)
        value = format_dev(f"/dev/nvidia{minor}", gid, mode)
        if value in present:
            continue
        key = free_dev_key(after)
        after[key] = value
        out[key] = value
        present.add(value)
    return out
