"""The NVIDIA device nodes a container's ``devN`` entries name on the host, and making the
missing ones with ``nvidia-modprobe``.

The nvidia kernel module makes no ``/dev`` node: it only registers its character device region
(open-gpu-kernel-modules ``kernel-open/nvidia/nv.c`` nv_register_chrdev: register_chrdev_region
and cdev_add, no device_create). ``/dev/nvidiaN``, ``/dev/nvidiactl``, ``/dev/nvidia-uvm*``,
``/dev/nvidia-modeset`` and ``/dev/nvidia-caps/*`` come from a distribution's udev rules or
from ``nvidia-modprobe``, which the driver's user space runs on first use (its man page: "used
by user-space NVIDIA driver components to make sure ... the NVIDIA character device files are
present"). So a GPU bound to nvidia has no node until something makes it, and Proxmox refuses a
``devN`` whose path does not exist (pve-container LXC/Tools.pm get_device_mode_and_rdev: "Device
$path does not exist", called by LXC/Config.pm update_pct_config and at the container's start).

The rule gputopo follows: a node a container will be given that is missing is made with the
command of NVIDIA/nvidia-modprobe ``nvidia-modprobe.c`` that makes it (:func:`node_command`):
``-c MINOR`` for ``/dev/nvidiaMINOR`` of a GPU on nvidia, ``-c 255`` for ``/dev/nvidiactl``
(``NV_CTL_DEVICE_NUM``), ``-u -c 0`` for ``/dev/nvidia-uvm`` and ``/dev/nvidia-uvm-tools``,
``-m`` for ``/dev/nvidia-modeset``, ``-f <proc file>`` for a capability node. Apply makes them
before anything stops; a node no command can make (no GPU on nvidia has its minor, a capability
the driver does not list, a host where gputopo runs no command), or one the command did not
make (nvidia-modprobe missing or failing), is refused before anything stops, naming the node
and the fix. A GPU that comes back to nvidia during the apply gets its node right after the
bind, before its ``devN`` is written (:func:`make_nodes` in the container step).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from gputopo.errors import HostCommandError
from gputopo.ports import HostCommandPort

NVIDIA_MODPROBE = "nvidia-modprobe"
CTL_MINOR = 255  # nvidia-modprobe-utils.h NV_CTL_DEVICE_NUM: -c 255 makes /dev/nvidiactl
CAPS_PROC = "proc/driver/nvidia/capabilities"
PARAMS = "proc/driver/nvidia/params"


def modify_allowed(root: str | os.PathLike) -> bool:
    """False when the nvidia module was loaded with ``NVreg_ModifyDeviceFiles=0``
    (``/proc/driver/nvidia/params`` "ModifyDeviceFiles: 0"): nvidia-modprobe then makes no node."""
    try:
        text = (Path(root) / PARAMS).read_text()
    except OSError:
        return True
    m = re.search(r"^ModifyDeviceFiles:\s*(\d+)", text, re.M)
    return m is None or int(m.group(1)) == 1


def is_nvidia_node(path: str) -> bool:
    return path.startswith("/dev/nvidia")


def missing_nodes(root: str | os.PathLike, paths: list[str]) -> list[str]:
    """The NVIDIA device nodes of ``paths`` that do not exist under ``root``, in order."""
    base = Path(root)
    return [
        p for p in dict.fromkeys(paths) if is_nvidia_node(p) and not os.path.lexists(base / p.lstrip("/"))
    ]


def _cap_file(root: str | os.PathLike, minor: int) -> str | None:
    """The driver's ``/proc/driver/nvidia/capabilities`` file whose ``DeviceFileMinor`` is
    ``minor`` (what ``nvidia-modprobe -f`` reads), or None."""
    base = Path(root) / CAPS_PROC
    for p in sorted(base.rglob("*")) if base.is_dir() else []:
        try:
            text = p.read_text() if p.is_file() else ""
        except OSError:
            continue
        m = re.search(r"^DeviceFileMinor:\s*(\d+)", text, re.M)
        if m and int(m.group(1)) == minor:
            return "/" + str(p.relative_to(root)).replace(os.sep, "/")
    return None


def node_command(path: str, minors: dict[int, str], root: str | os.PathLike) -> list[str] | None:
    """The ``nvidia-modprobe`` argv that makes ``path``, or None when none can.

    ``minors``: minor -> address of the GPUs on nvidia now (``/dev/nvidiaN`` is made only for
    one of them: a node of a GPU elsewhere would give the container nothing it can use)."""
    name = path.removeprefix("/dev/")
    if name == "nvidiactl":
        return [NVIDIA_MODPROBE, "-c", str(CTL_MINOR)]
    if name in ("nvidia-uvm", "nvidia-uvm-tools"):
        return [NVIDIA_MODPROBE, "-u", "-c", "0"]
    if name == "nvidia-modeset":
        return [NVIDIA_MODPROBE, "-m"]
    m = re.fullmatch(r"nvidia(\d+)", name)
    if m:
        return [NVIDIA_MODPROBE, "-c", m.group(1)] if int(m.group(1)) in minors else None
    m = re.fullmatch(r"nvidia-caps/nvidia-cap(\d+)", name)
    if m:
        proc = _cap_file(root, int(m.group(1)))
        return [NVIDIA_MODPROBE, "-f", proc] if proc else None
    return None


def refusal(path: str, who: str, argv: list[str] | None, minors: dict[int, str], can_run: bool) -> str | None:
    """The refusal of missing node ``path`` (``who`` names it) when this apply cannot make it:
    no command makes it (``argv`` None) or no command runs on this host; None when it can."""
    if argv is None:
        m = re.fullmatch(r"/dev/nvidia(\d+)", path)
        if m:
            why = f"no GPU on the nvidia driver has minor {m.group(1)}"
        elif path.startswith("/dev/nvidia-caps/"):
            why = (
                "the nvidia driver lists no capability with its minor under /proc/driver/nvidia/capabilities"
            )
        else:
            why = "nvidia-modprobe does not make it"
        return (
            f"{path} does not exist and {why} ({who} names it; Proxmox refuses a devN whose node is "
            "missing): bind its GPU to nvidia or remove that entry"
        )
    if not can_run:
        return (
            f"{path} does not exist ({who} names it; the nvidia driver makes no node): run "
            f"'{' '.join(argv)}' on the host, then apply again"
        )
    return None


def make_nodes(
    host: HostCommandPort | None,
    root: str | os.PathLike,
    wanted: dict[str, str],
    minors: dict[int, str],
    timeout: float,
) -> tuple[list[str], list[str]]:
    """Make the missing nodes of ``wanted`` (path -> who needs it, e.g. ``CT 101 dev4``) with
    nvidia-modprobe through ``host``, each command once. Returns (what was made, one line each;
    the nodes still missing, one line each naming the node, who needs it and the fix)."""
    made: list[str] = []
    problems: list[str] = []
    ran: dict[tuple[str, ...], str] = {}  # argv -> '' (it ran) or why it failed
    for path in missing_nodes(root, list(wanted)):
        who = wanted[path]
        argv = node_command(path, minors, root)
        if argv is None or host is None:  # refusal() names the node and the fix
            problems.append(refusal(path, who, argv, minors, host is not None) or path)
            continue
        cmd = " ".join(argv)
        key = tuple(argv)
        if key not in ran:
            try:
                res = host.run(argv, timeout)
                err = res.stderr.strip()
                ran[key] = "" if res.rc == 0 else f"exit {res.rc}" + (f": {err}" if err else "")
            except HostCommandError as e:
                ran[key] = e.reason
        if not missing_nodes(root, [path]):
            made.append(f"made {path} for {who} ({cmd})")
            continue
        failed = ran[key] or "it exited 0 but made no node"
        fix = "install nvidia-modprobe or make the node with the driver's udev rules"
        if not modify_allowed(root):
            # nvidia-modprobe-utils.c mknod_helper l.566-574: with ModifyDeviceFiles 0 it makes
            # nothing and fails silently when the node is missing
            failed += "; the nvidia module has ModifyDeviceFiles: 0, nvidia-modprobe makes no node"
            fix = "make the node with the driver's udev rules (or load nvidia with NVreg_ModifyDeviceFiles=1)"
        problems.append(
            f"{path} does not exist and '{cmd}' did not make it ({failed}); {who} names it: {fix}, then apply again"
        )
    return made, problems
