"""A Proxmox task's outcome: its ``exitstatus`` and the lines of its log. Pure, no I/O.

pve-common ``RESTEnvironment.pm`` ``fork_worker`` ends every task log with ``TASK OK``,
``TASK WARNINGS: N`` (the worker called ``RESTEnvironment::warn``/``log_warn`` N times, each
printing ``WARN: <message>`` into the log) or ``TASK ERROR: <message>``; ``UPID.pm``
``read_status`` turns that line into the ``exitstatus`` of the task status: ``OK``,
``WARNINGS: N``, the error message, or ``unexpected status``. ``status_is_error`` counts ``OK``
and ``WARNINGS: N`` as success.
"""

from __future__ import annotations

import re

_WARNINGS_RE = re.compile(r"^WARNINGS: (\d+)$")
_WARN_PREFIX = "WARN: "
# qemu-server QemuServer.pm _do_vm_stop with forceStop, after the shutdown timeout passed
QEMU_FORCED = (
    "VM still running - terminating now with SIGTERM",
    "VM quit/powerdown failed - terminating now with SIGTERM",
)


def exitstatus_ok(exitstatus: str | None) -> bool:
    """Whether a stopped task succeeded: ``OK`` or ``WARNINGS: N`` (UPID.pm ``status_is_error``)."""
    return exitstatus == "OK" or bool(exitstatus and _WARNINGS_RE.match(exitstatus))


def parse_task_warnings(lines: list[str]) -> list[str]:
    """The messages of the ``WARN: <message>`` lines of a task log, in order (the prefix
    dropped). A message that spans lines keeps only its first: the log does not say where it
    ends."""
    return [ln[len(_WARN_PREFIX) :].strip() for ln in lines if ln.startswith(_WARN_PREFIX)]


def qemu_forced_stop(lines: list[str]) -> bool:
    """Whether a QEMU shutdown task's log says the VM was terminated by force."""
    return any(ln.strip() in QEMU_FORCED for ln in lines)
