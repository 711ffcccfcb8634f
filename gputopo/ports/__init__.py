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
* :class:`ContainerFilesPort` -- bounded reads of files inside a container (a served model's
  config and safetensors headers; ``gputopo.adapters.ctfiles``)
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
Every name is importable from here; the package's modules group them: ``host`` (sysfs, the
binder, exec, systemd, files, host commands, udev), ``proxmox``, ``http``, ``cluster``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from gputopo.ports.cluster import (
    ClusterApiPort,
    HaGroup,
    HaResource,
    HaRule,
    MigrateCheck,
    NodeShellPort,
    VmListing,
)
from gputopo.ports.host import (
    ContainerFilesPort,
    ContainerSystemdPort,
    DeviceEvent,
    DeviceEventListener,
    DeviceEventsPort,
    ExecPort,
    ExecResult,
    FileMeta,
    GroupBinder,
    HostCommandPort,
    HostFilesPort,
    MemberState,
    SysfsPort,
)
from gputopo.ports.http import HttpPort, HttpResponse
from gputopo.ports.proxmox import (
    AgentExecStatus,
    GuestHa,
    GuestListing,
    LxcInterface,
    PciMapping,
    ProxmoxPort,
    ProxmoxReadPort,
    PveVersion,
    Task,
    TaskResult,
)

__all__ = [
    "AgentExecStatus",
    "ClusterApiPort",
    "ContainerFilesPort",
    "ContainerSystemdPort",
    "DeviceEvent",
    "DeviceEventListener",
    "DeviceEventsPort",
    "ExecPort",
    "ExecResult",
    "FileMeta",
    "GroupBinder",
    "GuestHa",
    "GuestListing",
    "HaGroup",
    "HaResource",
    "HaRule",
    "HostCommandPort",
    "HostFilesPort",
    "HttpPort",
    "HttpResponse",
    "LxcInterface",
    "MemberState",
    "MigrateCheck",
    "NodeShellPort",
    "PciMapping",
    "Ports",
    "ProxmoxPort",
    "ProxmoxReadPort",
    "PveVersion",
    "SysfsPort",
    "Task",
    "TaskResult",
    "VmListing",
]


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
    # files inside a container, read without pct where the container's root is reachable;
    # None: read through exec (``gputopo.adapters.ctfiles.ExecContainerFiles``)
    ctfiles: ContainerFilesPort | None = None
