"""The narrow ports through which gputopo changes a host.

Each external system sits behind one small Protocol; a real adapter and the simulated one
(``gputopo.sim``) implement it, and apply/verify only ever see the Protocol.

* :class:`SysfsPort`  -- attribute writes under ``<root>/sys`` (real: ``gputopo.adapters.sysfs.RealSysfs``)
* :class:`ProxmoxPort` -- the Proxmox VE API (real: ``gputopo.adapters.proxmox.HttpsClient`` over
  proxmoxer, or ``LocalClient`` through ``pvesh`` on the node; the simulator serves real HTTP,
  so tests use the real client); its read half :class:`ProxmoxReadPort` is also answered by
  Proxmox's files (``gputopo.adapters.pvefiles.PveFiles``)
* :class:`ExecPort`   -- commands inside a container (real: ``pct exec``/``pct push``)
* :class:`ContainerSystemdPort` -- systemd inside a container (``gputopo.adapters.systemctl``:
  ``systemctl`` over the ExecPort)
* :class:`GroupBinder` -- IOMMU groups moved between drivers over the SysfsPort
  (``gputopo.adapters.sysfs.Binder``)
* :class:`HostFilesPort` -- files on the host under the root (persistence files)
* :class:`HttpPort`   -- HTTP to the services the containers run (the inference endpoint that
  verify probes; real: ``gputopo.adapters.http.RequestsHttp``)
* :class:`NodeShellPort` -- commands on another node of a cluster (real: the OpenSSH client,
  ``gputopo.adapters.ssh.SshRunner``, as ``root@<node>``)
* :class:`ClusterApiPort` -- what the cluster-wide steps ask of the API of any node: members,
  HA placement, migration preconditions (real: ``gputopo.adapters.clusterapi.ClusterApi``)
* :class:`DeviceEventsPort` -- udev's processed device events, heard while a sysfs write's
  rules run (real: ``gputopo.adapters.udev.UdevEvents`` over ``pyudev.Monitor``; None where
  no udev runs: the simulator, a container)

:class:`Ports` bundles them, typed, with a ``close`` hook for whatever building them started:
nothing else travels with them, so no code path can tell a simulated host from a real one.
"""

from __future__ import annotations

import json as _json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


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


@dataclass
class Task:
    upid: str
    status: str  # "running" | "stopped"
    exitstatus: str | None = None


@dataclass
class TaskResult:
    """How a guest's power task ended when it succeeded: ``exitstatus`` is ``OK`` or
    ``WARNINGS: N``; ``warnings`` the messages of its ``WARN:`` log lines; ``forced`` whether a
    shutdown had to stop the guest by force (only ever with ``force``); ``seconds`` how long it
    took."""

    upid: str
    exitstatus: str = "OK"
    warnings: list[str] = field(default_factory=list)
    forced: bool = False
    seconds: float = 0.0


@runtime_checkable
class ProxmoxReadPort(Protocol):
    """What reading a node's current state asks of Proxmox: its guests, their configs and
    statuses, the PCI mappings. The API answers it (every :class:`ProxmoxPort`), and so do
    Proxmox's files (``gputopo.adapters.pvefiles.PveFiles``), with the same shapes and errors,
    so :func:`gputopo.facts.current.read_current` has one set of rules for both. Errors raise
    ProxmoxError; a guest that does not exist is one whose message says ``does not exist``.
    """

    node: str
    # False when this source cannot tell whether a guest runs (Proxmox's files): its
    # guest_status and list_guests then answer 'running' for every guest
    status_known: bool
    # False when this source holds no record of the node's guests (Proxmox's files without the
    # node's directory: nothing configured yet, or a pve root from elsewhere): a guest it does
    # not list may still exist there
    guests_known: bool

    def version(self) -> dict[str, Any]:
        """GET /version: ``{version, release, repoid}``; {} when the source cannot tell."""
        ...

    def identity(self) -> str | None:
        """The user the source acts as (``root@pam``, ``root@pam!gputopo`` for a token); None
        where it has no login (Proxmox's files do not say who will apply)."""
        ...

    def lxc_config(self, vmid: int) -> dict[str, Any]:
        """GET .../lxc/{vmid}/config: pending changes merged in; includes ``digest``."""
        ...

    def guest_status(self, kind: str, vmid: int) -> str:
        """'running' or 'stopped'. kind is 'lxc' or 'qemu'."""
        ...

    def list_guests(self, kind: str) -> list[dict[str, Any]]:
        """GET /nodes/{node}/{kind}: one dict per guest of the node, with ``vmid`` and ``status``."""
        ...

    def guest_ha(self, kind: str, vmid: int) -> dict[str, Any]:
        """Whether the guest is an HA resource: status/current's ``ha`` (``{"managed": 0}`` or
        ``{"managed": 1, "state": ...}``) and, when managed, ``requested``: its state in
        ``ha/resources.cfg`` (None when unreadable)."""
        ...

    def qemu_config(self, vmid: int) -> dict[str, Any]:
        """GET .../qemu/{vmid}/config: pending changes merged in; includes ``digest``."""
        ...

    def mappings(self) -> list[dict[str, Any]]:
        """GET /cluster/mapping/pci: ``id``, ``map``, ``description``, ``digest`` of each mapping."""
        ...


