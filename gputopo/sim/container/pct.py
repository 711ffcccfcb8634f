"""``pct exec`` and ``pct push`` on the simulated node: :class:`SimExec`, an ExecPort.

It answers as a real node does: a container runs commands only while Proxmox says it runs
(:mod:`gputopo.sim.state`); otherwise ``pct`` exits 255 with ``container '101' not running!``.
``nvidia-smi``, ``systemctl``, ``cat``, ``test``, ``rm``, ``mkdir``, ``rmdir``, ``ls /dev`` and ``true``
are implemented (an unknown command exits 127); ``pct push`` writes a file but never creates
its directory, as pct does.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gputopo.errors import ExecError
from gputopo.ports import ExecResult
from gputopo.sim import state
from gputopo.sim.container.coreutils import cat, ls_dev, mkdir, rm, rmdir, test
from gputopo.sim.container.faults import break_container, heal_container
from gputopo.sim.container.journal import journalctl
from gputopo.sim.container.lifecycle import Container
from gputopo.sim.container.nvidia_smi import nvidia_smi
from gputopo.sim.container.paths import SimPaths, inside
from gputopo.sim.container.shell import result
from gputopo.sim.container.systemctl import systemctl
from gputopo.sim.files import atomic_write

NOT_RUNNING = "container '{vmid}' not running!\n"
NO_CONFIG = "Configuration file 'nodes/{node}/lxc/{vmid}.conf' does not exist\n"


class SimExec:
    """ExecPort over the simulated containers of the simulated host in ``sim_dir``."""

    def __init__(self, sim_dir: str | os.PathLike):
        self.sim_dir = Path(sim_dir)
        self.paths = SimPaths(self.sim_dir)

    def container(self, vmid: int) -> Container:
        return Container(self.sim_dir, vmid)

    def break_(self, vmid: int, what: str, **params: Any) -> None:
        """Break ``what`` in container ``vmid`` (see :func:`break_container`)."""
        break_container(self.sim_dir, vmid, what, **params)

    def heal(self, vmid: int, what: str | None = None) -> None:
        """Undo a fault (all when ``what`` is None)."""
        heal_container(self.sim_dir, vmid, what)

    def _pct_problem(self, vmid: int) -> str | None:
        if not self.paths.lxc_conf(vmid).is_file():
            return NO_CONFIG.format(node=self.paths.node(), vmid=vmid)
        if state.guest_status(self.paths.run, "lxc", vmid) != "running":
            return NOT_RUNNING.format(vmid=vmid)
        return None

    def run(self, vmid: int, argv: list[str], timeout: float, input: str | None = None) -> ExecResult:
        """Run ``argv`` in container ``vmid`` as ``pct exec`` would; return its result.

        pct's own failures (no config, container not running) come back as exit 255 with
        pct's message on stderr; an unknown command as exit 127. Never blocks.
        """
        problem = self._pct_problem(vmid)
        if problem:
            return result(255, err=problem)
        if not argv:
            return result(255, err="missing command\n")
        ct = self.container(vmid)
        cmd, args = os.path.basename(argv[0]), list(argv[1:])
        if cmd == "nvidia-smi":
            return nvidia_smi(ct, args)
        if cmd == "systemctl":
            return systemctl(ct, args)
        if cmd == "cat":
            return cat(ct, args)
        if cmd == "journalctl":
            return journalctl(ct.paths.run, ct.vmid, args)
        if cmd in ("test", "["):
            return test(ct, [a for a in args if a != "]"])
        if cmd == "ls" and args == ["/dev"]:
            return ls_dev(ct)
        if cmd == "true":
            return result(0)
        if cmd == "rm":
            return rm(ct, args)
        if cmd == "mkdir":
            return mkdir(ct, args)
        if cmd == "rmdir":
            return rmdir(ct, args)
        return result(127, err=f'lxc-attach: {vmid}: Failed to exec "{argv[0]}": No such file or directory\n')

    def push(self, vmid: int, path: str, content: str, mode: int = 0o644) -> None:
        """Write ``path`` inside container ``vmid`` as ``pct push --perms`` would.

        Raises :class:`ExecError` (rc 255, pct's message) when the container has no config or
        is not running, when ``path`` escapes the container, and when its directory does not
        exist there: pct creates the file only (``create_file``), never its parents.
        """
        argv = ["pct", "push", str(vmid), path]
        if not self.paths.lxc_conf(vmid).is_file():
            raise ExecError(vmid, argv, 255, NO_CONFIG.format(node=self.paths.node(), vmid=vmid))
        if state.guest_status(self.paths.run, "lxc", vmid) != "running":
            raise ExecError(vmid, argv, 255, "can only push files to a running CT\n")
        try:
            target = inside(self.paths.rootfs(vmid), path)
        except ValueError as e:
            raise ExecError(vmid, argv, 255, str(e)) from None
        if not target.parent.is_dir():
            raise ExecError(vmid, argv, 255, f"failed to create file: {path}: No such file or directory\n")
        atomic_write(target, content, mode)
