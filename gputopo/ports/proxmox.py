"""The Proxmox VE API's port (:class:`ProxmoxPort`) and its read half (:class:`ProxmoxReadPort`),
with the typed shapes of what they return where it is data the code reads by key."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypedDict, runtime_checkable


class PveVersion(TypedDict, total=False):
    """GET /version."""

    version: str  # 9.0.3
    release: str  # 9.0
    repoid: str


class GuestListing(TypedDict, total=False):
    """One guest of GET /nodes/{node}/lxc|qemu (more keys come; these are the ones read)."""

    vmid: int
    status: str  # running | stopped
    name: str


class GuestHa(TypedDict, total=False):
    """A guest's HA state: status/current's ``ha``, and ``requested`` from ha/resources.cfg."""

    managed: int  # 0 | 1
    state: str  # started, stopped, ignored...
    requested: str | None


class PciMapping(TypedDict, total=False):
    """One mapping of GET /cluster/mapping/pci."""

    id: str
    map: list[str]  # one line per node and device: id=...,iommugroup=...,node=...,path=...
    description: str
    digest: str
    checks: list[dict[str, Any]]  # with check-node: what Proxmox found wrong with a line


class LxcInterface(TypedDict, total=False):
    """One interface of a running container (GET .../lxc/{vmid}/interfaces)."""

    name: str
    hwaddr: str
    inet: str  # 10.0.0.5/24
    inet6: str


# GET .../qemu/{vmid}/agent/exec-status: ``exited`` (0/1) and, once exited,
# ``exitcode``, ``out-data``, ``err-data``.
AgentExecStatus = TypedDict(
    "AgentExecStatus",
    {"exited": int, "exitcode": int, "out-data": str, "err-data": str},
    total=False,
)


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

    def version(self) -> PveVersion:
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

    def list_guests(self, kind: str) -> list[GuestListing]:
        """GET /nodes/{node}/{kind}: one dict per guest of the node, with ``vmid`` and ``status``."""
        ...

    def guest_ha(self, kind: str, vmid: int) -> GuestHa:
        """Whether the guest is an HA resource: status/current's ``ha`` (``{"managed": 0}`` or
        ``{"managed": 1, "state": ...}``) and, when managed, ``requested``: its state in
        ``ha/resources.cfg`` (None when unreadable)."""
        ...

    def qemu_config(self, vmid: int) -> dict[str, Any]:
        """GET .../qemu/{vmid}/config: pending changes merged in; includes ``digest``."""
        ...

    def mappings(self) -> list[PciMapping]:
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

    def lxc_pending(self, vmid: int) -> list[dict[str, Any]]:
        """GET .../lxc/{vmid}/pending: one item per key (``key``; ``value`` in effect, ``pending``
        queued, ``delete`` queued), the ``digest`` among them."""
        ...

    def lxc_update(
        self, vmid: int, set: dict[str, str], delete: list[str], digest: str, revert: list[str] = ()
    ) -> None:
        """PUT .../lxc/{vmid}/config: ``revert`` keys (their pending change dropped), ``set``
        keys, ``delete`` keys, guarded by ``digest``."""
        ...

    def guest_action(
        self,
        kind: str,
        vmid: int,
        action: str,
        timeout: float,
        *,
        shutdown_timeout: int | None = None,
        force: bool = False,
        on_task: Callable[[str], None] | None = None,
    ) -> TaskResult:
        """POST status/{start|stop|shutdown} and wait up to ``timeout`` s for its task.
        ``on_task`` is called with the task's UPID as soon as Proxmox accepted it, before the wait.

        A shutdown sends ``shutdown_timeout`` (Proxmox's ``timeout``, 60 s when None) and
        ``forceStop=1`` only with ``force``. A task ending ``WARNINGS: N`` succeeded: its warnings
        come back in the result. Raises TaskFailed when the task fails, TaskTimeout when it does
        not finish within ``timeout``.
        """
        ...

    def wait_task(
        self, upid: str, timeout: float, what: str | None = None, limit: float | None = None
    ) -> str:
        """Wait up to ``timeout`` s for task ``upid`` to stop (GET /nodes/{node}/tasks/{upid}/status);
        its exitstatus. Raises TaskFailed when it failed, TaskTimeout (naming ``what`` and
        ``limit``) when it still runs."""
        ...

    def active_tasks(self, vmid: int) -> list[str]:
        """The UPIDs of the node's tasks of guest ``vmid`` still running, whoever started them
        (GET /nodes/{node}/tasks with ``source=active``)."""
        ...

    def recent_tasks(self, vmid: int, typefilter: str) -> list[str]:
        """The UPIDs of the node's tasks of guest ``vmid`` of type ``typefilter``, running or
        ended, newest first (GET .../tasks with ``source=all``). Raises ProxmoxError."""
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

    def agent_exec_status(self, vmid: int, pid: int) -> AgentExecStatus:
        """GET .../qemu/{vmid}/agent/exec-status: ``exited`` (0/1) and, once exited, ``exitcode``,
        ``out-data``, ``err-data``."""
        ...

    def lxc_interfaces(self, vmid: int) -> list[LxcInterface]:
        """GET .../lxc/{vmid}/interfaces: the running container's interfaces (``name``, ``hwaddr``,
        ``inet`` as ``10.0.0.5/24``, ...); [] when it is stopped (Proxmox answers null)."""
        ...

    def mappings(self, check_node: str | None = None) -> list[PciMapping]:
        """GET /cluster/mapping/pci, with ``checks`` per entry when ``check_node`` is set."""
        ...

    def mapping_create(self, id: str, map: list[str], description: str | None) -> None: ...

    def mapping_update(self, id: str, map: list[str], description: str | None, digest: str) -> None: ...

    def mapping_delete(self, id: str) -> None: ...