@runtime_checkable
class ProxmoxPort(ProxmoxReadPort, Protocol):
    """The calls gputopo makes to the Proxmox VE API: the reads of :class:`ProxmoxReadPort`
    and the changes. Errors raise ProxmoxError/TaskFailed."""

    def identity(self) -> str:
        """The authenticated user id, e.g. ``root@pam`` or ``root@pam!gputopo`` for a token."""
        ...

    def lxc_config(self, vmid: int, current: bool = False) -> dict[str, Any]:
        """GET .../lxc/{vmid}/config: pending changes merged in, or with ``current`` the values in
        effect (a running container's pending removals still there); includes ``digest``."""
        ...

    def lxc_update(self, vmid: int, set: dict[str, str], delete: list[str], digest: str) -> None: ...

    def guest_action(
        self,
        kind: str,
        vmid: int,
        action: str,
        timeout: float,
        *,
        shutdown_timeout: int | None = None,
        force: bool = False,
    ) -> TaskResult:
        """POST status/{start|stop|shutdown} and wait up to ``timeout`` s for its task.

        A shutdown sends ``shutdown_timeout`` (Proxmox's ``timeout``, 60 s when None) and
        ``forceStop=1`` only with ``force``. A task ending ``WARNINGS: N`` succeeded: its warnings
        come back in the result. Raises TaskFailed when the task fails, TaskTimeout when it does
        not finish within ``timeout``.
        """
        ...

    def ha_set_state(self, sid: str, state: str) -> None:
        """Set an HA resource's requested state (``PUT /cluster/ha/resources/{sid}`` with
        ``state``, what ``ha-manager set <sid> --state <state>`` does); the HA manager then moves
        the guest."""
        ...

    def nodes(self) -> list[str]:
        """The names of the nodes this API serves (GET /nodes: the cluster's, or this node)."""
        ...

    @property
    def address(self) -> str:
        """Where the API is reached, for messages: its URL, or ``pvesh (--local)``."""
        ...

    def qemu_update(self, vmid: int, set: dict[str, str], delete: list[str], digest: str) -> None:
        """PUT .../qemu/{vmid}/config: ``set`` keys, ``delete`` keys, guarded by ``digest``."""
        ...

    def agent_ping(self, vmid: int) -> None:
        """POST .../qemu/{vmid}/agent/ping. Raises ProxmoxError when no guest agent answers."""
        ...

    def agent_exec(self, vmid: int, argv: list[str]) -> int:
        """POST .../qemu/{vmid}/agent/exec: start ``argv`` in the guest; returns its pid."""
        ...

    def agent_exec_status(self, vmid: int, pid: int) -> dict[str, Any]:
        """GET .../qemu/{vmid}/agent/exec-status: ``exited`` (0/1) and, once exited, ``exitcode``,
        ``out-data``, ``err-data``."""
        ...

    def lxc_interfaces(self, vmid: int) -> list[dict[str, Any]]:
        """GET .../lxc/{vmid}/interfaces: the running container's interfaces (``name``, ``hwaddr``,
        ``inet`` as ``10.0.0.5/24``, ...); [] when it is stopped (Proxmox answers null)."""
        ...

    def mappings(self, check_node: str | None = None) -> list[dict[str, Any]]:
        """GET /cluster/mapping/pci, with ``checks`` per entry when ``check_node`` is set."""
        ...

    def mapping_create(self, id: str, map: list[str], description: str | None) -> None: ...

    def mapping_update(self, id: str, map: list[str], description: str | None, digest: str) -> None: ...

    def mapping_delete(self, id: str) -> None: ...


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


