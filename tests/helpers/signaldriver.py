"""Runs the ``gputopo`` command line in this process and interrupts it inside one sysfs write.

``GPUTOPO_INTERRUPT_AT=ADDRESS:N``: the N-th sysfs write that names ADDRESS (its
``driver_override``, or an unbind, probe or bind of it) sends this process SIGINT three times,
0.1 s apart, as an operator pressing Ctrl-C again and again does, and is held before it is
written. If any other write names ADDRESS meanwhile (a rollback that began while the held write
is still to come), the held write lands right after that one, and the other waits for it: the
interleaving of two writers on one device is forced, not left to timing. Nobody else writing
within 1.5 s (the apply waits for the held write's step to end) releases it as it is. No other
write is touched.

Used as ``python tests/helpers/signaldriver.py apply --spec ... --sim DIR --yes``; test code only.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

_address, _, _n = os.environ.get("GPUTOPO_INTERRUPT_AT", "").rpartition(":")
_limit = int(_n) if _n.isdigit() else 0
_lock = threading.Lock()
_seen = {"n": 0}
_other_wrote = threading.Event()  # another write named the address after the held one fired
_held_done = threading.Event()  # the held write went through
HOLD = 1.5  # seconds a held writer waits for the other


def _names(path: str, value: str) -> bool:
    return f"/{_address}/" in path or value.strip() == _address


def install() -> None:
    from gputopo.sim.kernel import SimKernel

    original = SimKernel.write

    def write(self, path: str, value: str) -> None:
        if not _limit or not _names(path, value):
            return original(self, path, value)
        with _lock:
            _seen["n"] += 1
            mine = _seen["n"] == _limit
            after = _seen["n"] > _limit
        if mine:
            for _ in range(3):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.1)
            _other_wrote.wait(HOLD)
            try:
                return original(self, path, value)
            finally:
                _held_done.set()
        if after and not _other_wrote.is_set():
            try:
                return original(self, path, value)
            finally:
                _other_wrote.set()
                _held_done.wait(HOLD)
        return original(self, path, value)

    SimKernel.write = write


if __name__ == "__main__":
    install()
    from gputopo.cli import main

    main(sys.argv[1:])
