"""What a simulated node's Proxmox API calls inside a guest's start and stop tasks: the
container's side of pve-container (its devices checked, its distribution, its boot).

Its own module, below :mod:`gputopo.sim.host` and :mod:`gputopo.sim.cluster.peers`, because
both hand these hooks to an API server: a host to its own, a cluster member to its peers'.
"""

from __future__ import annotations

from pathlib import Path

from gputopo.errors import ContainerStartError
from gputopo.formats.lxcconf import parse_dev_value, parse_lxc_conf
from gputopo.sim.container import Container, SimPaths
from gputopo.sim.container.devices import missing_devices
from gputopo.sim.container.distro import start_warnings


class Hooks:
    """What the Proxmox API simulator calls inside start/stop tasks of a guest."""

    def __init__(self, sim_dir: Path):
        self.sim_dir = sim_dir

    def on_guest_start(self, kind: str, vmid: int) -> list[str]:
        """Boot container ``vmid`` as pve-container's prestart hook and start do: refuse when a
        granted ``devN`` node is missing, check the distribution (:mod:`gputopo.sim.container.distro`).
        Returns the warnings the start logs (a release newer than pve-container knows).

        Raises :class:`ContainerStartError` (``Device /dev/nvidia4 does not exist``).
        """
        if kind != "lxc":
            return []
        missing = missing_devices(self.sim_dir, vmid)
        if missing:
            raise ContainerStartError(f"Device {missing[0]} does not exist")
        paths = SimPaths(self.sim_dir)
        conf = paths.lxc_conf(vmid)
        ostype = parse_lxc_conf(conf.read_text()).options.get("ostype") if conf.is_file() else None
        warnings = start_warnings(paths.rootfs(vmid), ostype)
        Container(self.sim_dir, vmid).boot()
        return warnings

    def on_guest_stop(self, kind: str, vmid: int) -> None:
        if kind == "lxc":
            Container(self.sim_dir, vmid).shutdown()

    def on_lxc_hotplug(self, vmid: int, key: str, value: str) -> None:
        """A new ``devN`` was hot-plugged into running container ``vmid``: it sees the node now."""
        Container(self.sim_dir, vmid).hotplug(parse_dev_value(value)["path"])
