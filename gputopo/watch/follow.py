"""``gputopo watch --follow``: a pass again as soon as a PCI device changes driver or leaves the
bus, and every ``interval`` seconds in any case (a hand edit of a config makes no device event).

The events come from an :class:`EventSource`: on a node, udev's own (:class:`UdevEvents`, a
``pyudev.Monitor`` on subsystem ``pci``, through pyudev's public API only); where there is no
udev (a container, the simulated host) :class:`NoEvents`, so only the interval runs passes. A
test hands :func:`follow` a source of its own and a clock, and sees each pass when it happens.

A burst of events (an apply unbinds and binds a whole IOMMU group; a GPU that falls off takes
its audio function with it) makes one pass: after the first event the loop waits until
:data:`QUIET` seconds pass without another, but never more than :data:`MAX_DELAY` after the
first, so the pass begins within a second of the change.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from gputopo.adapters.udev import NoUdev as NoUdev  # watch --follow says it when there is no udev
from gputopo.adapters.udev import open_monitor

#: the udev actions of a PCI device that re-run the pass: a driver bound or unbound, the device
#: gone from the bus or back on it (udev's ``add`` after a rescan)
ACTIONS = frozenset({"bind", "unbind", "remove", "add"})
QUIET = 0.2  # seconds without another event that end a burst
MAX_DELAY = 0.5  # seconds from a burst's first event to its pass, at most
POLL = 1.0  # the longest one wait for an event lasts, so that a stop is seen within it


@dataclass(frozen=True)
class PciEvent:
    """One device event: udev's action and the device's PCI address."""

    action: str
    address: str


class EventSource(Protocol):
    """Where device events come from."""

    def next(self, timeout: float) -> PciEvent | None:
        """The next event, waiting at most ``timeout`` seconds; None when none came."""
        ...


class UdevEvents:
    """udev's events of subsystem ``pci``, as udev sends them once its rules for the device ran
    (the monitor of :func:`gputopo.adapters.udev.open_monitor`, the one apply's wait uses)."""

    def __init__(self, monitor):
        self.monitor = monitor

    @classmethod
    def open(cls, root: str | os.PathLike = "/") -> UdevEvents:
        """Listen to udev. Raises NoUdev when systemd-udevd does not run under ``root`` (no
        ``/run/udev/control``: a container), pyudev finds no libudev or the kernel's netlink
        socket is refused."""
        return cls(open_monitor(root, ("pci",)))

    def next(self, timeout: float) -> PciEvent | None:
        device = self.monitor.poll(timeout=timeout)
        if device is None:
            return None
        return PciEvent(action=device.action or "", address=device.sys_name)


class NoEvents:
    """No device events: each wait only waits (``wait(timeout)``, e.g. a stop event's, which
    returns early when the loop is to stop)."""

    def __init__(self, wait: Callable[[float], object] = time.sleep):
        self._wait = wait

    def next(self, timeout: float) -> PciEvent | None:
        self._wait(timeout)
        return None


def follow(
    source: EventSource,
    one_pass: Callable[[str], object],
    stop: Callable[[], bool],
    *,
    interval: float,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Run ``one_pass(why)`` now, after each burst of :data:`ACTIONS` events of ``source`` and
    every ``interval`` seconds after the last pass, until ``stop()`` is true (looked at before
    each wait). ``why`` is ``start``, ``interval`` or the first event, e.g. ``unbind
    0000:81:00.0``. Returns how many passes ran."""
    passes = 0

    def run(why: str) -> None:
        nonlocal passes, last
        one_pass(why)
        passes += 1
        last = clock()

    last = clock()
    run("start")
    while not stop():
        due = last + interval
        event = source.next(max(min(due - clock(), POLL), 0.0))
        if event is None or event.action not in ACTIONS:
            if clock() >= due:
                run("interval")
            continue
        first = clock()
        while not stop():  # the rest of the burst
            left = min(QUIET, first + MAX_DELAY - clock())
            if left <= 0 or source.next(left) is None:
                break
        if not stop():
            run(f"{event.action} {event.address}")
    return passes
