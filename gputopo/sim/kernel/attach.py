"""What binding, unbinding and removing a device change in the tree (state lock held).

Side effects appear and vanish as on a real host: nvidia creates
``proc/driver/nvidia/gpus/<bdf>/information``; vfio-pci creates ``dev/vfio/<group>`` while any
member of the group is bound to it. nvidia makes no ``/dev`` node: its module only registers the
character device region (open-gpu-kernel-modules ``kernel-open/nvidia/nv.c``
nv_register_chrdev: register_chrdev_region and cdev_add, no device_create), so binding a GPU
does not create ``dev/nvidia<minor>`` and unbinding does not remove it. The nodes come from
udev rules or ``nvidia-modprobe`` (:mod:`gputopo.sim.hostcmd`). A device that falls off the
bus loses its directory and links; a dead one reads 0xff from its config space.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import uuid as _uuid
from pathlib import Path

from gputopo.sim.files import atomic_write
from gputopo.sim.kernel.nvidia import nvidia_information, set_minor_line
from gputopo.sim.kernel.statefile import STATE_DIR


class TreeChanges:
    """Tree changes of :class:`gputopo.sim.kernel.SimKernel` (a mixin over its tree reader)."""

    def _link(self, link: Path, target: Path) -> None:
        if os.path.lexists(link):
            os.unlink(link)
        os.symlink(os.path.relpath(target, link.parent), link)

    def _unlink(self, p: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(p)

    def _attach(self, st: dict, addr: str, drv: str) -> None:
        dev = self._devdir(addr)
        drvdir = self._p(f"sys/bus/pci/drivers/{drv}")
        self._link(dev / "driver", drvdir)
        self._link(drvdir / addr, dev)
        if drv == "nvidia":
            self._nvidia_up(st, addr)
        elif drv == "vfio-pci":
            g = self.group_of(addr)
            (self._p("dev/vfio")).mkdir(parents=True, exist_ok=True)
            self._p("dev/vfio/vfio").touch()
            if g is not None:
                self._p(f"dev/vfio/{g}").touch()

    def _detach(self, st: dict, addr: str, drv: str) -> None:
        self._unlink(self._p(f"sys/bus/pci/devices/{addr}/driver"))
        self._unlink(self._p(f"sys/bus/pci/drivers/{drv}/{addr}"))
        if drv == "nvidia":
            # its /dev/nvidia<minor> stays: the driver never made it (see the module docstring)
            shutil.rmtree(self._p(f"proc/driver/nvidia/gpus/{addr}"), ignore_errors=True)
            st["minors"].pop(addr, None)  # its bit is cleared: the next probe may take it
        elif drv == "vfio-pci":
            g = self.group_of(addr)
            if g is not None and not any(
                self._driver(m) == "vfio-pci" for m in self.group_members(g) if m != addr
            ):
                self._unlink(self._p(f"dev/vfio/{g}"))

    def _nvidia_up(self, st: dict, addr: str) -> None:
        # the lowest minor no GPU on nvidia holds, with no memory of the one this GPU had
        # before: nv_pci_probe (open-gpu-kernel-modules 595.45.04 kernel-open/nvidia/nv-pci.c
        # l.2126) calls nv_linux_assign_minor_locked (kernel-open/nvidia/nv.c l.5629-5644),
        # find_first_zero_bit over nv_linux_minor_bitmap; the remove path clears the bit
        # (nv-pci.c l.2394, nv_linux_remove_minor_locked)
        minor = lowest_free_minor(st, addr, self._driver)
        st["minors"][addr] = minor
        text = st["nv_info"].get(addr)
        if text is None:
            ids = self._ids(addr)
            seed = hashlib.sha256(addr.encode()).digest()[:16]
            text = nvidia_information(
                addr, minor, f"NVIDIA Device {ids.device:04x}", f"GPU-{_uuid.UUID(bytes=seed)}"
            )
            st["nv_info"][addr] = text
        d = self._p(f"proc/driver/nvidia/gpus/{addr}")
        d.mkdir(parents=True, exist_ok=True)
        write_attr(d / "information", set_minor_line(text, minor))

    def _remove_device(self, st: dict, addr: str) -> None:
        if not self._exists(addr):
            return
        drv = self._driver(addr)
        if drv is not None:
            self._detach(st, addr, drv)
        dev = self._devdir(addr)
        g = self.group_of(addr)
        # what a rescan finds again (the hardware is still in its slot): the device's attributes
        stash = self._p(f"{STATE_DIR}/removed/{addr}")
        shutil.rmtree(stash, ignore_errors=True)
        shutil.copytree(dev, stash, symlinks=True)
        st.setdefault("removed_at", {})[addr] = dev.relative_to(os.path.realpath(self._root)).as_posix()
        if g is not None:
            self._unlink(self._p(f"sys/kernel/iommu_groups/{g}/devices/{addr}"))
        self._unlink(self._p(f"sys/bus/pci/devices/{addr}"))
        shutil.rmtree(dev, ignore_errors=True)
        if addr not in st["removed"]:
            st["removed"].append(addr)

    def _rescan(self) -> list[str]:
        """``echo 1 > /sys/bus/pci/rescan``: the devices removed (or fallen off the bus) come back
        with their directory and links, and are probed. Returns their addresses.

        The kernel's rescan_store (drivers/pci/pci-sysfs.c) calls pci_rescan_bus for every root
        bus (drivers/pci/probe.c: pci_scan_child_bus finds the device again,
        pci_bus_add_devices -> pci_bus_add_device -> device_initial_probe binds the driver that
        matches, as at boot). The pci_dev is a new one (pci_alloc_dev), so its driver_override is
        unset again.
        """
        back = []
        with self._state() as st:
            at = st.setdefault("removed_at", {})
            for addr in list(st["removed"]):
                stash = self._p(f"{STATE_DIR}/removed/{addr}")
                if addr not in at or not stash.is_dir():
                    continue
                dev = self._p(at.pop(addr))
                shutil.copytree(stash, dev, symlinks=True, dirs_exist_ok=True)
                shutil.rmtree(stash, ignore_errors=True)
                if (dev / "driver_override").exists():
                    write_attr(dev / "driver_override", "(null)\n")
                self._link(self._p(f"sys/bus/pci/devices/{addr}"), dev)
                g = self.group_of(addr)
                if g is not None:
                    self._link(self._p(f"sys/kernel/iommu_groups/{g}/devices/{addr}"), dev)
                st["removed"].remove(addr)
                back.append(addr)
        return back

    def _make_dead(self, addr: str) -> None:
        base = self._devdir(addr)
        cfg = base / "config"
        size = cfg.stat().st_size if cfg.exists() else 256
        cfg.write_bytes(b"\xff" * max(size, 64))
        for name, value in (
            ("vendor", "0xffff"),
            ("device", "0xffff"),
            ("subsystem_vendor", "0xffff"),
            ("subsystem_device", "0xffff"),
            ("class", "0xffffff"),
        ):
            if (base / name).exists():
                (base / name).write_text(value + "\n")


def lowest_free_minor(st: dict, addr: str, driver_of) -> int:
    """The minor the nvidia driver gives ``addr`` when it probes it now: the lowest one no other
    GPU bound to nvidia holds (``driver_of``: address -> its driver now)."""
    in_use = {m for a, m in st["minors"].items() if a != addr and driver_of(a) == "nvidia"}
    return next(i for i in range(len(in_use) + 1) if i not in in_use)


def write_attr(path: Path, text: str) -> None:
    """Replace a file's content in one step: a kernel attribute never reads half-written, even
    when the simulating process is killed mid-write. Mode 0644, as sysfs shows attributes."""
    atomic_write(path, text, mode=0o644)
