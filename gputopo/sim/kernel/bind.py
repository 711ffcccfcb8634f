"""What a write to a PCI sysfs attribute does: :class:`SimKernel`, the simulated kernel.

:class:`SimKernel` changes a materialised fixture or snapshot root the way the kernel changes
``/sys`` when userspace writes the PCI driver attributes. The rules follow
Documentation/ABI/testing/sysfs-bus-pci, drivers/base/bus.c, drivers/base/driver.c,
drivers/pci/pci-driver.c and fs/sysfs/file.c:

* ``driver_override`` (driver_set_override): a name sets it and reads back ``name\\n``; ``"\\n"``
  clears it (reads back ``(null)\\n``); a zero-length write never reaches the attribute
  (sysfs_kf_write returns 0 for ``count == 0``) so it changes nothing. While set, only the named
  driver matches the device (pci_match_device), whatever the id tables say.
* ``drivers/<drv>/unbind``: ENODEV unless the address is bound to ``<drv>``.
* ``drivers/<drv>/bind``: ENODEV for an unknown address or a driver that does not match,
  EBUSY when the device already has a driver, the probe's error when the probe fails.
* ``drivers_probe``: ENODEV for an unknown address; otherwise success, even when no driver
  matched or the device was already bound (drivers_probe_store).
* ``new_id``/``remove_id``: dynamic ids; ``new_id`` makes the driver probe every unbound device
  that now matches (pci_add_dynid -> driver_attach); EEXIST when the id already matches.
* ``remove`` (remove_store): ``kstrtoul(buf, 0)`` or EINVAL; a non-zero number unbinds the
  driver and removes the device, ``0`` does nothing.
* ``rescan`` (rescan_store, drivers/pci/pci-sysfs.c): the same parsing; a non-zero number finds
  every removed device (or one that fell off the bus) again and probes it (pci_rescan_bus).
* Writing below a driver directory that does not exist (a driver that is not loaded) fails
  with ENOENT, as opening a missing file does.

Which driver matches is :mod:`gputopo.sim.kernel.match`; what a bind or unbind changes in the
tree is :mod:`gputopo.sim.kernel.attach`. Unbinding a device whose node is held open (a
``proc/<pid>/fd/*`` link to it) blocks until the holder goes away.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
import time
from pathlib import Path

from gputopo.errors import SysfsWriteError
from gputopo.sim.kernel.attach import TreeChanges, write_attr
from gputopo.sim.kernel.events import EventLog, KernelEvent
from gputopo.sim.kernel.faults import Fail, Faults
from gputopo.sim.kernel.match import ANY, DevIds, Matching
from gputopo.sim.kernel.parse import bus_name, parse_id_fields, parse_kstrtoul
from gputopo.sim.kernel.statefile import StateFile
from gputopo.sim.kernel.tree import PciTree


class SimKernel(StateFile, Faults, PciTree, TreeChanges, Matching, EventLog):
    """Simulated kernel sysfs semantics over the tree at ``root`` (implements SysfsPort).

    ``write`` raises :class:`gputopo.errors.SysfsWriteError` with the errno the kernel would
    return; like the kernel it may block (latency, a held device node, an injected hang).
    ``time_scale`` (if given) and ``latency`` overrides are stored in the shared state file.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        *,
        time_scale: float | None = None,
        latency: dict[str, float] | None = None,
        poll: float = 0.02,
    ):
        self.root = str(root)
        self._root = Path(self.root)
        self.poll = poll
        self._lock = threading.RLock()
        self._tls = threading.local()
        self._dev_locks: dict[str, threading.Lock] = {}
        self._events: list[KernelEvent] = []
        with self._state() as st:
            if time_scale is not None:
                st["time_scale"] = time_scale
            if latency:
                st["latency"].update(latency)

    def _dev_lock(self, addr: str) -> threading.Lock:
        with self._lock:
            return self._dev_locks.setdefault(addr, threading.Lock())

    def write(self, path: str, value: str) -> None:
        """Write ``value`` to ``<root>/<path>`` with the kernel's semantics.

        Raises SysfsWriteError with the kernel's errno (ENOENT for a path that does not exist).
        May block as the kernel would.
        """
        rel = path.lstrip("/")
        try:
            self._dispatch(rel, value)
        except Fail as e:
            raise SysfsWriteError(rel, value, e.err, e.detail) from None

    def _dispatch(self, rel: str, value: str) -> None:
        full = self._p(rel)
        parent = Path(os.path.realpath(full.parent))
        name = full.name
        root = Path(os.path.realpath(self._root))
        if not parent.is_dir():
            raise Fail(errno.ENOENT)
        try:
            prel = parent.relative_to(root).as_posix()
        except ValueError:
            raise Fail(errno.EACCES, "outside the root") from None
        if not value:
            # sysfs_kf_write: a zero-length write never reaches the attribute's store()
            if not full.exists():
                raise Fail(errno.ENOENT)
            return
        drivers = "sys/bus/pci/drivers/"
        if prel.startswith(drivers) and "/" not in prel[len(drivers) :]:
            drv = prel[len(drivers) :]
            if name == "bind":
                return self._bind(drv, bus_name(value))
            if name == "unbind":
                return self._unbind(drv, bus_name(value))
            if name == "new_id":
                return self._new_id(drv, value)
            if name == "remove_id":
                return self._remove_id(drv, value)
        elif prel == "sys/bus/pci" and name == "drivers_probe":
            return self._drivers_probe(bus_name(value))
        elif prel == "sys/bus/pci" and name == "rescan":
            # rescan_store (drivers/pci/pci-sysfs.c): kstrtoul(buf, 0) or EINVAL; 0 does nothing
            val = parse_kstrtoul(value)
            if val is None:
                raise Fail(errno.EINVAL)
            if val:
                for addr in self._rescan():
                    self._drivers_probe(addr)
            return None
        elif name in ("driver_override", "remove") and (parent / "vendor").exists():
            addr = parent.name
            if name == "driver_override":
                return self._set_override(addr, parent / name, value)
            # remove_store: kstrtoul(buf, 0, &val) or EINVAL; only a non-zero value removes
            val = parse_kstrtoul(value)
            if val is None:
                raise Fail(errno.EINVAL)
            if val:
                self._remove(addr)
            return None
        if not full.exists():
            raise Fail(errno.ENOENT)
        raise Fail(errno.EOPNOTSUPP, "attribute not simulated")

    def _set_override(self, addr: str, attr: Path, value: str) -> None:
        # driver_set_override: PAGE_SIZE - 1 limit; text up to the first newline; "\n" clears
        if len(value) >= 4095:
            raise Fail(errno.EINVAL)
        with self._dev_lock(addr):
            if self._fault(addr, "override") == "noop":
                return
            text = value.split("\0", 1)[0].split("\n", 1)[0]
            with self._state():
                if not attr.parent.is_dir():
                    raise Fail(errno.ENOENT)
                write_attr(attr, f"{text}\n" if text else "(null)\n")

    def _unbind(self, drv: str, addr: str) -> None:
        with self._state():
            if not self._exists(addr) or self._driver(addr) != drv:
                raise Fail(errno.ENODEV)
        with self._dev_lock(addr):
            if self._fault(addr, "unbind") == "noop":
                return
            with self._state() as st:
                if self._driver(addr) != drv:
                    raise Fail(errno.ENODEV)
                nodes = self._nodes_of(st, addr, drv)
            start = time.monotonic()
            delay = self._sleep(addr, drv, "unbind")
            self._wait_unheld(nodes)
            with self._state() as st:
                if self._exists(addr) and self._driver(addr) == drv:
                    self._detach(st, addr, drv)
                    self._record("unbind", drv, addr, delay, start)

    def _try_attach(self, drv: str, addr: str, explicit: bool) -> None:
        """Probe ``drv`` on ``addr`` (device lock held by the caller). With ``explicit`` (the
        bind file) every refusal is an error; otherwise refusals are silent (probe, new_id)."""
        with self._state() as st:
            if not self._exists(addr):
                raise Fail(errno.ENODEV)
            if not self._matches(st, drv, addr):
                if explicit:
                    raise Fail(errno.ENODEV)
                return
            if self._driver(addr) is not None:
                if explicit:
                    raise Fail(errno.EBUSY)
                return
            err = self._probe_error(st, drv, addr)
            if err is not None:
                if explicit:
                    raise Fail(err, f"{drv} probe failed")
                return
        if self._fault(addr, "bind") == "noop":
            return
        start = time.monotonic()
        delay = self._sleep(addr, drv, "bind")
        with self._state() as st:
            if not self._exists(addr):
                raise Fail(errno.ENODEV)
            if self._driver(addr) is not None:
                if explicit:
                    raise Fail(errno.EBUSY)
                return
            self._attach(st, addr, drv)
            self._record("bind", drv, addr, delay, start)

    def _bind(self, drv: str, addr: str) -> None:
        with self._state():
            if not self._exists(addr):
                raise Fail(errno.ENODEV)
        with self._dev_lock(addr):
            self._try_attach(drv, addr, explicit=True)

    def _drivers_probe(self, addr: str) -> None:
        with self._state():
            if not self._exists(addr):
                raise Fail(errno.ENODEV)
        with self._dev_lock(addr):
            if self._fault(addr, "probe") == "noop":
                return
            with self._state() as st:
                if self._driver(addr) is not None:
                    return
                ids = self._ids(addr)
                candidates = [d for d in self._loaded_drivers() if self._matches(st, d, addr)]
                # dynamic ids are what the user asked for; among static matches the driver the
                # device had at first sight stands in for the real module load order
                candidates.sort(
                    key=lambda d: (not self._dynid_match(st, d, ids), st["original"].get(addr) != d)
                )
                chosen = next((d for d in candidates if self._probe_error(st, d, addr) is None), None)
            if chosen is not None:
                self._try_attach(chosen, addr, explicit=False)

    def _new_id(self, drv: str, value: str) -> None:
        fields = parse_id_fields(value, 7)
        v, d, sv, sd, c, cm = _id_rule(fields)
        data = fields[6] if len(fields) > 6 else 0
        with self._state() as st:
            if len(fields) != 7 and self._id_match(st, drv, None, DevIds(v, d, sv, sd, c)):
                raise Fail(errno.EEXIST)
            if data != 0:
                # only driver_data values of an existing id_table entry are accepted (all 0 here)
                raise Fail(errno.EINVAL)
        if self._fault("*", "new_id") == "noop":
            return
        with self._state() as st:
            st["dynids"].setdefault(drv, []).append([v, d, sv, sd, c, cm])
            targets = [a for a in self._addresses() if self._driver(a) is None]
        # driver_attach: every unbound device that now matches is probed, one after another
        for addr in targets:
            with self._dev_lock(addr):
                with contextlib.suppress(Fail):
                    self._try_attach(drv, addr, explicit=False)

    def _remove_id(self, drv: str, value: str) -> None:
        v, d, sv, sd, c, cm = _id_rule(parse_id_fields(value, 6))
        with self._state() as st:
            ids = st["dynids"].get(drv, [])
            for rule in ids:
                if (
                    rule[0] == v
                    and rule[1] == d
                    and (sv == ANY or rule[2] == sv)
                    and (sd == ANY or rule[3] == sd)
                    and not ((rule[4] ^ c) & cm)
                ):
                    ids.remove(rule)
                    return
        raise Fail(errno.ENODEV)

    def _remove(self, addr: str) -> None:
        # pci_stop_and_remove_bus_device: the driver is unbound first (and may block), then
        # the device is gone
        drv = self._driver(addr)
        if drv is not None:
            self._unbind(drv, addr)
        with self._state() as st:
            self._remove_device(st, addr)


def _id_rule(fields: list[int]) -> tuple[int, int, int, int, int, int]:
    """(vendor, device, subvendor, subdevice, class, class_mask) of a new_id/remove_id write with
    the kernel's defaults for fields left out (PCI_ANY_ID, 0); EINVAL without vendor and device."""
    if len(fields) < 2:
        raise Fail(errno.EINVAL)
    padded = fields[:6] + [ANY, ANY, 0, 0][max(0, len(fields) - 2) :]
    return tuple(padded[:6])  # type: ignore[return-value]
