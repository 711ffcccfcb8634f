"""The ports to the host itself: sysfs writes and the IOMMU groups moved through them, commands
and systemd inside a container, host files, commands on the host, udev's device events."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@runtime_checkable
class SysfsPort(Protocol):
    """Writes one sysfs attribute, exactly like ``echo -n VALUE > <root>/PATH``.

    ``path`` is relative to the root, e.g. ``sys/bus/pci/devices/0000:01:00.0/driver_override``.
    Raises :class:`gputopo.errors.SysfsWriteError` with the kernel's errno on failure. It may
    block (the kernel can): callers run it under a timeout.
    """

    root: str

    def write(self, path: str, value: str) -> None: ...


@dataclass
class ExecResult:
    rc: int
    stdout: str = ""
    stderr: str = ""


@runtime_checkable
class ExecPort(Protocol):
    """Runs commands inside a container (``pct exec <vmid> -- argv``)."""

    def run(self, vmid: int, argv: list[str], timeout: float, input: str | None = None) -> ExecResult:
        """Run argv in the container; return its result. Raises ExecError on timeout."""
        ...

    def push(self, vmid: int, path: str, content: str, mode: int = 0o644) -> None:
        """Write a file inside the container (``pct push``)."""
        ...


class ContainerSystemdPort(Protocol):
    """systemd inside a container: a unit's state and command lines, its start and restart
    watched until it is active. Every method raises ExecError when a command fails or times out."""

    def service_active(self, vmid: int, unit: str) -> bool: ...

    def service_state(self, vmid: int, unit: str) -> str:
        """``systemctl is-active``'s answer; ``inactive`` when the container is not running."""
        ...

    def wait_active(self, vmid: int, unit: str, deadline: float | None = None) -> None:
        """Wait until ``unit`` is active with no job queued, until ``deadline`` (monotonic)."""
        ...

    def service_commands(self, vmid: int, unit: str) -> tuple[str, str | None, str | None]:
        """(state, the unit's command, the running main process's command)."""
        ...

    def start_service(self, vmid: int, unit: str) -> None: ...

    def restart_service(self, vmid: int, unit: str) -> None: ...


@dataclass(frozen=True)
class MemberState:
    """A PCI function's driver and driver_override before a move (None = none)."""

    driver: str | None
    override: str | None


class GroupBinder(Protocol):
    """Moves IOMMU groups between drivers. Its moves raise SysfsWriteError, SysfsTimeout or
    BindError, with the members' states before it as the error's ``previous``."""

    stuck: list[str]  # the devices on which a write hung

    def move_group(
        self,
        members: list[str],
        to_driver: str | None,
        keep_override: bool = False,
        natives: dict[str, str | None] | None = None,
    ) -> dict[str, MemberState]:
        """Move every member to ``to_driver`` (None: its native driver, by name where ``natives``
        knows it); returns each member's state before the move."""
        ...

    def restore(self, previous: Mapping[str, MemberState] | Mapping[str, str | None]) -> None:
        """Put every member back on its previous driver and override."""
        ...

    def state_of(self, address: str) -> MemberState: ...

    def driver_of(self, address: str) -> str | None: ...


@dataclass(frozen=True)
class FileMeta:
    """A file's permission bits and owner."""

    mode: int
    uid: int
    gid: int


@runtime_checkable
class HostFilesPort(Protocol):
    """Files on the host, relative to the root (``etc/udev/rules.d/...``)."""

    root: str

    def read(self, path: str) -> str | None:
        """The file's text, or None when it does not exist."""
        ...

    def meta(self, path: str) -> FileMeta | None:
        """The file's mode and owner, or None when it does not exist."""
        ...

    def write(self, path: str, content: str, mode: int = 0o644, owner: tuple[int, int] | None = None) -> None:
        """Atomic replace (temp file, fsync, rename) with ``mode`` and ``owner`` (uid, gid; None:
        the writer's)."""
        ...

    def remove(self, path: str) -> None:
        """Remove the file; one that is already gone is not an error."""
        ...

    def discard_temps(self, path: str) -> None:
        """Remove the temp files a write of ``path`` killed before its rename left beside it;
        the file itself stays as it is."""
        ...

    def is_dir(self, path: str) -> bool:
        """True when ``path`` is a directory."""
        ...

    def remove_dir(self, path: str) -> None:
        """Remove the directory if it is empty; a missing or non-empty one is left as it is."""
        ...

    def unwritable(self, path: str) -> str | None:
        """Why :meth:`write` or :meth:`remove` of ``path`` would fail (``/etc: Read-only file
        system``: the directory or file to blame, and why), or None when they would not.
        Changes nothing that stays."""
        ...


class HostCommandPort(Protocol):
    """Commands on the Proxmox host itself, as root: ``update-initramfs``, ``proxmox-boot-tool``."""

    def run(self, argv: list[str], timeout: float) -> ExecResult:
        """Run ``argv``; return its exit status and output (a non-zero exit is returned).

        Raises :class:`gputopo.errors.HostCommandError` when it cannot be started or does not
        finish within ``timeout`` seconds.
        """
        ...


@dataclass(frozen=True)
class DeviceEvent:
    """One device event as udev broadcast it once it had processed it: its rules run, their
    ``RUN`` programs done, its database entry written.

    ``action`` (``bind``, ``unbind``, ``add``, ``remove``, ``change``), ``subsystem`` (``pci``,
    ``vfio``), ``name`` (the device's sysfs name: ``0000:01:00.0``, the vfio group ``7``),
    ``seqnum`` (the kernel's ``SEQNUM`` of the event), ``driver`` (``DRIVER`` of a bind),
    ``failed`` (what udev says when a rule or program of the event failed, else None) and
    ``at`` (``time.monotonic()`` when this process received it)."""

    action: str
    subsystem: str
    name: str
    seqnum: int
    driver: str | None = None
    failed: str | None = None
    at: float = 0.0


class DeviceEventListener(Protocol):
    """Events udev broadcast after it processed them, from the moment the listener was made."""

    # the kernel's last event number (``/sys/kernel/uevent_seqnum``) once it listened: every
    # event of a write made after that carries a larger one
    seqnum: int

    def receive(self, timeout: float) -> DeviceEvent | None:
        """The next event, waiting at most ``timeout`` seconds; None when none came."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class DeviceEventsPort(Protocol):
    """udev's side of a device's events: what a caller listens to before a sysfs write, so it
    can wait until udev has processed that write's events (see ``gputopo.adapters.udev``)."""

    def listen(self) -> DeviceEventListener | None:
        """Start listening; None when no udev runs here (the wait is then skipped)."""
        ...


@runtime_checkable
class ContainerFilesPort(Protocol):
    """Bounded reads of files inside a container (a served model's config and safetensors
    headers): through the container's root on the node, else ``pct exec``."""

    def read(self, vmid: int, path: str, offset: int, length: int) -> bytes | None:
        """At most ``length`` bytes of ``path`` (absolute inside the container) from ``offset``;
        None when there is no such file. Raises ExecError when it cannot be read."""
        ...
