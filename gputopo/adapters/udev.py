"""Waiting for udev after a driver change: what ``udevadm settle`` does, for the devices moved.

A write to ``bind``, ``unbind`` or ``drivers_probe`` returns once the kernel has bound or
unbound the driver and queued the event (``bind``/``unbind``; a vfio group's ``add`` when the
first function of its IOMMU group binds to vfio-pci). udev then processes it: the rules of a
driver package that make ``/dev/nvidia*`` on distributions that ship them, gputopo's own
persistence rule, the owner and mode of ``/dev/vfio/N``. A step that uses such a node right
after the write races udev; this module ends that race for the devices a move touched.

How "udev has processed THIS event" is told:

* A udev worker runs the event's rules, then their ``RUN`` programs, then writes the database
  entry, and only then broadcasts the event to libudev listeners (systemd
  ``src/udev/udev-worker.c``: ``worker_process_device`` runs ``udev_event_execute_rules``,
  ``udev_event_execute_run`` and ``device_update_db``; ``worker_device_monitor_handler`` then
  calls ``udev_broadcast_result``, also when processing failed, with ``UDEV_WORKER_FAILED``).
  A ``pyudev.Monitor`` on the ``udev`` netlink source therefore receives an event exactly when
  udev is done with it.
* The listener is made BEFORE the write, and the kernel's last event number
  (``/sys/kernel/uevent_seqnum``) is read right after: every event of the write carries a larger
  ``SEQNUM``, so an earlier event of the same device that udev is still busy with (an unbind
  before the bind) cannot end the wait, and none of the write's events can be missed.
* udev processes the events of one device in order (an event waits while an earlier one of
  the same or a parent/child devpath is processed: ``event_is_blocked`` in
  ``src/udev/udev-manager.c``, ``udevd.c`` in older releases), so the device's last event seen
  means its earlier ones are done.
* Not ``Device.is_initialized`` / ``USEC_INITIALIZED``: udev keeps the first initialisation
  time across later events (``src/udev/udev-event.c`` ``udev_event_execute_rules``: "preserve
  old, or get new initialization timestamp"), so a device present since boot reads initialised
  before, during and after its bind; and the entry is written before ``RUN`` programs end.

Where no udev runs (the simulator, a container: no ``/run/udev/control``), there is nothing
to wait for; that is said once, at debug level, and the moves go on.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gputopo.errors import UdevTimeout
from gputopo.ports import DeviceEvent, DeviceEventListener

log = logging.getLogger(__name__)

# the socket udevd listens on for udevadm; libudev's udev_queue_get_udev_is_active tests it too
CONTROL = "run/udev/control"
SEQNUM = "sys/kernel/uevent_seqnum"
SUBSYSTEMS = ("pci", "vfio")  # a PCI function's bind/unbind, a vfio group's node

_said: set[str] = set()


def say_once(text: str) -> None:
    """Log ``text`` at debug level, once per process."""
    if text not in _said:
        _said.add(text)
        log.debug(text)


def kernel_seqnum(root: str = "/") -> int:
    """The number of the kernel's last device event (``/sys/kernel/uevent_seqnum``); 0 when
    unreadable."""
    try:
        with open(os.path.join(root, SEQNUM)) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return 0


def _failure(props) -> str | None:
    """What udev says of an event whose processing failed (``UDEV_WORKER_*``), else None."""
    if props.get("UDEV_WORKER_FAILED") != "1":
        return None
    for key, what in (
        ("UDEV_WORKER_EXIT_STATUS", "a program exited {}"),
        ("UDEV_WORKER_SIGNAL_NAME", "a program was killed by {}"),
        ("UDEV_WORKER_ERRNO_NAME", "{}"),
    ):
        if props.get(key):
            return what.format(props[key])
    return "failed"


class MonitorListener:
    """A started ``pyudev.Monitor`` on udev's broadcasts, for :data:`SUBSYSTEMS`."""

    def __init__(self, monitor, seqnum: int):
        self.monitor = monitor
        self.seqnum = seqnum

    def receive(self, timeout: float) -> DeviceEvent | None:
        start = time.monotonic()
        try:
            device = self.monitor.poll(timeout=max(0.0, timeout))
        except OSError:
            # the socket overflowed (ENOBUFS: events were dropped) or broke: what it lost cannot
            # be told, so nothing more is awaited from it; the wait ends at its timeout
            time.sleep(max(0.0, timeout - (time.monotonic() - start)))
            return None
        if device is None:
            return None
        props = device.properties
        return DeviceEvent(
            action=device.action or "",
            subsystem=device.subsystem or "",
            name=device.sys_name,
            seqnum=device.sequence_number,
            driver=props.get("DRIVER"),
            failed=_failure(props),
            at=time.monotonic(),
        )

    def close(self) -> None:
        # pyudev closes the netlink socket when the monitor is collected; drop it now
        self.monitor = None


