"""What every command run in a simulated container shares: its result and its paths."""

from __future__ import annotations

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
    return inside(ct.rootfs, path)
