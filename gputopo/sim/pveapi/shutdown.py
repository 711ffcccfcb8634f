"""How a guest's shutdown task ends on a PVE node, given how long the guest takes to go down.

Pure: (seconds the guest needs, Proxmox's ``timeout``, ``forceStop``) -> how long the task runs,
whether the guest ends stopped, what the task logs and the error it dies with.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_TIMEOUT = 60  # both API2/LXC/Status.pm vm_shutdown and QemuServer.pm _do_vm_stop


@dataclass
class Outcome:
    seconds: float  # how long the task runs
    stopped: bool  # the guest is stopped when it ends
    log: list[str] = field(default_factory=list)  # lines the worker prints
    error: str | None = None  # its die message: the task fails with it


def lxc_shutdown(vmid: int, takes: float, timeout: int | None, force: bool, second: float = 1.0) -> Outcome:
    """pve-container LXC.pm vm_stop: ``lxc-stop -n ID --timeout T`` (``--nokill`` without
    forceStop; lxc-stop kills the container after T s otherwise, logging nothing); a failed
    lxc-stop is warned into the log, then the command socket is polled T+5 s more for the
    container to go, then ``container did not stop``. ``second`` is how long one of Proxmox's
    seconds lasts here."""
    t = DEFAULT_TIMEOUT if timeout is None else timeout
    if takes <= t * second:
        return Outcome(takes, True)
    if force:
        return Outcome(t * second, True)
    log = [f"command 'lxc-stop -n {vmid} --nokill --timeout {t}' failed: exit code 1"]
    if takes <= (2 * t + 5) * second:
        return Outcome(takes, True, log)
    return Outcome((2 * t + 5) * second, False, log, "container did not stop")


def qemu_shutdown(vmid: int, takes: float, timeout: int | None, force: bool, second: float = 1.0) -> Outcome:
    """qemu-server QemuServer.pm _do_vm_stop with shutdown: ACPI powerdown, wait T s (60 by
    default), then with forceStop ``VM still running - terminating now with SIGTERM`` (a plain
    Perl warn: the task still ends OK), else ``VM quit/powerdown failed - got timeout``."""
    t = DEFAULT_TIMEOUT if timeout is None else timeout
    if takes <= t * second:
        return Outcome(takes, True)
    if force:
        return Outcome(t * second, True, ["VM still running - terminating now with SIGTERM"])
    return Outcome(t * second, False, [], "VM quit/powerdown failed - got timeout")