@dataclass
class HttpResponse:
    status: int
    text: str = ""

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def json(self) -> Any:
        """The body as JSON. Raises ValueError when it is not JSON."""
        return _json.loads(self.text)


@runtime_checkable
class HttpPort(Protocol):
    """HTTP requests to a service a container runs (``http://<container address>:<port>/...``)."""

    def request(self, method: str, url: str, *, json: Any = None, timeout: float) -> HttpResponse:
        """Send one request; return the reply whatever its status.

        Raises :class:`gputopo.errors.HttpError` (its ``reason``: ``timed out``, ``Connection
        refused``, ``connection closed without a reply``, ...) when no reply came.
        """
        ...


class HostCommandPort(Protocol):
    """Commands on the Proxmox host itself, as root: ``update-initramfs``, ``proxmox-boot-tool``."""

    def run(self, argv: list[str], timeout: float) -> ExecResult:
        """Run ``argv``; return its exit status and output (a non-zero exit is returned).

        Raises :class:`gputopo.errors.HostCommandError` when it cannot be started or does not
        finish within ``timeout`` seconds.
        """
        ...


@runtime_checkable
class NodeShellPort(Protocol):
    """Runs a command on a cluster node, the way ``ssh root@<node> -- argv`` does."""

    def run(self, node: str, argv: list[str], timeout: float, input: str | None = None) -> ExecResult:
        """Run ``argv`` on ``node``; return its exit status and output whatever the status.

        Raises :class:`gputopo.errors.NodeUnreachable` (one line naming the node) when the node
        cannot be reached, refuses the login or host key, or gives no answer within ``timeout``.
        """
        ...


@runtime_checkable
class ClusterApiPort(Protocol):
    """The cluster-wide calls of the Proxmox API (any node answers them). Errors raise
    :class:`gputopo.errors.ProxmoxError`."""

    def members(self) -> list[str]:
        """The cluster's node names (GET /cluster/status)."""
        ...

    def nodes(self) -> list[str]:
        """GET /nodes: the cluster's node names (any login may list them; one outside a cluster)."""
        ...

    def release(self) -> int:
        """The Proxmox VE major release (8: HA groups, 9: HA rules)."""
        ...

    def ha_resources(self) -> list[dict[str, Any]]: ...

    def ha_rules(self) -> list[dict[str, Any]]: ...

    def ha_groups(self) -> list[dict[str, Any]]: ...

    def ha_rule_create(self, rule: str, params: dict[str, Any]) -> None: ...

    def ha_rule_update(self, rule: str, params: dict[str, Any]) -> None: ...

    def ha_rule_delete(self, rule: str) -> None: ...

    def ha_group_create(self, group: str, params: dict[str, Any]) -> None: ...

    def ha_group_update(self, group: str, params: dict[str, Any]) -> None: ...

    def ha_group_delete(self, group: str) -> None: ...

    def ha_resource_update(self, sid: str, params: dict[str, Any]) -> None: ...

    def node_vms(self, node: str) -> list[dict[str, Any]]:
        """GET /nodes/{node}/qemu: the VMs of ``node`` (``vmid``, ``status``...)."""
        ...

    def vm_config(self, node: str, vmid: int) -> dict[str, Any]:
        """GET /nodes/{node}/qemu/{vmid}/config: pending changes merged in."""
        ...

    def migrate_check(self, node: str, vmid: int) -> dict[str, Any]:
        """GET /nodes/{node}/qemu/{vmid}/migrate: ``allowed_nodes``, ``not_allowed_nodes``..."""
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


def _nothing() -> None:
    return None


@dataclass
class Ports:
    """The bundle of ports that apply and verify work through. ``close()`` stops whatever was
    started to build them (a simulated host's servers); it is safe to call twice."""

    sysfs: SysfsPort
    proxmox: ProxmoxPort
    exec: ExecPort
    files: HostFilesPort
    http: HttpPort
    close: Callable[[], None] = field(default=_nothing)
    host: HostCommandPort | None = None  # commands on the host; None where none can run
    udev: DeviceEventsPort | None = None  # udev's processed events; None where no udev runs
    # the cluster-wide calls of the same API login (HA placement); None where none are made
    cluster: ClusterApiPort | None = None
