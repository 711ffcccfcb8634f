"""Moving PCI functions between drivers through sysfs: the real SysfsPort and the Binder.

:class:`RealSysfs` writes attributes under a root exactly like ``echo -n VALUE > FILE``.
:class:`Binder` moves one function or one IOMMU group with per-address ``driver_override``
(never ``new_id``, which claims every device with the same id), runs each write in a worker
thread under a timeout (an unbind can block in the kernel for ever while the device is in use)
and reads the result back from the tree instead of trusting the write's return value.

udev: a move ends once udev has processed the events of the devices it moved (the ``bind`` or
``unbind`` of each function, the ``add`` of a vfio group it created), so that the nodes and
permissions udev's rules make are in place when the next step uses them
(:mod:`gputopo.adapters.udev`); with no ``events`` port (no udev) it does not wait.

Override policy: the override is the only thing that keeps an unbound device away from its
native driver, and after a reboot or a rescan sysfs forgets it anyway, so the Binder clears it
after a successful move unless the caller asks to keep it (``keep_override``) as a pin until the
persistence files take over.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

from gputopo.adapters.udev import Expect, await_events, say_once
from gputopo.errors import BindError, SysfsTimeout, SysfsWriteError, UdevTimeout
from gputopo.model.facts import normalize_address
from gputopo.ports import DeviceEventListener, DeviceEventsPort, MemberState, SysfsPort

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


def _devpath(address: str) -> str:
    return f"sys/bus/pci/devices/{address}"


class Binder:
    """Moves PCI functions between drivers through ``port``, reading results back from ``root``.

    ``timeout`` bounds every single sysfs write; a write that does not return in time raises
    :class:`SysfsTimeout` and its worker thread is left behind (the device needs a human).
    """

    def __init__(
        self,
        port: SysfsPort,
        root: str | os.PathLike | None = None,
        timeout: float = 30.0,
        events: DeviceEventsPort | None = None,
    ):
        self.port = port
        self.root = Path(root if root is not None else port.root)
        self.timeout = timeout  # also how long a move waits for udev after its writes
        self.events = events
        self.stuck: list[str] = []
        # a move that udev processed with a failing rule or program: said, not raised
        self.warn: Callable[[str], None] = lambda text: None

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

    def _unbind(self, address: str) -> bool:
        """Unbind ``address`` from its driver; False when it had none (nothing written)."""
        current = self.driver_of(address)
        if current is None:
            return False
        self._write(f"sys/bus/pci/drivers/{current}/unbind", address, address)
        return True

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
        listener, groups = self._listen(members)
        try:
            todo = [m for m in members if not self._already(m, want[m], native, keep_override)]
            unbound, probed = self._rebind(todo, want)
            for m in members:
                self._check(m, want[m], native)
            if to_driver == "vfio-pci":
                for g in sorted({g for g in map(self.iommu_group_of, members) if g is not None}):
                    if not self.vfio_group_present(g):
                        raise BindError(members[0], to_driver, to_driver, f"no dev/vfio/{g}")
            if not keep_override:
                for m in todo:
                    self._set_override(m, None)
            self._settle(listener, [m for m in todo if m in unbound | probed], unbound, groups)
        except (BindError, SysfsWriteError, SysfsTimeout, UdevTimeout) as e:
            e.previous = previous  # type: ignore[attr-defined]
            raise
        finally:
            if listener is not None:
                listener.close()
        return previous

    def _rebind(self, todo: list[str], want: dict[str, str | None]) -> tuple[set[str], set[str]]:
        """The writes of a move: each member of ``todo`` gets its override, then every one is
        unbound, then every one without a driver probed. Returns (unbound, probed)."""
        unbound: set[str] = set()
        for m in todo:
            self._set_override(m, want[m])
        for m in todo:
            if (self.driver_of(m) != want[m] or want[m] is None) and self._unbind(m):
                unbound.add(m)
        probed: set[str] = set()
        for m in todo:
            if self.driver_of(m) is None:
                self._probe(m)
                probed.add(m)
        return unbound, probed

    # --- udev -------------------------------------------------------------------------------

    def _listen(self, members: list[str]) -> tuple[DeviceEventListener | None, dict[int, bool]]:
        """Start hearing udev's events before a move's first write; with it, whether each IOMMU
        group of ``members`` has its ``dev/vfio`` node now. (None, {}) without udev."""
        listener = self.events.listen() if self.events is not None else None
        if listener is None:
            if self.events is None:
                say_once(
                    "no udev events port (a simulated host, or a root that is not /): moves do not wait for udev"
                )
            return None, {}
        groups = {g for g in map(self.iommu_group_of, members) if g is not None}
        return listener, {g: self.vfio_group_present(g) for g in groups}

    def _settle(
        self,
        listener: DeviceEventListener | None,
        touched: list[str],
        unbound: set[str],
        groups: dict[int, bool],
    ) -> None:
        """Wait until udev has processed the last event of each function in ``touched`` (its
        ``bind`` when it is bound now, its ``unbind`` when it was unbound and stays so) and the
        ``add`` of each vfio group that has a node now and had none before. Raises UdevTimeout
        after :attr:`timeout` seconds; an event whose rules failed is passed to :attr:`warn`."""
        if listener is None:
            return
        expected = set()
        for m in touched:
            if self.driver_of(m) is not None:
                expected.add(Expect("pci", m, "bind"))
            elif m in unbound:
                expected.add(Expect("pci", m, "unbind"))
        expected |= {
            Expect("vfio", str(g), "add")
            for g, had in groups.items()
            if not had and self.vfio_group_present(g)
        }
        for key, ev in sorted(await_events(listener, expected, self.timeout).items()):
            if ev.failed:
                self.warn(f"udev processed the {key} event, but a rule failed: {ev.failed}")

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

    def restore(self, previous: Mapping[str, MemberState] | Mapping[str, str | None]) -> None:
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
        listener, groups = self._listen(list(previous))
        unbound: set[str] = set()
        touched: list[str] = []
        try:
            for m in by_target.pop(None, []):
                if self._unbind(m):
                    unbound.add(m)
                    touched.append(m)
            # unbind everything that moves first, so a group is never half on vfio-pci longer than needed
            for drv, ms in by_target.items():
                for m in ms:
                    if self.driver_of(m) != drv:
                        # by name, native drivers too: a vfio-pci dynamic id must not win the probe
                        self._set_override(m, drv)
                        if self._unbind(m):
                            unbound.add(m)
            for drv, ms in by_target.items():
                for m in ms:
                    if self.driver_of(m) is None:
                        self._probe(m)
                        touched.append(m)
                    if self.driver_of(m) is None and drv not in OVERRIDE_DRIVERS:
                        self._write(f"sys/bus/pci/drivers/{drv}/bind", m, m)
                    self._check(m, drv, False)
            for m, st in previous.items():
                self._set_override(m, st.override)
            self._settle(listener, touched, unbound, groups)
        finally:
            if listener is not None:
                listener.close()
