"""Moving PCI functions between drivers through sysfs: the real SysfsPort and the Binder.

:class:`RealSysfs` writes attributes under a root exactly like ``echo -n VALUE > FILE``.
:class:`Binder` moves one function or one IOMMU group with per-address ``driver_override``
(never ``new_id``, which claims every device with the same id), runs each write in a worker
thread under a timeout (an unbind can block in the kernel for ever while the device is in use)
and reads the result back from the tree instead of trusting the write's return value.

Override policy: the override is the only thing that keeps an unbound device away from its
native driver, and after a reboot or a rescan sysfs forgets it anyway, so the Binder clears it
after a successful move unless the caller asks to keep it (``keep_override``) as a pin until the
persistence files take over.
"""

from __future__ import annotations

import errno
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from gputopo.errors import BindError, SysfsTimeout, SysfsWriteError
from gputopo.model.facts import normalize_address
from gputopo.ports import SysfsPort

# Drivers that bind only what they are told to (their id tables match nothing by themselves).
OVERRIDE_DRIVERS = frozenset({"vfio-pci", "pci-stub"})
# What the kernel accepts as "clear the override": a lone newline (an empty write never reaches
# the attribute, see fs/sysfs/file.c sysfs_kf_write).
CLEAR = "\n"


class RealSysfs:
    """The real :class:`gputopo.ports.SysfsPort`: one ``write(2)`` per attribute below ``root``."""

    def __init__(self, root: str | os.PathLike = "/"):
        self.root = str(root)

    def write(self, path: str, value: str) -> None:
        """Write ``value`` to ``<root>/<path>`` in one write call.

        Raises SysfsWriteError with the errno of the failed open or write (ENOENT for a missing
        driver directory, ENODEV/EBUSY/EINVAL as the kernel returns them).
        """
        rel = path.lstrip("/")
        full = os.path.join(self.root, rel)
        data = value.encode()
        try:
            fd = os.open(full, os.O_WRONLY | os.O_TRUNC)
        except OSError as e:
            raise SysfsWriteError(rel, value, e.errno or errno.EIO) from None
        try:
            written = os.write(fd, data)
            if written != len(data):
                raise SysfsWriteError(rel, value, errno.EIO, f"short write {written}/{len(data)}")
        except OSError as e:
            raise SysfsWriteError(rel, value, e.errno or errno.EIO) from None
        finally:
            os.close(fd)


@dataclass(frozen=True)
class MemberState:
    """A function's driver and driver_override before a move (None = none)."""

    driver: str | None
    override: str | None


def _devpath(address: str) -> str:
    return f"sys/bus/pci/devices/{address}"


