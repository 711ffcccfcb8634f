"""Commands on a simulated host itself: ``update-initramfs`` and ``proxmox-boot-tool``.

Each run is recorded in ``run/host-commands.json`` (argv and time) so a test sees what was run.
``update-initramfs -u`` copies what initramfs-tools copies of the boot configuration, the
``etc/modprobe.d`` and ``etc/modules-load.d`` files, into ``run/initramfs.json``: the initramfs
the next boot will load. ``proxmox-boot-tool refresh`` fails as the real one does on a host
that does not use it (no ``etc/kernel/proxmox-boot-uuids``; proxmox-kernel-helper's
``proxmox-boot-tool``: "E: /etc/kernel/proxmox-boot-uuids does not exist.").
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from gputopo.errors import HostCommandError
from gputopo.ports import ExecResult
from gputopo.sim import state

COMMANDS = "host-commands"
INITRAMFS = "initramfs"


class SimHostCommands:
    """HostCommandPort of the simulated host in ``sim_dir``."""

    def __init__(self, sim_dir: str | os.PathLike):
        self.dir = Path(sim_dir)
        self.run_dir = self.dir / "run"
        self.root = self.dir / "root"

    def run(self, argv: list[str], timeout: float) -> ExecResult:
        with state.locked(self.run_dir, COMMANDS):
            ran = state.read_state(self.run_dir, COMMANDS, []) or []
            ran.append({"argv": list(argv), "t": time.time()})
            state.write_state(self.run_dir, COMMANDS, ran)
        name = argv[0] if argv else ""
        if name == "update-initramfs":
            return self._initramfs(argv)
        if name == "proxmox-boot-tool":
            if not (self.root / "etc/kernel/proxmox-boot-uuids").is_file():
                return ExecResult(2, "", "E: /etc/kernel/proxmox-boot-uuids does not exist.\n")
            return ExecResult(
                0,
                "Running hook script 'proxmox-auto-removal'..\n"
                "Copying and configuring kernels on /dev/disk/by-uuid/0000-0001\n",
                "",
            )
        raise HostCommandError(list(argv), "not found (is this the Proxmox node?)")

    def _initramfs(self, argv: list[str]) -> ExecResult:
        if "-u" not in argv:
            return ExecResult(1, "", "Usage: update-initramfs {-c|-d|-u} [-k version] [-v] [-b directory]\n")
        files: dict[str, str] = {}
        for sub in ("etc/modprobe.d", "etc/modules-load.d"):
            d = self.root / sub
            for p in sorted(d.glob("*.conf")) if d.is_dir() else []:
                files[f"{sub}/{p.name}"] = p.read_text()
        state.write_state(self.run_dir, INITRAMFS, {"files": files, "t": time.time()})
        kernel = (
            (self.root / "proc/sys/kernel/osrelease").read_text().strip()
            if (self.root / "proc/sys/kernel/osrelease").is_file()
            else "unknown"
        )
        return ExecResult(0, f"update-initramfs: Generating /boot/initrd.img-{kernel}\n", "")
