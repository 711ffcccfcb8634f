"""After boot persistence changed: rebuild what the next boot reads.

The modprobe.d hook and the modules-load.d list are copied into the initramfs, so a change to
them only takes effect at boot once the initramfs is rebuilt (``update-initramfs -u -k all``).
A host that boots through ``proxmox-boot-tool`` (its ESPs are listed in
``/etc/kernel/proxmox-boot-uuids``) also needs the rebuilt initramfs copied to every ESP
(``proxmox-boot-tool refresh``). Apply says so, or runs them when asked, through the
:class:`gputopo.ports.HostCommandPort`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gputopo.errors import ConfigError, HostCommandError
from gputopo.ports import HostFilesPort, Ports

UPDATE_INITRAMFS = ["update-initramfs", "-u", "-k", "all"]
BOOT_TOOL_REFRESH = ["proxmox-boot-tool", "refresh"]
BOOT_UUIDS = "etc/kernel/proxmox-boot-uuids"
TIMEOUT = 900.0  # an initramfs per installed kernel: minutes on a slow disk


@dataclass
class BootRefresh:
    commands: list[list[str]]
    ran: bool = False

    def text(self) -> str:
        return " && ".join(" ".join(c) for c in self.commands)


def changes_boot(actions: list[Any]) -> bool:
    """Whether any of ``actions`` changes what the host reads at boot."""
    return any(getattr(a, "changes_boot", False) for a in actions)


def boot_commands(files: HostFilesPort) -> list[list[str]]:
    """The commands that bring the next boot up to date on the host ``files`` reads."""
    cmds = [list(UPDATE_INITRAMFS)]
    if files.read(BOOT_UUIDS) is not None:
        cmds.append(list(BOOT_TOOL_REFRESH))
    return cmds


def refresh_boot(
    ports: Ports, note: Callable[[str], None] = lambda text: None, timeout: float = TIMEOUT
) -> BootRefresh:
    """Run :func:`boot_commands` through ``ports.host``, in order, each line of output to ``note``.

    Raises ConfigError when the ports cannot run host commands (a ``--root`` other than /),
    HostCommandError naming the command that failed.
    """
    if ports.host is None:
        raise ConfigError("cannot run commands on this host (--root is not /): run them on the node")
    refresh = BootRefresh(boot_commands(ports.files))
    for argv in refresh.commands:
        note(f"running {' '.join(argv)}")
        res = ports.host.run(argv, timeout)
        for line in (res.stdout + res.stderr).splitlines():
            note(f"  {line}")
        if res.rc != 0:
            tail = (res.stderr.strip() or res.stdout.strip()).splitlines()
            raise HostCommandError(argv, f"exited {res.rc}" + (f": {tail[-1]}" if tail else ""))
    refresh.ran = True
    return refresh


def after_apply(
    result: Any, ports: Ports, refresh: bool, note: Callable[[str], None] = lambda text: None
) -> BootRefresh | None:
    """What the next boot needs after an apply that ended ``result`` (an ApplyResult): None when
    it did not apply or changed nothing the boot reads; else the commands, run when ``refresh``
    (:func:`refresh_boot`, raises what it raises), only listed (``ran`` False) otherwise."""
    if result.status != "applied" or result.plan is None or not changes_boot(result.plan.actions):
        return None
    if refresh:
        return refresh_boot(ports, note)
    return BootRefresh(boot_commands(ports.files))
