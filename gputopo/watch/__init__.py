"""The drift watch (``gputopo watch``): ``diff`` and the quick checks of ``verify`` against the
node's spec, read-only, written as node_exporter textfile metrics or as text.

* :mod:`~gputopo.watch.run`: one pass (:func:`watch_once`), its :class:`WatchResult`; while an
  apply holds the host lock a pass says so instead of reading a half-changed host;
* :mod:`~gputopo.watch.metrics`: the result as Prometheus metrics (``prometheus_client``),
  written atomically into node_exporter's textfile directory, or as text;
* :mod:`~gputopo.watch.follow`: ``--follow``, a pass after each burst of udev's PCI events
  (``pyudev.Monitor``) and every interval, with the event source injectable.
"""

from gputopo.watch.follow import EventSource, NoEvents, NoUdev, PciEvent, UdevEvents, follow
from gputopo.watch.run import DEFAULT_SPEC, QUICK_CHECKS, WatchResult, watch_once

__all__ = [
    "DEFAULT_SPEC",
    "QUICK_CHECKS",
    "EventSource",
    "NoEvents",
    "NoUdev",
    "PciEvent",
    "UdevEvents",
    "WatchResult",
    "follow",
    "watch_once",
]
