"""What the simulated kernel did, and when: an in-memory record per :class:`SimKernel` instance,
so a test can check what happened (two unbinds overlapping, a latency honoured) instead of timing
a whole run."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class KernelEvent:
    """One driver operation the simulated kernel carried out on a device.

    ``start``: ``time.monotonic()`` once the device was this write's to change (its lock held,
    faults passed); ``end``: when the tree showed the result. ``delay``: the latency it was given
    (seconds, ``time_scale`` applied).
    """

    op: str  # "unbind" or "bind" (a bind through bind, drivers_probe or new_id)
    driver: str
    address: str
    delay: float
    start: float
    end: float


class EventLog:
    """Mixin of :class:`gputopo.sim.kernel.SimKernel`: the operations this instance carried out."""

    _events: list[KernelEvent]
    _lock: threading.RLock

    def events(self) -> list[KernelEvent]:
        """The driver operations this instance carried out, oldest first (a copy)."""
        with self._lock:
            return list(self._events)

    def _record(self, op: str, drv: str, addr: str, delay: float, start: float) -> None:
        with self._lock:
            self._events.append(KernelEvent(op, drv, addr, delay, start, time.monotonic()))
