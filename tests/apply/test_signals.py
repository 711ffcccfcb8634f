"""Signals during an apply (``gputopo.apply.signals``), in this process's main thread: a signal
while worker steps run waits until they ended; only the first one interrupts, the ones after it
are noted; a notice never waits in the handler for a lock the interrupted code holds."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from gputopo.apply import signals


def sigint() -> None:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.05)  # the handler runs in the main thread at its next instruction


def notices_written() -> None:
    for t in [t for t in threading.enumerate() if t.name == "signal notice"]:
        t.join(5)


def test_a_signal_inside_held_is_raised_when_the_block_ends_and_later_ones_are_only_noted(capsys):
    notes: list[str] = []
    reached = False
    with signals.interruptible():
        with pytest.raises(signals.Signalled), signals.held(notes.append):
            sigint()
            sigint()
            reached = True
        assert reached
        sigint()  # the rollback this interrupt starts must not be cut short
    notices_written()
    assert notes == ["SIGINT received: rolling back once the steps running now end"]
    assert "SIGINT received: the rollback continues" in capsys.readouterr().err


def test_an_error_of_the_held_block_outranks_a_signal_that_came_meanwhile(capsys):
    with signals.interruptible():
        with pytest.raises(ValueError), signals.held():
            sigint()
            raise ValueError("a rebind failed")
        sigint()  # noted: the failure's rollback follows
    notices_written()
    assert "the rollback continues" in capsys.readouterr().err


def test_a_notice_never_waits_in_the_handler_for_a_lock_the_main_thread_holds():
    display = threading.Lock()  # a display's lock, held by the main thread mid-line
    notes: list[str] = []

    def note(text: str) -> None:
        if display.acquire(timeout=1):
            notes.append(text)
            display.release()
        else:
            notes.append("the handler waited for the display's lock")

    with signals.interruptible():
        with pytest.raises(signals.Signalled), signals.held(note):
            with display:
                sigint()
    notices_written()
    assert notes == ["SIGINT received: rolling back once the steps running now end"]


def test_with_again_raise_every_signal_raises_and_carries_its_number():
    """A rollout's wait (cluster apply): no rollback of its own to protect, so a second Ctrl-C or
    SIGTERM stops it as the first did, and each one says which signal it was."""
    seen = []
    before = {s: signal.getsignal(s) for s in signals.SIGNALS}
    with signals.interruptible(again="raise"):
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            with pytest.raises(signals.Signalled) as e:
                os.kill(os.getpid(), signum)
                time.sleep(1)
            seen.append(e.value.signum)
    assert seen == [signal.SIGTERM, signal.SIGINT, signal.SIGHUP]
    assert {s: signal.getsignal(s) for s in signals.SIGNALS} == before  # the handlers are put back
