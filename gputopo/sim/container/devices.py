"""The ``/dev`` nodes a container config grants, and those the host lacks."""

from __future__ import annotations

import os
from pathlib import Path

from gputopo.errors import PveFormatError
from gputopo.formats.devn import is_devn_key
from gputopo.formats.lxcconf import parse_dev_value, parse_lxc_conf
from gputopo.sim.container.paths import SimPaths, inside, read_text


def _dev_paths(conf) -> list[str]:
    """The paths of the main section's ``devN`` entries in config order; one that does not
    parse is skipped (Proxmox would refuse to start the container with it)."""
    out = []
    for key, value in conf.options.items():
        if is_devn_key(key):
            try:
                out.append(parse_dev_value(value)["path"])
            except PveFormatError:
                continue
    return out


def parse_granted_devices(conf_text: str) -> list[str]:
    """The ``/dev`` paths a container config grants, in config order, without duplicates.

    ``devN: [path=]/dev/x,...`` entries of the main section and the sources of
    ``lxc.mount.entry: /dev/x dev/x none bind,optional,create=file`` lines. A ``devN`` that
    does not parse is skipped (Proxmox would refuse to start; :func:`missing_devices` reports
    only nodes). Pending changes do not count: they apply at the next start.
    """
    conf = parse_lxc_conf(conf_text)
    out: list[str] = []
    for path in _dev_paths(conf):
        if path not in out:
            out.append(path)
    for key, value in conf.lxc:
        if key == "lxc.mount.entry":
            parts = value.split()
            if parts and parts[0].startswith("/dev/") and parts[0] not in out:
                out.append(parts[0])
    return out


def missing_devices(sim_dir: str | os.PathLike, vmid: int) -> list[str]:
    """Granted ``devN`` nodes that do not exist on the host (Proxmox refuses to start then).

    ``lxc.mount.entry`` lines with ``optional`` are skipped by LXC when the source is missing,
    so only ``devN`` entries count. Returns [] when the config is missing.
    """
    p = SimPaths(Path(sim_dir))
    text = read_text(p.lxc_conf(vmid))
    if text is None:
        return []
    return [path for path in _dev_paths(parse_lxc_conf(text)) if not os.path.lexists(inside(p.root, path))]
