"""What every command run in a simulated container shares: its result and its paths."""

from __future__ import annotations

import re
from pathlib import Path

from gputopo.ports import ExecResult
from gputopo.sim.container.lifecycle import Container
from gputopo.sim.container.paths import inside


def result(rc: int, out: str = "", err: str = "") -> ExecResult:
    """A command's exit status, stdout and stderr."""
    return ExecResult(rc=rc, stdout=out, stderr=err)


def container_file(ct: Container, path: str) -> Path:
    """Where ``path``, named inside container ``ct``, lies on the host.

    Raises ValueError when it escapes the container.
    """
    # the host's /proc/driver/nvidia shows through: lxcfs does not virtualise it
    if path.startswith("/proc/driver/nvidia/"):
        return inside(ct.paths.root, path)
    # the container's own processes: the simulator gives each one pid, seen alike from the host
    # and from inside (a real container's pid namespace numbers them anew)
    m = re.match(r"^/proc/(\d+)(/.*)?$", path)
    if m:
        if int(m.group(1)) not in ct.host_pids():
            raise ValueError(f"{path}: no such process in CT {ct.vmid}")
        return inside(ct.paths.root, path)
    return inside(ct.rootfs, path)
