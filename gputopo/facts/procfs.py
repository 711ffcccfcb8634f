"""Processes under ``<root>/proc``: who holds device nodes open, and what each holder is.

Reading is separate from parsing: :func:`parse_cgroup_container`, :func:`parse_cmdline` and
:func:`match_fd_links` are pure; the ``read_*`` functions gather what the kernel shows and
never raise for a process that vanishes or denies access mid-scan (it is skipped, or its
unreadable parts come back as None).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from gputopo.facts.files import read_text, stripped
from gputopo.formats.systemd import parse_cmdline
from gputopo.model.facts import Holder

# --- pure parsers ------------------------------------------------------------------------


_LXC_CGROUP_RE = re.compile(r"/lxc(?:\.payload)?[./](\d+)(?:/|$)")


def parse_cgroup_container(text: str) -> int | None:
    """The LXC container a process runs in, from ``/proc/<pid>/cgroup`` text (``0::/lxc/101/ns/..``,
    cgroup v1 ``4:devices:/lxc/101``, or the payload cgroup ``/lxc.payload.101/``); None on the host."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        m = _LXC_CGROUP_RE.search(path)
        if m:
            return int(m.group(1))
    return None


_UNIT_RE = re.compile(r"/([^/]+\.service)(?:/|$)")


def parse_cgroup_unit(text: str) -> str | None:
    """The systemd service a process belongs to, from ``/proc/<pid>/cgroup`` text (the last
    ``<name>.service`` of its path: ``0::/lxc/101/ns/system.slice/sglang.service`` -> ``sglang.service``);
    None when it belongs to none."""
    found = None
    for line in text.splitlines():
        for m in _UNIT_RE.finditer(line.split(":", 2)[-1]):
            found = m.group(1)
    return found


def match_fd_links(
    links: dict[int, list[str]], device_paths: list[str], root: str = "/"
) -> dict[str, list[int]]:
    """Which of ``device_paths`` (host paths like ``/dev/nvidia3``) the fd link targets in
    ``links`` ({pid: [target, ...]}) point at.

    A target is matched as written or with the absolute ``root`` prefix removed (a simulated
    host may link into its root); relative targets (``pipe:[1234]``) never match. Returns
    {path: [pid, ...]} holding only the paths that have a holder, pids sorted, no duplicates.
    """
    wanted = {os.path.normpath(p): p for p in device_paths}
    found: dict[str, set[int]] = {}
    for pid, targets in links.items():
        for target in targets:
            if root != "/" and target.startswith(root + "/"):
                target = target[len(root) :]
            key = wanted.get(os.path.normpath(target)) if target.startswith("/") else None
            if key is not None:
                found.setdefault(key, set()).add(pid)
    return {k: sorted(v) for k, v in found.items()}


# --- reading -----------------------------------------------------------------------------


def _proc(root: str | Path, pid: int | str, name: str) -> str:
    return os.path.join(str(root), "proc", str(pid), name)


def read_fd_links(root: str | Path) -> dict[int, list[str]]:
    """{pid: [fd link target, ...]} for every process under ``<root>/proc`` whose ``fd/`` can
    be listed; {} when ``<root>/proc`` cannot be listed."""
    proc = os.path.join(str(root), "proc")
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit()]
    except OSError:
        return {}
    out: dict[int, list[str]] = {}
    for pid in pids:
        fd_dir = os.path.join(proc, pid, "fd")
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        targets = []
        for fd in fds:
            try:
                targets.append(os.readlink(os.path.join(fd_dir, fd)))
            except OSError:
                continue
        out[int(pid)] = targets
    return out


def read_comm(root: str | Path, pid: int) -> str | None:
    """``/proc/<pid>/comm`` without its newline; None when unreadable."""
    return stripped(read_text(_proc(root, pid, "comm")))


def read_cmdline(root: str | Path, pid: int) -> str | None:
    """``/proc/<pid>/cmdline`` through :func:`parse_cmdline`; None when unreadable or empty."""
    try:
        with open(_proc(root, pid, "cmdline"), "rb") as f:
            raw = f.read()
    except OSError:
        return None
    return parse_cmdline(raw)


def read_container(root: str | Path, pid: int) -> int | None:
    """The LXC container of process ``pid`` (:func:`parse_cgroup_container` of its
    ``/proc/<pid>/cgroup``); None on the host or when unreadable."""
    return parse_cgroup_container(read_text(_proc(root, pid, "cgroup")) or "")


def read_holder(root: str | Path, pid: int) -> Holder:
    """What ``<root>/proc/<pid>`` says about process ``pid``; missing parts are None (``comm``: ``?``)."""
    cgroup = read_text(_proc(root, pid, "cgroup")) or ""
    return Holder(
        pid=pid,
        comm=read_comm(root, pid) or "?",
        cmdline=read_cmdline(root, pid),
        container=parse_cgroup_container(cgroup),
        unit=parse_cgroup_unit(cgroup),
    )


def read_holders(root: str | Path, device_paths: list[str]) -> dict[str, list[Holder]]:
    """Which processes hold the given device nodes open, from ``<root>/proc/<pid>/fd/*``.

    ``device_paths`` are host paths like ``/dev/nvidia3`` (see :func:`match_fd_links`).
    Returns {path: [Holder, ...]} holding only the paths that have a holder, each list sorted
    by pid. Raises nothing.
    """
    root_s = os.path.abspath(str(root))
    held = match_fd_links(read_fd_links(root_s), device_paths, root_s)
    holders = {pid: read_holder(root_s, pid) for pid in sorted({p for pids in held.values() for p in pids})}
    return {path: [holders[pid] for pid in pids] for path, pids in held.items()}


def find_holders(root: str | Path, device_paths: list[str]) -> dict[str, list[tuple[int, str]]]:
    """:func:`read_holders` as {path: [(pid, comm), ...]}."""
    return {path: [(h.pid, h.comm) for h in hs] for path, hs in read_holders(root, device_paths).items()}
