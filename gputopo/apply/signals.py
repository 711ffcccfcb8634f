"""Signals during an apply: Ctrl-C, SIGTERM and SIGHUP roll back instead of killing the process
between two steps. Only the first one interrupts: a rollback follows it, so the ones after it
(an operator pressing Ctrl-C again) are noted and wait until the rollback ends. While steps run
in worker threads (the rebinds of a switch phase) a signal waits until every worker ended
(:func:`held`): a rollback that began while a worker still wrote to sysfs would race it, and
the group would end on whichever driver the last write chose."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, Literal

from gputopo.errors import Interrupted

# main thread only: held() depth, the signal it keeps, whether one interrupted already, the
# rollback's notice
_HOLD: dict[str, Any] = {
    "depth": 0,
    "pending": None,
    "deferring": False,
    "raised": False,
    "notice": None,
    "held_notice": None,
    "deferred_text": None,
    "stoppable": False,
}
# what interruptible() sets afresh on entry and gives back on exit
_SCOPED = ("raised", "deferring", "notice", "deferred_text", "stoppable")
_ROLLBACK_GOES_ON = (
    "{name} received: the rollback continues so that nothing is left half-done; it ends by itself"
)
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
def interruptible(again: Literal["wait", "raise"] = "wait") -> Iterator[None]:
    """While inside, the first Ctrl-C, SIGTERM or SIGHUP raises :class:`Signalled` (a
    KeyboardInterrupt) in the main thread, so a polite kill (systemd, a dropped ssh session) rolls
    back instead of ending the process between two steps; with ``again="wait"`` later ones, and
    any after :func:`settle`, are only noted (the rollback the first one started must not be
    cut short, not even before it began); with ``again="raise"`` every one raises (a rollout,
    which has no rollback of its own to protect: each node's apply handles its own signals).
    Elsewhere than in the main thread (where no handler can be set) it changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        if again == "raise":
            raise Signalled(signum)
        name = signal.Signals(signum).name
        if _HOLD["stoppable"]:
            _HOLD["stoppable"] = False
            raise Signalled(signum)
        if _HOLD["deferring"] or _HOLD["raised"]:
            _say(_HOLD["notice"] or _stderr, (_HOLD["deferred_text"] or _ROLLBACK_GOES_ON).format(name=name))
            return
        if _HOLD["depth"]:
            if _HOLD["pending"] is None and _HOLD["held_notice"] is not None:
                _say(_HOLD["held_notice"], f"{name} received: rolling back once the steps running now end")
            _HOLD["pending"] = signum
            return
        _HOLD["raised"] = True
        raise Signalled(signum)

    saved = {k: _HOLD[k] for k in _SCOPED}
    _HOLD.update(raised=False, deferring=False, notice=None, deferred_text=None, stoppable=False)
    old = {s: signal.signal(s, handler) for s in SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        _HOLD.update(saved)


def _stderr(text: str) -> None:
    print(text, file=sys.stderr)


def _say(notice: Callable[[str], None], text: str) -> None:
    """``notice(text)`` from a signal handler, in a thread of its own: the handler runs in the main
    thread between any two of its instructions, maybe while it holds the display's lock in the
    middle of a line, and taking that lock again there would wait for ever."""
    threading.Thread(target=notice, args=(text,), name="signal notice", daemon=True).start()


@contextlib.contextmanager
def held(notice: Callable[[str], None] | None = None) -> Iterator[None]:
    """A signal of :func:`interruptible` that arrives inside is raised when the block ends
    (``notice`` says so when it arrives), unless the block raises an error of its own: the
    rollback that error starts is what the signal asks for."""
    before = _HOLD["held_notice"]
    _HOLD["depth"] += 1
    if notice is not None:
        _HOLD["held_notice"] = notice
    failed = False
    try:
        yield
    except BaseException:
        failed = True
        raise
    finally:
        _HOLD["depth"] -= 1
        _HOLD["held_notice"] = before
        if not _HOLD["depth"] and _HOLD["pending"] is not None:
            signum, _HOLD["pending"] = _HOLD["pending"], None
            _HOLD["raised"] = True  # a rollback follows either way: later signals wait for it
            if not failed:
                raise Signalled(signum)


def settle(notice: Callable[[str], None] | None = None, text: str | None = None) -> None:
    """From now until the enclosing :func:`interruptible` ends, its signals never interrupt:
    ``notice`` says ``text`` (``{name}`` the signal's; by default that the rollback continues).
    A rollback or a recovery runs to its end (as terraform does on a second Ctrl-C); what is
    left after a journal's end rolls nothing back, and no signal lands between that end and the
    handlers' removal to report an interruption of a command that is done. Only
    :func:`stoppable` lets one stop work that changes nothing. A SIGKILL still ends the process;
    the journal then sends the next command to recover."""
    _HOLD.update(deferring=True, notice=notice or _stderr, deferred_text=text)


@contextlib.contextmanager
def stoppable() -> Iterator[None]:
    """After :func:`settle`, the first signal of :func:`interruptible` raises :class:`Signalled`
    after all: work that can be done again and changes nothing (the verification after an
    apply's end) may be stopped, while the rest of the command still ends by itself."""
    before = _HOLD["stoppable"]
    _HOLD["stoppable"] = True
    try:
        yield
    finally:
        _HOLD["stoppable"] = before
