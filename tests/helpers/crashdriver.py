"""Runs the ``gputopo`` command line in this process and SIGKILLs it at an exact point.

``GPUTOPO_CRASH_AT=record:N`` kills the process right after the N-th journal record is on disk
(fsynced); ``call:N`` right after the N-th call that changes the host returned: a sysfs write, a
Proxmox API call other than a GET (a guest start or stop is killed once its task was accepted),
a command in the container that changes something (``systemctl start|stop|restart|daemon-reload``,
``rm``, ``mkdir``, ``rmdir``), ``pct push``, a host file written or removed; ``job:N`` once the
simulated container's systemd took the N-th service start (its processes hold their GPUs) while
``systemctl start`` still waits for the server to be ready; ``temp:N`` inside the N-th host file
write, after its temp file beside the target was made and before the rename. No timing is involved:
the point is counted, not polled. ``GPUTOPO_CRASH_COUNT=FILE`` writes how many records and calls
the run made, and the order they came in (JSON), when it ends normally, so a test can enumerate
every point; a Proxmox call is named there by its method and path (``POST .../status/shutdown``:
the point where a guest's shutdown task runs).

``GPUTOPO_CRASH_SIGNAL=TERM|INT|HUP`` sends that signal at the point instead of SIGKILL (what
systemd, Ctrl-C and a dropped ssh session send): the process goes on to do what it does with one.

Three faults have no switch in the simulator because they belong to the host rather than to
Proxmox, the kernel or the container; each hits the first matching call only, as the simulator's
own faults do (``count=1``): ``GPUTOPO_FAIL_FILE=PATH`` makes writing or removing that host file
fail with EROFS (a read-only /etc), ``GPUTOPO_FAIL_PUSH=PATH`` makes ``pct push`` of that file fail
(the container's disk is full), ``GPUTOPO_FAIL_STOP=UNIT`` makes ``systemctl stop UNIT`` exit 1
the way a stop job that was cancelled does.

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
_count = {"record": 0, "call": 0, "job": 0, "temp": 0}
_at = os.environ.get("GPUTOPO_CRASH_AT", "")
_kind, _, _n = _at.partition(":")
_limit = int(_n) if _n.isdigit() else 0
_signal = getattr(signal, "SIG" + os.environ.get("GPUTOPO_CRASH_SIGNAL", "KILL"))


_trace: list[tuple[str, int, int]] = []  # (record type or calling class, records so far, calls so far)


def _tick(kind: str, what: str = "") -> None:
    with _lock:
        _count[kind] += 1
        _trace.append((what or kind, _count["record"], _count["call"]))
        if kind == _kind and _count[kind] == _limit:
            os.kill(os.getpid(), _signal)


def _wrap(cls: type, name: str, kind: str, when=lambda *a, **k: True, what=None) -> None:
    original = getattr(cls, name)

    def wrapper(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        if when(*args, **kwargs):
            # a record by its type, a call by the class that made it (SimKernel: a sysfs write),
            # or as ``what`` names it
            if what is not None:
                _tick(kind, what(*args))
            else:
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


def _wrap_temp() -> None:
    """Count the temp files the host files writer made for a write (not the ones ``unwritable``
    makes and removes at once): a kill there leaves ``.<name>.XXXXXXXX`` beside the target."""
    import tempfile
    import types

    from gputopo.adapters import hostfiles

    def mkstemp(*args, **kwargs):
        out = tempfile.mkstemp(*args, **kwargs)
        if sys._getframe(1).f_code.co_name == "write":
            _tick("temp", "mkstemp")
        return out

    hostfiles.tempfile = types.SimpleNamespace(mkstemp=mkstemp)


def _mutating_exec(vmid, argv, *rest, **kw) -> bool:
    return tuple(argv[:2]) in MUTATING_COMMANDS or (bool(argv) and argv[0] in MUTATING_PROGRAMS)


_failed: set[str] = set()


def _once(name: str, value: str) -> bool:
    """True for the first call that names ``value`` when ``GPUTOPO_<name>`` is ``value``."""
    with _lock:
        if not value or os.environ.get(f"GPUTOPO_{name}") != value or name in _failed:
            return False
        _failed.add(name)
        return True


def _install_faults() -> None:
    import errno

    from gputopo.adapters.hostfiles import RealHostFiles
    from gputopo.errors import ExecError
    from gputopo.ports import ExecResult
    from gputopo.sim.container import SimExec

    write, remove, push, run = RealHostFiles.write, RealHostFiles.remove, SimExec.push, SimExec.run

    def readonly(path: str) -> None:
        if _once("FAIL_FILE", str(path)):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

    def failing_write(self, path, *args, **kwargs):
        readonly(path)
        return write(self, path, *args, **kwargs)

    def failing_remove(self, path, *args, **kwargs):
        readonly(path)
        return remove(self, path, *args, **kwargs)

    def failing_push(self, vmid, path, *args, **kwargs):
        if _once("FAIL_PUSH", str(path)):
            raise ExecError(
                vmid, ["pct", "push", str(vmid), path], 1, "write failed: No space left on device"
            )
        return push(self, vmid, path, *args, **kwargs)

    def failing_run(self, vmid, argv, *args, **kwargs):
        if argv[:2] == ["systemctl", "stop"] and _once("FAIL_STOP", argv[-1]):
            return ExecResult(1, "", f"Job for {argv[-1]} canceled.\n")
        return run(self, vmid, argv, *args, **kwargs)

    RealHostFiles.write, RealHostFiles.remove = failing_write, failing_remove
    SimExec.push, SimExec.run = failing_push, failing_run


def install() -> None:
    from gputopo.adapters.hostfiles import RealHostFiles
    from gputopo.adapters.proxmox import ProxmoxClient
    from gputopo.apply.journal import Journal
    from gputopo.sim.container import SimExec
    from gputopo.sim.container.lifecycle import Container
    from gputopo.sim.kernel import SimKernel

    _install_faults()  # below the counting wrappers: a failed call is no change, not a kill point
    _wrap(Journal, "append", "record")
    _wrap(SimKernel, "write", "call")
    _wrap(RealHostFiles, "write", "call")
    _wrap(RealHostFiles, "remove", "call")
    _wrap(SimExec, "push", "call")
    _wrap(SimExec, "run", "call", _mutating_exec)
    _wrap_job(Container)
    _wrap_temp()
    # the concrete clients (https, pvesh) each define their own _call
    for sub in ProxmoxClient.__subclasses__():
        if "_call" in sub.__dict__:
            _wrap(
                sub,
                "_call",
                "call",
                lambda method, *a, **k: method != "GET",
                lambda method, path, *a: f"{method} {path}",
            )

    out = os.environ.get("GPUTOPO_CRASH_COUNT")
    if out:
        atexit.register(lambda: open(out, "w").write(json.dumps({**_count, "trace": _trace})))


if __name__ == "__main__":
    install()
    from gputopo.cli import main

    main(sys.argv[1:])
