"""How apply and recover show their steps: plain lines off a terminal (logs, pipes), styled lines
on one. A step that waits (a guest's start or shutdown task, a service until active, a sysfs
write) shows its timeout when it begins, and then, every few seconds until it ends, how long it
has waited: ``[ 7/14] stop    stop CT 101: 10 s of 300 s``.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

from gputopo.usecases.progress import PlainProgress

PLAIN_EVERY = 10.0  # a line every 10 s in a log: enough to see it is alive, not a flood
TERMINAL_EVERY = 5.0


class _Waits:
    """The steps that wait, each with its start time and timeout; a thread reports them."""

    def __init__(self, timeouts: Any, every: float, report):
        self.timeouts = timeouts
        self.every = every
        self.report = report  # (index, total, action, elapsed, timeout) -> None
        self._steps: dict[int, tuple[int, Any, float, float]] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def timeout_of(self, action: Any) -> float | None:
        if self.timeouts is None:
            return None
        return action.timeout(self.timeouts) if hasattr(action, "timeout") else None

    def begin(self, index: int, total: int, action: Any) -> float | None:
        limit = self.timeout_of(action)
        if limit is None:
            return None
        with self._lock:
            self._steps[index] = (total, action, time.monotonic(), limit)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="gputopo progress", daemon=True)
                self._thread.start()
        return limit

    def end(self, index: int) -> None:
        with self._lock:
            self._steps.pop(index, None)

    def _run(self) -> None:
        told: dict[int, int] = {}
        while True:
            time.sleep(min(1.0, self.every / 2))
            now = time.monotonic()
            with self._lock:
                if not self._steps:  # nothing waits: the next waiting step starts a new thread
                    self._thread = None
                    return
                steps = dict(self._steps)
            for index, (total, action, t0, limit) in sorted(steps.items()):
                ticks = int((now - t0) / self.every)
                if ticks > told.get(index, 0):
                    told[index] = ticks
                    try:
                        self.report(index, total, action, now - t0, limit)
                    except OSError:
                        pass  # a display that cannot be written never stops an apply


def _limit(limit: float | None) -> str:
    return f" (timeout {limit:g} s)" if limit is not None else ""


class Plain(PlainProgress):
    """One line per event, and a line every ``every`` seconds while a step waits."""

    def __init__(self, stream: Any = None, timeouts: Any = None, every: float = PLAIN_EVERY):
        super().__init__(stream)
        self.waits = _Waits(timeouts, every, self._tick)

    def step_begin(self, index: int, total: int, action: Any) -> None:
        limit = self.waits.begin(index, total, action)
        self._w(f"[{index + 1:>2}/{total}] {action.phase:<7} {action.describe()} ...{_limit(limit)}")

    def step_end(self, index: int, total: int, action: Any, status: str, seconds: float) -> None:
        self.waits.end(index)
        super().step_end(index, total, action, status, seconds)

    def _tick(self, index: int, total: int, action: Any, elapsed: float, limit: float) -> None:
        self._w(
            f"[{index + 1:>2}/{total}] {action.phase:<7} {action.describe()}: {elapsed:.1f} s of {limit:g} s"
        )


class _RichProgress:
    """Each step as a styled line with its time; the stop window while it is open; a waiting
    step's elapsed seconds against its timeout."""

    def __init__(self, timeouts: Any = None, every: float = TERMINAL_EVERY):
        from gputopo.cli.output import console

        self.out = console()
        self.t_stop: float | None = None
        self.waits = _Waits(timeouts, every, self._tick)

    def plan(self, p) -> None: ...

    def step_begin(self, index, total, action) -> None:
        if action.phase == "stop" and self.t_stop is None:
            self.t_stop = time.monotonic()
        limit = self.waits.begin(index, total, action)
        self.out.print(
            f"[dim][{index + 1:>2}/{total}][/] {action.phase:<7} {action.describe()} ...[dim]{_limit(limit)}[/]",
            markup=True,
        )

    def _tick(self, index, total, action, elapsed, limit) -> None:
        self.out.print(
            f"[dim][{index + 1:>2}/{total}][/] {action.phase:<7} {action.describe()}: "
            f"[yellow]{elapsed:.1f} s[/] of {limit:g} s",
            markup=True,
            highlight=False,
        )

    def step_end(self, index, total, action, status, seconds) -> None:
        self.waits.end(index)
        style = "green" if status == "done" else "bold red"
        window = ""
        if self.t_stop is not None:
            window = f"  [dim](stop window {time.monotonic() - self.t_stop:.1f} s)[/]"
        self.out.print(
            f"[dim][{index + 1:>2}/{total}][/] {action.phase:<7} {action.describe()}: "
            f"[{style}]{status}[/] {seconds:.2f} s{window}",
            markup=True,
            highlight=False,
        )

    def note(self, text) -> None:
        self.out.print(text, markup=False)

    def summary(self, result) -> None:
        window = f", stop window {result.stop_window_s:.1f} s" if result.stop_window_s is not None else ""
        self.out.print(f"[bold]{result.status}[/] in {result.wall_s:.1f} s{window}", markup=True)


def display(timeouts: Any = None, stream: Any = None, plain: bool | None = None):
    """The display for apply and recover: plain lines off a terminal (or when ``plain``),
    styled ones on it; ``stream`` for the plain lines (stdout by default)."""
    if plain or not sys.stdout.isatty():
        return Plain(stream, timeouts)
    return _RichProgress(timeouts)
