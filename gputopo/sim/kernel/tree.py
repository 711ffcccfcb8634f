"""Reading the PCI tree of a host root as the simulated kernel sees it.

Addresses, bound drivers, ``driver_override``, ids, loaded drivers, IOMMU groups, and the
processes holding a device node open (``proc/<pid>/fd/*`` links): an unbind waits for them,
as the real drivers wait in their remove callback for the last user.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from gputopo.sim.kernel.match import ANY, PROBE_ORDER, DevIds
from gputopo.sim.kernel.parse import parse_hex_attr, parse_override


class PciTree:
    """The tree reader of :class:`gputopo.sim.kernel.SimKernel` (a mixin; ``_root`` is the root)."""

    def _p(self, rel: str) -> Path:
        return self._root / rel

    def _read(self, rel: str) -> str | None:
        try:
            return self._p(rel).read_text()
        except (FileNotFoundError, NotADirectoryError, UnicodeDecodeError):
            return None

    def _addresses(self) -> list[str]:
        d = self._p("sys/bus/pci/devices")
        try:
            return sorted(e.name for e in os.scandir(d) if os.path.isdir(e.path))
        except FileNotFoundError:
            return []

    def _devdir(self, addr: str) -> Path:
        return Path(os.path.realpath(self._p(f"sys/bus/pci/devices/{addr}")))

    def _exists(self, addr: str) -> bool:
        link = self._p(f"sys/bus/pci/devices/{addr}")
        return os.path.lexists(link) and link.is_dir()

    def _driver(self, addr: str) -> str | None:
        try:
            return os.path.basename(os.readlink(self._p(f"sys/bus/pci/devices/{addr}/driver")))
        except OSError:
            return None

    def _override(self, addr: str) -> str | None:
        text = self._read(f"sys/bus/pci/devices/{addr}/driver_override")
        return parse_override(text) if text is not None else None

    def _ids(self, addr: str) -> DevIds:
        def attr(name: str, default: int) -> int:
            text = self._read(f"sys/bus/pci/devices/{addr}/{name}")
            v = parse_hex_attr(text) if text is not None else None
            return default if v is None else v

        return DevIds(
            attr("vendor", 0xFFFF),
            attr("device", 0xFFFF),
            attr("subsystem_vendor", ANY),
            attr("subsystem_device", ANY),
            attr("class", 0xFFFFFF),
        )

    def _loaded(self, drv: str) -> bool:
        return self._p(f"sys/bus/pci/drivers/{drv}").is_dir()

    def _loaded_drivers(self) -> list[str]:
        d = self._p("sys/bus/pci/drivers")
        try:
            names = sorted(e.name for e in os.scandir(d) if e.is_dir())
        except FileNotFoundError:
            return []
        order = {n: i for i, n in enumerate(PROBE_ORDER)}
        return sorted(names, key=lambda n: (order.get(n, len(order)), n))

    def group_of(self, addr: str) -> str | None:
        """The IOMMU group number of ``addr`` (as text), or None without one."""
        try:
            return os.path.basename(os.readlink(self._p(f"sys/bus/pci/devices/{addr}/iommu_group")))
        except OSError:
            return None

    def group_members(self, group: str | int) -> list[str]:
        d = self._p(f"sys/kernel/iommu_groups/{group}/devices")
        try:
            return sorted(os.listdir(d))
        except FileNotFoundError:
            return []

    def group_viable(self, group: str | int) -> bool:
        """vfio's viability rule: every member is a bridge, unbound, or on vfio-pci/pci-stub.

        Raises KeyError for a group that does not exist.
        """
        members = self.group_members(group)
        if not members:
            raise KeyError(f"no IOMMU group {group}")
        for m in members:
            if self._ids(m).cls >> 8 == 0x0604:
                continue
            if self._driver(m) not in (None, "vfio-pci", "pci-stub"):
                return False
        return True

    # --- holders ----------------------------------------------------------------------------

    def _nodes_of(self, st: dict, addr: str, drv: str) -> list[str]:
        if drv == "nvidia" and addr in st["minors"]:
            return [f"/dev/nvidia{st['minors'][addr]}"]
        if drv == "vfio-pci":
            g = self.group_of(addr)
            return [f"/dev/vfio/{g}"] if g is not None else []
        return []

    def holders(self, nodes: list[str]) -> list[int]:
        """PIDs with a ``proc/<pid>/fd/*`` link to one of ``nodes`` (``/dev/...`` paths)."""
        want = set(nodes)
        found = []
        proc = self._p("proc")
        try:
            pids = [e.name for e in os.scandir(proc) if e.name.isdigit()]
        except FileNotFoundError:
            return []
        for pid in pids:
            try:
                fds = os.scandir(proc / pid / "fd")
                for fd in fds:
                    try:
                        target = os.readlink(fd.path)
                    except OSError:
                        continue
                    if target.startswith(self.root.rstrip("/") + "/"):
                        target = target[len(self.root.rstrip("/")) :]
                    if target in want:
                        found.append(int(pid))
                        break
            except (FileNotFoundError, NotADirectoryError):
                continue
        return sorted(found)

    def _wait_unheld(self, nodes: list[str]) -> None:
        # The real drivers wait in their remove callback for the last user; so do we.
        while nodes and self.holders(nodes):
            time.sleep(self.poll)