class UdevEvents:
    """The real :class:`gputopo.ports.DeviceEventsPort`: ``pyudev.Monitor.from_netlink(context,
    source='udev')``, filtered to :data:`SUBSYSTEMS` in the kernel (the monitor's socket filter)."""

    def __init__(self, root: str = "/"):
        self.root = root

    def unavailable(self) -> str | None:
        """Why no udev events can be heard here, or None."""
        return unavailable(self.root)

    def listen(self) -> MonitorListener | None:
        try:
            monitor = open_monitor(self.root, SUBSYSTEMS)
        except NoUdev as e:
            say_once(f"{e}; driver changes do not wait for udev")
            return None
        return MonitorListener(monitor, kernel_seqnum(self.root))


class NoUdev(Exception):
    """There is no udev to listen to here; ``str()`` says why in a few words."""


def unavailable(root: str | os.PathLike = "/") -> str | None:
    """Why no udev runs under ``root`` (no ``/run/udev/control``: a container, the simulated
    host), or None."""
    if not os.path.exists(os.path.join(root, CONTROL)):
        return f"no udev here (no /{CONTROL}: a container, or systemd-udevd is not running)"
    return None


def open_monitor(root: str | os.PathLike, subsystems: Iterable[str]):
    """A started ``pyudev.Monitor`` on udev's broadcasts (source ``udev``: sent once udev's rules
    for the device ran), filtered to ``subsystems`` in the kernel. Raises :class:`NoUdev` when
    udev does not run under ``root``, pyudev finds no libudev or netlink is refused (seccomp,
    namespaces)."""
    why = unavailable(root)
    if why is not None:
        raise NoUdev(why)
    try:
        import pyudev

        monitor = pyudev.Monitor.from_netlink(pyudev.Context(), source="udev")
        for subsystem in subsystems:
            monitor.filter_by(subsystem)
        monitor.start()
    except Exception as e:  # no libudev, no netlink socket
        raise NoUdev(f"cannot listen to udev: {e}") from None
    return monitor


@dataclass(frozen=True, order=True)
class Expect:
    """An event a move must see udev finish: ``action`` of device ``name`` in ``subsystem``."""

    subsystem: str
    name: str
    action: str

    def __str__(self) -> str:
        what = f"vfio group {self.name}" if self.subsystem == "vfio" else self.name
        return f"{self.action} of {what}"


def await_events(
    listener: DeviceEventListener,
    expected: Iterable[Expect],
    timeout: float,
    clock: Callable[[], float] = time.monotonic,
) -> dict[Expect, DeviceEvent]:
    """Wait until udev has broadcast every expected event made after ``listener.seqnum``.

    Returns the event seen for each. Raises :class:`gputopo.errors.UdevTimeout` naming the
    events still awaited when ``timeout`` seconds pass first.
    """
    waiting = set(expected)
    seen: dict[Expect, DeviceEvent] = {}
    deadline = clock() + timeout
    while waiting:
        left = deadline - clock()
        if left <= 0:
            raise UdevTimeout([str(e) for e in sorted(waiting)], timeout)
        ev = listener.receive(left)
        if ev is None or ev.seqnum <= listener.seqnum:
            continue  # nothing yet, or an event from before the write
        key = Expect(ev.subsystem, ev.name, ev.action)
        if key in waiting:
            waiting.discard(key)
            seen[key] = ev
    return seen
