"""udev beside a simulated kernel, for the tests of the wait after a driver change.

:class:`FakeUdev` stands for the kernel's event queue and udevd together: every write through
:meth:`FakeUdev.sysfs` is compared with the tree before it, and the events the kernel sends for
such a change get the next ``SEQNUM`` (a function's ``unbind`` then ``bind``, as
``device_release_driver``/``driver_bound`` send them; a vfio group's ``add`` when its node
appears, ``remove`` when it goes). udevd "processes" each one and broadcasts it to every
listener open at that time, ``delay`` seconds later (from a timer thread), except the events of
the devices in ``held`` (a udev worker stuck on them: never broadcast). ``slow`` makes one event
(``(action, device)``) take that many seconds instead, once: a rule's program that took long.
As udevd does, the events of one device are broadcast in order, none before the one ahead of it
(``src/udev/udev-manager.c`` ``event_is_blocked``).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from gputopo.ports import DeviceEvent, SysfsPort


class FakeListener:
    def __init__(self, udev: FakeUdev, seqnum: int):
        self.udev = udev
        self.seqnum = seqnum
        self.queue: list[DeviceEvent] = []
        self.received: list[DeviceEvent] = []
        self.closed = False
        self.cond = threading.Condition()

    def deliver(self, ev: DeviceEvent) -> None:
        with self.cond:
            self.queue.append(ev)
            self.cond.notify_all()

    def receive(self, timeout: float) -> DeviceEvent | None:
        with self.cond:
            if not self.queue:
                self.cond.wait(timeout)
            if not self.queue:
                return None
            ev = self.queue.pop(0)
            self.received.append(ev)
            return ev

    def close(self) -> None:
        self.closed = True


class _Port:
    """The SysfsPort whose writes make events."""

    def __init__(self, udev: FakeUdev, inner: SysfsPort):
        self.udev, self.inner, self.root = udev, inner, inner.root

    def write(self, path: str, value: str) -> None:
        before = self.udev.tree()
        try:
            self.inner.write(path, value)
        finally:
            self.udev.kernel_events(before, self.udev.tree())


class FakeUdev:
    """A :class:`gputopo.ports.DeviceEventsPort` driven by the writes through :meth:`sysfs`."""

    def __init__(self, root: str | os.PathLike, delay: float = 0.0, held: set[str] = frozenset()):
        self.root = Path(root)
        self.delay = delay
        self.held = set(held)
        self.failed: dict[str, str] = {}  # device name -> what udev says of its failed rules
        self.slow: dict[tuple[str, str], float] = {}
        self.due: dict[str, float] = {}  # device -> when udev broadcasts its last event so far
        self.seq = 1000
        self.listeners: list[FakeListener] = []
        self.kernel: list[DeviceEvent] = []  # every event the kernel sent, in order
        self.broadcast: list[tuple[float, DeviceEvent]] = []  # (time.monotonic(), event) udev sent
        self.lock = threading.Lock()

    def sysfs(self, inner: SysfsPort) -> SysfsPort:
        return _Port(self, inner)

    def listen(self) -> FakeListener:
        with self.lock:
            lst = FakeListener(self, self.seq)
            self.listeners.append(lst)
            return lst

    def stale(self, lst: FakeListener, subsystem: str, name: str, action: str) -> None:
        """Hand ``lst`` an event of the device from before it listened (udev late with it)."""
        lst.deliver(DeviceEvent(action, subsystem, name, lst.seqnum - 1, at=time.monotonic()))

    # -- the kernel side --------------------------------------------------------------------

    def tree(self) -> tuple[dict[str, str | None], set[str]]:
        devs = self.root / "sys/bus/pci/devices"
        drivers = {}
        for a in sorted(os.listdir(devs)):
            try:
                drivers[a] = os.path.basename(os.readlink(devs / a / "driver"))
            except OSError:
                drivers[a] = None
        vfio = self.root / "dev/vfio"
        groups = {g for g in os.listdir(vfio) if g != "vfio"} if vfio.is_dir() else set()
        return drivers, groups

    def kernel_events(self, before, after) -> None:
        (d0, g0), (d1, g1) = before, after
        events = []
        for a in sorted(set(d0) | set(d1)):
            old, new = d0.get(a), d1.get(a)
            if old == new:
                continue
            if old is not None:
                events.append(("unbind", "pci", a, None))
            if new is not None:
                events.append(("bind", "pci", a, new))
        events += [("add", "vfio", g, None) for g in sorted(g1 - g0)]
        events += [("remove", "vfio", g, None) for g in sorted(g0 - g1)]
        with self.lock:
            out = []
            for action, subsystem, name, driver in events:
                self.seq += 1
                ev = DeviceEvent(action, subsystem, name, self.seq, driver, self.failed.get(name))
                self.kernel.append(ev)
                out.append(ev)
            listeners = list(self.listeners)
        for ev in out:
            if ev.name in self.held:
                continue
            now = time.monotonic()
            with self.lock:
                took = self.slow.pop((ev.action, ev.name), self.delay)
                due = self.due[ev.name] = max(now + took, self.due.get(ev.name, 0.0))
            if due > now:
                threading.Timer(due - now, self._broadcast, (ev, listeners)).start()
            else:
                self._broadcast(ev, listeners)

    def _broadcast(self, ev: DeviceEvent, listeners: list[FakeListener]) -> None:
        now = time.monotonic()
        ev = DeviceEvent(ev.action, ev.subsystem, ev.name, ev.seqnum, ev.driver, ev.failed, now)
        with self.lock:
            self.broadcast.append((now, ev))
        for lst in listeners:
            if not lst.closed:
                lst.deliver(ev)