class Binder:
    """Moves PCI functions between drivers through ``port``, reading results back from ``root``.

    ``timeout`` bounds every single sysfs write; a write that does not return in time raises
    :class:`SysfsTimeout` and its worker thread is left behind (the device needs a human).
    """

    def __init__(self, port: SysfsPort, root: str | os.PathLike | None = None, timeout: float = 30.0):
        self.port = port
        self.root = Path(root if root is not None else port.root)
        self.timeout = timeout
        self.stuck: list[str] = []

    # --- read-back --------------------------------------------------------------------------

    def driver_of(self, address: str) -> str | None:
        """The driver ``address`` is bound to now (its ``driver`` link), or None."""
        try:
            return os.path.basename(os.readlink(self.root / _devpath(address) / "driver"))
        except OSError:
            return None

    def override_of(self, address: str) -> str | None:
        """The device's ``driver_override``, or None when unset or unreadable."""
        try:
            text = (self.root / _devpath(address) / "driver_override").read_text().strip()
        except OSError:
            return None
        return None if text in ("", "(null)") else text

    def iommu_group_of(self, address: str) -> int | None:
        """The IOMMU group number of ``address``, or None when it has none."""
        try:
            return int(os.path.basename(os.readlink(self.root / _devpath(address) / "iommu_group")))
        except (OSError, ValueError):
            return None

    def group_state(self, group: int) -> dict[str, str | None]:
        """Every member of IOMMU group ``group`` -> its driver now (empty for no such group)."""
        d = self.root / "sys/kernel/iommu_groups" / str(group) / "devices"
        try:
            members = sorted(os.listdir(d))
        except OSError:
            return {}
        return {m: self.driver_of(m) for m in members}

    def vfio_group_present(self, group: int) -> bool:
        """True when ``dev/vfio/<group>`` exists (some member is bound to vfio-pci)."""
        return (self.root / "dev/vfio" / str(group)).exists()

    def state_of(self, address: str) -> MemberState:
        return MemberState(self.driver_of(address), self.override_of(address))

    # --- writes under a timeout -------------------------------------------------------------

    def _write(self, path: str, value: str, address: str) -> None:
        """One sysfs write in a worker thread. Raises SysfsTimeout or the port's error."""
        box: dict[str, BaseException] = {}

        def work() -> None:
            try:
                self.port.write(path, value)
            except BaseException as e:  # handed to the caller's thread
                box["error"] = e

        t = threading.Thread(target=work, name=f"sysfs {address}", daemon=True)
        t.start()
        t.join(self.timeout)
        if t.is_alive():
            self.stuck.append(address)
            raise SysfsTimeout(path, value, self.timeout, address)
        if "error" in box:
            raise box["error"]

    def _set_override(self, address: str, driver: str | None) -> None:
        if self.override_of(address) == driver:
            return
        self._write(f"{_devpath(address)}/driver_override", driver or CLEAR, address)

    def _unbind(self, address: str) -> None:
        current = self.driver_of(address)
        if current is not None:
            self._write(f"sys/bus/pci/drivers/{current}/unbind", address, address)

    def _probe(self, address: str) -> None:
        self._write("sys/bus/pci/drivers_probe", address, address)

    def _check(self, address: str, wanted: str | None, native: bool) -> None:
        got = self.driver_of(address)
        if not (self.root / _devpath(address)).exists():
            raise BindError(
                address, wanted, None, "device is gone from the bus", native=native and wanted is None
            )
        if native and wanted is None:
            if got in OVERRIDE_DRIVERS:
                raise BindError(
                    address,
                    None,
                    got,
                    f"{got} claimed it through a dynamic id (left by a VM "
                    "start): echo the device's 'vendor device' to sys/bus/pci/drivers/"
                    f"{got}/remove_id",
                    native=True,
                )
            if got is None:
                raise BindError(address, None, None, "no native driver claimed it", native=True)
            return
        if got != wanted:
            raise BindError(address, wanted, got)
        if wanted in OVERRIDE_DRIVERS and not (self.root / "sys/bus/pci/drivers" / wanted / address).exists():
            raise BindError(address, wanted, got, f"no sys/bus/pci/drivers/{wanted}/{address}")

    # --- moves ------------------------------------------------------------------------------

    def move(self, address: str, to_driver: str | None, keep_override: bool = False) -> None:
        """Move one function to ``to_driver`` (None: whatever driver matches it natively).

        See :meth:`move_group`. Raises SysfsWriteError, SysfsTimeout (naming the device) or
        BindError when the read-back shows no driver or another one.
        """
        self.move_group([address], to_driver, keep_override)

    def move_group(
        self,
        members: list[str],
        to_driver: str | None,
        keep_override: bool = False,
        natives: dict[str, str | None] | None = None,
    ) -> dict[str, MemberState]:
        """Move every member of one IOMMU group: set overrides, unbind ALL, then probe all.

        To vfio-pci (or pci-stub) every member gets ``driver_override`` set to it. Back to native
        drivers (``to_driver`` None), each member whose native driver ``natives`` names is bound by
        name too (``driver_override=<native>``, then probe): only that driver can match, so a
        vfio-pci dynamic id left by a VM start (Proxmox writes ``new_id`` at every start with a
        mapped device) can never win. A member whose native driver is unknown is probed without
        an override. The override is cleared afterwards unless ``keep_override`` (it then pins
        the member to its driver).

        Returns each member's state before the move (pass it to :meth:`restore` to undo).
        Raises SysfsWriteError, SysfsTimeout (naming the device) or BindError (before any write
        when a member does not exist; after, when the read-back shows no driver or another one).
        A failure leaves the members where they are; the returned state is also attached to the
        error as ``previous``.
        """
        members = [normalize_address(m) for m in members]
        for m in members:
            if not (self.root / _devpath(m)).exists():
                raise BindError(m, to_driver, None, "no such device (gone from the bus?)")
        previous = {m: self.state_of(m) for m in members}
        native = to_driver is None or to_driver not in OVERRIDE_DRIVERS
        want = {m: (to_driver if to_driver is not None else (natives or {}).get(m)) for m in members}
        try:
            todo = [m for m in members if not self._already(m, want[m], native, keep_override)]
            for m in todo:
                self._set_override(m, want[m])
            for m in todo:
                if self.driver_of(m) != want[m] or want[m] is None:
                    self._unbind(m)
            for m in todo:
                if self.driver_of(m) is None:
                    self._probe(m)
            for m in members:
                self._check(m, want[m], native)
            if to_driver == "vfio-pci":
                for g in sorted({g for g in map(self.iommu_group_of, members) if g is not None}):
                    if not self.vfio_group_present(g):
                        raise BindError(members[0], to_driver, to_driver, f"no dev/vfio/{g}")
            if not keep_override:
                for m in todo:
                    self._set_override(m, None)
        except (BindError, SysfsWriteError, SysfsTimeout) as e:
            e.previous = previous  # type: ignore[attr-defined]
            raise
        return previous

    def _already(self, m: str, want: str | None, native: bool, keep: bool) -> bool:
        drv = self.driver_of(m)
        override = self.override_of(m)
        if want is None:
            # an unknown native driver: whatever binds without an override
            return drv is not None and override is None and drv not in OVERRIDE_DRIVERS
        if drv != want:
            return False
        want_override = want if keep else None
        if override != want_override:
            self._set_override(m, want_override)
        return True

    def restore(self, previous: dict[str, MemberState] | dict[str, str | None]) -> None:
        """Undo :meth:`move_group`: put every member back on its previous driver and override.

        ``previous`` is what move_group returned (or anything with ``driver`` and ``override``),
        or plain address -> driver (no override).
        Members that had no driver are unbound. Raises like :meth:`move_group`.
        """
        previous = {
            normalize_address(m): (
                MemberState(st.driver, st.override) if hasattr(st, "driver") else MemberState(st, None)
            )
            for m, st in previous.items()
        }
        by_target: dict[str | None, list[str]] = {}
        for m, st in previous.items():
            by_target.setdefault(st.driver, []).append(m)
        unbound = by_target.pop(None, [])
        for m in unbound:
            self._unbind(m)
        # unbind everything that moves first, so a group is never half on vfio-pci longer than needed
        for drv, ms in by_target.items():
            for m in ms:
                if self.driver_of(m) != drv:
                    # by name, native drivers too: a vfio-pci dynamic id must not win the probe
                    self._set_override(m, drv)
                    self._unbind(m)
        for drv, ms in by_target.items():
            for m in ms:
                if self.driver_of(m) is None:
                    self._probe(m)
                if self.driver_of(m) is None and drv not in OVERRIDE_DRIVERS:
                    self._write(f"sys/bus/pci/drivers/{drv}/bind", m, m)
                self._check(m, drv, False)
        for m, st in previous.items():
            self._set_override(m, st.override)
