"""Commands on a simulated host itself: ``update-initramfs``, ``proxmox-boot-tool``,
``nvidia-modprobe`` and ``nvidia-smi``.

Each run is recorded in ``run/host-commands.json`` (argv and time) so a test sees what was run.
``update-initramfs -u`` copies what initramfs-tools copies of the boot configuration, the
``etc/modprobe.d`` and ``etc/modules-load.d`` files, into ``run/initramfs.json``: the initramfs
the next boot will load. ``proxmox-boot-tool refresh`` fails as the real one does on a host
that does not use it (no ``etc/kernel/proxmox-boot-uuids``; proxmox-kernel-helper's
``proxmox-boot-tool``: "E: /etc/kernel/proxmox-boot-uuids does not exist.").

The NVIDIA character device files exist only once something makes them: the kernel module
registers its major and makes no node (see :mod:`gputopo.sim.kernel.attach`). ``nvidia-modprobe``
(NVIDIA/nvidia-modprobe, ``nvidia-modprobe.c`` main and ``modprobe-utils/nvidia-modprobe-utils.c``)
makes them as its options say: ``-c N`` ``/dev/nvidiaN`` (``-c 255``: ``/dev/nvidiactl``,
``assign_device_file_name`` in ``nvidia-modprobe-utils.h``) after loading nvidia; ``-u -c N``
``/dev/nvidia-uvm`` (minor N) and ``/dev/nvidia-uvm-tools`` (N + 1, ``nvidia_uvm_mknod``);
``-m`` ``/dev/nvidia-modeset``; ``-f PROC`` ``/dev/nvidia-caps/nvidia-cap<DeviceFileMinor of
PROC>`` (``nvidia_cap_mknod``, only below ``/proc/driver/nvidia``). ``mknod_helper`` does not
ask whether a GPU has the minor. It exits 1 without a word when a step fails (main returns
``!ret``), e.g. when the nvidia module is not loaded here (no ``sys/bus/pci/drivers/nvidia``:
the simulator loads no module). ``nvidia-smi`` makes ``/dev/nvidiactl`` and the node of every
GPU on nvidia, as NVML does through nvidia-modprobe on first use (CUDA Installation Guide for
Linux, "Device Node Verification": applications "will normally automatically create these files
if they are missing using the setuid nvidia-modprobe tool"). :meth:`SimHostCommands.uninstall`
takes a command away (a host without the NVIDIA user-space tools).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from pathlib import Path

from gputopo.errors import HostCommandError
from gputopo.ports import ExecResult
from gputopo.sim import state
from gputopo.sim.hostroot.drivers import NVIDIA_CAPS_MAJOR, NVIDIA_MAJOR, NVIDIA_UVM_MAJOR
from gputopo.sim.kernel.nvidia import parse_minor

COMMANDS = "host-commands"
INITRAMFS = "initramfs"
UNINSTALLED = "host-commands-missing"
NVIDIA_CTL_MINOR, NVIDIA_MODESET_MINOR = 255, 254  # nvidia-modprobe-utils.h NV_CTL_DEVICE_NUM...
PROC_PREFIX = "/proc/driver/nvidia"


class SimHostCommands:
    """HostCommandPort of the simulated host in ``sim_dir``."""

    def __init__(self, sim_dir: str | os.PathLike):
        self.dir = Path(sim_dir)
        self.run_dir = self.dir / "run"
        self.root = self.dir / "root"

    def uninstall(self, name: str) -> None:
        """Take command ``name`` off this host: running it fails as a missing program does."""
        with state.locked(self.run_dir, COMMANDS):
            gone = state.read_state(self.run_dir, UNINSTALLED, []) or []
            state.write_state(self.run_dir, UNINSTALLED, sorted({*gone, name}))

    def ran(self) -> list[list[str]]:
        """The argv of every command run on this host, in order."""
        return [r["argv"] for r in state.read_state(self.run_dir, COMMANDS, []) or []]

    def run(self, argv: list[str], timeout: float) -> ExecResult:
        with state.locked(self.run_dir, COMMANDS):
            ran = state.read_state(self.run_dir, COMMANDS, []) or []
            ran.append({"argv": list(argv), "t": time.time()})
            state.write_state(self.run_dir, COMMANDS, ran)
        name = argv[0] if argv else ""
        if name in (state.read_state(self.run_dir, UNINSTALLED, []) or []):
            raise HostCommandError(list(argv), "not found (is this the Proxmox node?)")
        if name == "nvidia-modprobe":
            return self._nvidia_modprobe(argv[1:])
        if name == "nvidia-smi":
            return self._nvidia_smi()
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

    # -- NVIDIA device files ---------------------------------------------------------------------

    def _nvidia_loaded(self) -> bool:
        return (self.root / "sys/bus/pci/drivers/nvidia").is_dir()

    def _mknod(self, name: str, major: int, minor: int) -> None:
        """Make ``dev/<name>`` (a placeholder file, as snapshots hold nodes) and record its
        numbers in ``dev/.devices.json`` where the root keeps them."""
        path = self.root / "dev" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if not os.path.lexists(path):
            path.touch(mode=0o666)
        index = self.root / "dev/.devices.json"
        if index.is_file():
            with contextlib.suppress(ValueError):
                nodes = json.loads(index.read_text())
                nodes[name] = ["c", major, minor]
                index.write_text(json.dumps(nodes, indent=1, sort_keys=True) + "\n")

    def _nvidia_modprobe(self, args: list[str]) -> ExecResult:
        failed = ExecResult(1, "", "")
        minors: list[int] = []
        caps: list[str] = []
        uvm = modeset = False
        it = iter(args)
        for a in it:
            opt, _, val = a.partition("=")
            if opt in ("-c", "--create-nvidia-device-file"):
                val = val or next(it, "")
                if not re.fullmatch(r"\d+", val):
                    return ExecResult(1, "", f"nvidia-modprobe: Invalid argument '{val}' for option '-c'.\n")
                minors.append(int(val))
            elif opt in ("-u", "--unified-memory"):
                uvm = True
            elif opt in ("-m", "--modeset"):
                modeset = True
            elif opt in ("-f", "--nvidia-capability-device-file"):
                caps.append(val or next(it, ""))
            else:
                return ExecResult(1, "", f"nvidia-modprobe: Unrecognized option: '{a}'.\n")
        # every mode loads the nvidia module first (nvidia-uvm and nvidia-modeset need it)
        if not self._nvidia_loaded():
            return failed
        for m in minors:
            if uvm:
                self._mknod("nvidia-uvm", NVIDIA_UVM_MAJOR, m)
                self._mknod("nvidia-uvm-tools", NVIDIA_UVM_MAJOR, m + 1)
            elif m == NVIDIA_CTL_MINOR:
                self._mknod("nvidiactl", NVIDIA_MAJOR, m)
            elif m < NVIDIA_CTL_MINOR:
                self._mknod(f"nvidia{m}", NVIDIA_MAJOR, m)
            else:
                return failed
        if modeset:
            self._mknod("nvidia-modeset", NVIDIA_MAJOR, NVIDIA_MODESET_MINOR)
        for proc in caps:
            if not proc.startswith(PROC_PREFIX + "/") or "./" in proc:
                return failed
            try:
                text = (self.root / proc.lstrip("/")).read_text()
            except OSError:
                return failed
            found = re.search(r"^DeviceFileMinor:\s*(\d+)", text, re.M)
            if found is None:
                return failed
            self._mknod(f"nvidia-caps/nvidia-cap{found.group(1)}", NVIDIA_CAPS_MAJOR, int(found.group(1)))
        return ExecResult(0, "", "")

    def _nvidia_smi(self) -> ExecResult:
        if not self._nvidia_loaded():
            return ExecResult(
                9,
                "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure "
                "that the latest NVIDIA driver is installed and running.\n\n",
                "",
            )
        gpus = self.root / "proc/driver/nvidia/gpus"
        found = []
        for d in sorted(gpus.iterdir()) if gpus.is_dir() else []:
            info = d / "information"
            minor = parse_minor(info.read_text()) if info.is_file() else None
            if minor is not None:
                found.append(minor)
        self._mknod("nvidiactl", NVIDIA_MAJOR, NVIDIA_CTL_MINOR)
        for m in found:
            self._mknod(f"nvidia{m}", NVIDIA_MAJOR, m)
        return ExecResult(0, f"{len(found)} GPU(s) on the nvidia driver\n", "")
