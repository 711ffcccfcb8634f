"""A container's service processes as the host sees them (``<root>/proc/<pid>``).

An active service shows on the host the way a container's processes look from a Proxmox node:
a main process plus one worker per tensor-parallel rank, each with ``comm``, ``cmdline`` and
``cgroup`` (``0::/lxc/<vmid>/ns/system.slice/<unit>``); the workers have ``fd/<n>`` links to
``/dev/nvidiactl``, ``/dev/nvidia-uvm`` and the ``/dev/nvidia<minor>`` of every GPU the service
uses. apply's preflight tells container processes from foreign holders by that cgroup, and the
simulated kernel blocks an unbind while such a link exists. They vanish when the service stops
or the container shuts down.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

# Host PIDs of simulated container processes start here, clear of a fixture's own proc entries.
HOST_PID_BASE = 200000
# Python's multiprocessing "spawn" start method: how each tensor-parallel worker's cmdline reads.
SPAWN_ARGS = (
    "-c",
    "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5, pipe_handle=7)",
    "--multiprocessing-fork",
)


def container_cgroup(vmid: int, unit: str) -> str:
    """``/proc/<pid>/cgroup`` of a service's process in a Proxmox container (cgroup v2): PVE puts
    the container's own tree under ``/lxc/<vmid>/ns`` (``lxc.cgroup.dir.container.inner``)."""
    return f"0::/lxc/{vmid}/ns/system.slice/{unit}\n"


def process_comm(argv: list[str]) -> str:
    """The kernel's ``comm`` of a process started as ``argv``: the executable's name, 15 chars."""
    return os.path.basename(argv[0])[:15] if argv else "?"


def host_process_plan(vmid: int, unit: str, argv: list[str], tp: int, nodes: list[str]) -> list[dict]:
    """The host-visible processes of a service: ``[{comm, cmdline, cgroup, fds}]``.

    The main process holds no device; each of the ``tp`` workers holds the control nodes and
    every GPU node in ``nodes``, because CUDA opens every device it can see when it initialises.
    """
    cgroup = container_cgroup(vmid, unit)
    comm = process_comm(argv)
    gpu_fds = ["/dev/nvidiactl", "/dev/nvidia-uvm"] + list(nodes)
    procs = [{"comm": comm, "cmdline": list(argv), "cgroup": cgroup, "fds": []}]
    for _ in range(tp):
        procs.append(
            {
                "comm": comm,
                "cmdline": [argv[0] if argv else "python3", *SPAWN_ARGS],
                "cgroup": cgroup,
                "fds": gpu_fds,
            }
        )
    return procs


def spawn(root: Path, vmid: int, unit: str, argv: list[str], tp: int, nodes: list[str]) -> list[int]:
    """Write the ``proc/<pid>`` entries of ``unit``'s processes under ``root``; return their PIDs.

    PIDs start at ``HOST_PID_BASE + vmid * 100`` and skip those already taken.
    """
    proc = root / "proc"
    taken = {int(p.name) for p in proc.glob("[0-9]*") if p.name.isdigit()} if proc.is_dir() else set()
    pids, pid = [], HOST_PID_BASE + vmid * 100
    for spec in host_process_plan(vmid, unit, argv, tp, nodes):
        while pid in taken:
            pid += 1
        taken.add(pid)
        d = proc / str(pid)
        (d / "fd").mkdir(parents=True, exist_ok=True)
        (d / "comm").write_text(spec["comm"] + "\n")
        (d / "cmdline").write_bytes(b"".join(a.encode() + b"\0" for a in spec["cmdline"]))
        (d / "cgroup").write_text(spec["cgroup"])
        for n, target in enumerate(["/dev/null"] * 3 + spec["fds"]):
            os.symlink(target, d / "fd" / str(n))
        pids.append(pid)
    return pids


def reap(root: Path, pids: list[int]) -> None:
    """Remove the ``proc/<pid>`` entries of ``pids`` under ``root``."""
    for pid in pids:
        shutil.rmtree(root / "proc" / str(pid), ignore_errors=True)
