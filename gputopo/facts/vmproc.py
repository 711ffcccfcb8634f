"""A running VM's QEMU process on the host: the CPUs it may run on (edge layer: this is I/O).

qemu-server writes the pid of VM ``<vmid>``'s QEMU to ``/var/run/qemu-server/<vmid>.pid``
(``PVE/QemuServer/Helpers.pm`` ``vm_pidfile_name``; ``/var/run`` is ``/run``) and starts it
under ``taskset --cpu-list --all-tasks <affinity>``; the kernel shows the result as
``Cpus_allowed_list`` in ``/proc/<pid>/status``.
"""

from __future__ import annotations

from pathlib import Path

from gputopo.model.facts import format_cpulist, parse_cpulist


def parse_pidfile(text: str | None) -> int | None:
    """The pid in a pid file (first line); None when there is none."""
    first = (text or "").strip().split("\n")[0].strip()
    return int(first) if first.isdigit() else None


def parse_cpus_allowed(status: str | None) -> str | None:
    """``Cpus_allowed_list`` of ``/proc/<pid>/status`` text, canonical (``64-127,192-255``)."""
    for line in (status or "").splitlines():
        key, _, value = line.partition(":")
        if key == "Cpus_allowed_list":
            try:
                return format_cpulist(parse_cpulist(value.strip()))
            except ValueError:
                return None
    return None


def read_vm_cpus(root: str | Path, vmid: int) -> str | None:
    """The CPUs VM ``vmid``'s QEMU may run on, or None when it is not running (no pid file, no
    process) or the kernel's answer cannot be read."""
    base = Path(root)
    try:
        pid = parse_pidfile((base / "run/qemu-server" / f"{vmid}.pid").read_text())
        if pid is None:
            return None
        return parse_cpus_allowed((base / "proc" / str(pid) / "status").read_text())
    except (OSError, UnicodeDecodeError):
        return None
