"""Signals during an apply: Ctrl-C, SIGTERM and SIGHUP roll back instead of killing the process
between two steps; once a rollback runs, further signals wait until it ends."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from gputopo.errors import Interrupted

_HOLD: dict[str, Any] = {"depth": 0, "pending": None, "deferring": False, "notice": None}  # main thread only
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Signalled(KeyboardInterrupt):
    # a KeyboardInterrupt, so that no adapter's "except Exception" turns it into its own error
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def as_error(e: BaseException) -> BaseException:
    """Ctrl-C and the signals of :func:`interruptible` as :class:`Interrupted`; others as they are."""
    if isinstance(e, KeyboardInterrupt):
        return Interrupted(getattr(e, "signum", signal.SIGINT))
    return e


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """While inside, Ctrl-C, SIGTERM and SIGHUP raise :class:`Signalled` (a KeyboardInterrupt) in
    the main thread, so a polite kill (systemd, a dropped ssh session) rolls back instead of
    ending the process between two steps. Inside :func:`deferred` they are only noted. Elsewhere
    than in the main thread (where no handler can be set) it changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        if _HOLD["deferring"]:
            notice = _HOLD["notice"]
            if notice is not None:
                notice(
                    f"{signal.Signals(signum).name} received: the rollback continues so that "
                    "nothing is left half-done; it ends by itself"
                )
            return
        if _HOLD["depth"]:
            _HOLD["pending"] = signum
            return
        raise Signalled(signum)

    old = {s: signal.signal(s, handler) for s in SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@contextlib.contextmanager
def held() -> Iterator[None]:
    """A signal of :func:`interruptible` that arrives inside is raised when the block ends."""
    _HOLD["depth"] += 1
    try:
        yield
    finally:
        _HOLD["depth"] -= 1
        if not _HOLD["depth"] and _HOLD["pending"] is not None:
            signum, _HOLD["pending"] = _HOLD["pending"], None
            raise Signalled(signum)


@contextlib.contextmanager
def deferred(notice: Callable[[str], None] | None = None) -> Iterator[None]:
    """Inside, signals of :func:`interruptible` never interrupt: a rollback or a recovery runs to
    its end (as terraform does on a second Ctrl-C), and ``notice`` says so on the terminal.
    A SIGKILL still ends the process; the journal then sends the next command to recover."""
    before = (_HOLD["deferring"], _HOLD["notice"])
    _HOLD["deferring"], _HOLD["notice"] = True, notice or (lambda text: print(text, file=sys.stderr))
    try:
        yield
    finally:
        _HOLD["deferring"], _HOLD["notice"] = before
