"""Runs the ``gputopo`` command line in this process and SIGKILLs it at an exact point.

``GPUTOPO_CRASH_AT=record:N`` kills the process right after the N-th journal record is on disk
(fsynced); ``call:N`` right after the N-th call that changes the host returned: a sysfs write, a
Proxmox API call other than a GET (a guest start or stop is killed once its task was accepted),
a command in the container that changes something (``systemctl start|stop|restart|daemon-reload``,
``rm``, ``mkdir``, ``rmdir``), ``pct push``, a host file written or removed; ``job:N`` once the
simulated container's systemd took the N-th service start (its processes hold their GPUs) while
``systemctl start`` still waits for the server to be ready. No timing is involved:
the point is counted, not polled. ``GPUTOPO_CRASH_COUNT=FILE`` writes how many records and calls
the run made, and the order they came in (JSON), when it ends normally, so a test can enumerate
every point.

Used as ``python tests/helpers/crashdriver.py apply --spec ... --sim DIR --yes``; test code only.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import sys
import threading

MUTATING_COMMANDS = {
    ("systemctl", "start"),
    ("systemctl", "stop"),
    ("systemctl", "restart"),
    ("systemctl", "daemon-reload"),
}
MUTATING_PROGRAMS = {"rm", "mkdir", "rmdir"}

_lock = threading.Lock()
_count = {"record": 0, "call": 0, "job": 0}
_at = os.environ.get("GPUTOPO_CRASH_AT", "")
_kind, _, _n = _at.partition(":")
_limit = int(_n) if _n.isdigit() else 0


_trace: list[tuple[str, int, int]] = []  # (record type or calling class, records so far, calls so far)


def _tick(kind: str, what: str = "") -> None:
    with _lock:
        _count[kind] += 1
        _trace.append((what or kind, _count["record"], _count["call"]))
        if kind == _kind and _count[kind] == _limit:
            os.kill(os.getpid(), signal.SIGKILL)


def _wrap(cls: type, name: str, kind: str, when=lambda *a, **k: True) -> None:
    original = getattr(cls, name)

    def wrapper(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        if when(*args, **kwargs):
            # a record by its type, a call by the class that made it (SimKernel: a sysfs write)
            _tick(kind, getattr(args[0], "type", "") if kind == "record" and args else cls.__name__)
        return out

    setattr(cls, name, wrapper)


def _wrap_job(cls: type) -> None:
    """Count the service starts the simulated systemd accepted (``start_service`` returned 0:
    the unit is activating and its processes exist; ``systemctl start`` then waits until the
    server is ready, and the kill lands in that wait)."""
    original = cls.start_service

    def wrapper(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        if out[0] == 0:
            _tick("job", "start_service")
        return out

    cls.start_service = wrapper


def _mutating_exec(vmid, argv, *rest, **kw) -> bool:
    return tuple(argv[:2]) in MUTATING_COMMANDS or (bool(argv) and argv[0] in MUTATING_PROGRAMS)


def install() -> None:
    from gputopo.adapters.hostfiles import RealHostFiles
    from gputopo.adapters.proxmox import ProxmoxClient
    from gputopo.apply.journal import Journal
    from gputopo.sim.container import SimExec
    from gputopo.sim.container.lifecycle import Container
    from gputopo.sim.kernel import SimKernel

    _wrap(Journal, "append", "record")
    _wrap(SimKernel, "write", "call")
    _wrap(RealHostFiles, "write", "call")
    _wrap(RealHostFiles, "remove", "call")
    _wrap(SimExec, "push", "call")
    _wrap(SimExec, "run", "call", _mutating_exec)
    _wrap_job(Container)
    # the concrete clients (https, pvesh) each define their own _call
    for sub in ProxmoxClient.__subclasses__():
        if "_call" in sub.__dict__:
            _wrap(sub, "_call", "call", lambda method, *a, **k: method != "GET")

    out = os.environ.get("GPUTOPO_CRASH_COUNT")
    if out:
        atexit.register(lambda: open(out, "w").write(json.dumps({**_count, "trace": _trace})))


if __name__ == "__main__":
    install()
    from gputopo.cli import main

    main(sys.argv[1:])
