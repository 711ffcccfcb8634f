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
the simulator loads no module), when ``/proc/devices`` lists no ``nvidia-uvm`` or
``nvidia-caps`` major (their majors are dynamic: nvidia_get_chardev_major reads them there), or
when the module was loaded with ``NVreg_ModifyDeviceFiles=0`` (``/proc/driver/nvidia/params``
"ModifyDeviceFiles: 0"; a capability file's own ``DeviceFileModify``): mknod_helper then makes
nothing and fails unless the node is already there. ``nvidia-smi`` makes ``/dev/nvidiactl`` and the node of every
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
from gputopo.sim.hostroot.drivers import NVIDIA_MAJOR
from gputopo.sim.kernel.nvidia import chardev_major, modification_allowed, parse_minor

COMMANDS = "host-commands"
INITRAMFS = "initramfs"
UNINSTALLED = "host-commands-missing"
NVIDIA_CTL_MINOR, NVIDIA_MODESET_MINOR = 255, 254  # nvidia-modprobe-utils.h NV_CTL_DEVICE_NUM...
PROC_PREFIX = "/proc/driver/nvidia"
PARAMS = "proc/driver/nvidia/params"


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

    def _mknod(self, name: str, major: int, minor: int, proc: str | None = PARAMS) -> bool:
        """Make ``dev/<name>`` (a placeholder file, as snapshots hold nodes) and record its
        numbers in ``dev/.devices.json`` where the root keeps them. False when it may not:
        mknod_helper (nvidia-modprobe-utils.c l.549-640) reads ``proc`` (the driver's params or
        a capability file; None: no file, as for nvidia-uvm) and, when its
        ``ModifyDeviceFiles``/``DeviceFileModify`` is not 1, makes nothing and succeeds only
        when the node is already there (symlink_char_dev l.478: stat of the node)."""
        path = self.root / "dev" / name
        if proc is not None and not modification_allowed(self._read(proc)):
            return os.path.lexists(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        if not os.path.lexists(path):
            path.touch(mode=0o666)
        index = self.root / "dev/.devices.json"
        if index.is_file():
            with contextlib.suppress(ValueError):
                nodes = json.loads(index.read_text())
                nodes[name] = ["c", major, minor]
                index.write_text(json.dumps(nodes, indent=1, sort_keys=True) + "\n")
        return True

    def _read(self, rel: str) -> str | None:
        try:
            return (self.root / rel.lstrip("/")).read_text()
        except OSError:
            return None

    def _major(self, name: str) -> int | None:
        """A dynamic major as nvidia-modprobe finds it: in ``/proc/devices``."""
        return chardev_major(self._read("proc/devices"), name)

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
        uvm_major = self._major("nvidia-uvm") if uvm else None
        for m in minors:
            # each step that fails ends the run, exit 1 and no word (nvidia-modprobe.c main: !ret)
            if uvm:
                ok = uvm_major is not None and (
                    self._mknod("nvidia-uvm", uvm_major, m, None)
                    and self._mknod("nvidia-uvm-tools", uvm_major, m + 1, None)
                )
            elif m == NVIDIA_CTL_MINOR:
                ok = self._mknod("nvidiactl", NVIDIA_MAJOR, m)
            else:
                ok = m < NVIDIA_CTL_MINOR and self._mknod(f"nvidia{m}", NVIDIA_MAJOR, m)
            if not ok:
                return failed
        if modeset and not self._mknod("nvidia-modeset", NVIDIA_MAJOR, NVIDIA_MODESET_MINOR):
            return failed
        caps_major = self._major("nvidia-caps") if caps else None
        for proc in caps:
            if not proc.startswith(PROC_PREFIX + "/") or "./" in proc or caps_major is None:
                return failed
            text = self._read(proc)
            found = re.search(r"^DeviceFileMinor:\s*(\d+)", text or "", re.M)
            if found is None:
                return failed
            minor = int(found.group(1))
            if not self._mknod(f"nvidia-caps/nvidia-cap{minor}", caps_major, minor, proc):
                return failed
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
        # NVML runs nvidia-modprobe, which makes nothing where the params forbid it
        self._mknod("nvidiactl", NVIDIA_MAJOR, NVIDIA_CTL_MINOR)
        for m in found:
            self._mknod(f"nvidia{m}", NVIDIA_MAJOR, m)
        return ExecResult(0, f"{len(found)} GPU(s) on the nvidia driver\n", "")
