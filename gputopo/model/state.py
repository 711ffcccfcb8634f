"""The current state the planner compares against: what Proxmox, the containers and the host files
say now (read by :mod:`gputopo.facts.current`). Data only."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from gputopo.model.footprint import ModelFootprint
from gputopo.model.strict import Strict


class ServiceState(Strict):
    unit: str
    active: bool = False
    exec_start: str | None = Field(None, description="The unit's effective ExecStart command")
    tp: int | None = None
    dropin: str | None = Field(None, description="Current text of gputopo's drop-in; null when absent")
    found: bool = Field(True, description="False when systemd has no such unit (LoadState=not-found)")


class HaState(Strict):
    """A guest that is an HA resource (pve-ha-manager: listed in ``ha/resources.cfg`` and not
    ``ignored``): Proxmox hands its start, stop and shutdown to the HA manager, which moves the
    guest seconds after the task ended."""

    managed: bool = Field(True, description="status/current's ha.managed")
    state: str | None = Field(None, description="The HA manager's service state (status/current's ha.state)")
    requested: str | None = Field(
        None,
        description="The requested state in ha/resources.cfg (started, stopped, disabled); null when "
        "it could not be read",
    )


class ContainerState(Strict):
    config: dict[str, Any] = Field(
        default_factory=dict, description="As GET .../lxc/{vmid}/config returns it"
    )
    status: Literal["running", "stopped"] = "stopped"
    service: ServiceState | None = None
    service_error: str | None = Field(
        None, description="Why the running container's service could not be read (no pct here...)"
    )
    ha: HaState | None = Field(None, description="Set when the container is an HA resource")
    footprint: ModelFootprint | None = Field(
        None, description="The served model's footprint, read from its files (gputopo.facts.footprint)"
    )
    footprint_unread: str | None = Field(
        None, description="Why the served model's footprint could not be read; null when read or not tried"
    )


class MappingState(Strict):
    map: list[str] = Field(default_factory=list)
    description: str | None = None
    digest: str | None = None


class GuestState(Strict):
    status: Literal["running", "stopped"] = "stopped"
    hostpci: list[str] = Field(default_factory=list)
    config: dict[str, Any] = Field(
        default_factory=dict,
        description="As GET .../qemu/{vmid}/config returns it (pending merged in, digest)",
    )
    ha: HaState | None = Field(None, description="Set when the VM is an HA resource")


class ClusterVm(Strict):
    """A VM of the cluster that takes a device from a PCI mapping: its node and its ``hostpciN``
    values (in index order)."""

    node: str
    hostpci: list[str] = Field(default_factory=list)
    running: bool = Field(default=False, description="Whether the VM ran when it was read")


class HaConfig(Strict):
    """The cluster's HA configuration as the API lists it, and the cluster's VMs with mapped
    devices (what HA placement is planned from, see :mod:`gputopo.plan.ha`). The
    release decides rules (PVE 9) or groups (PVE 8)."""

    release: int
    members: list[str] = Field(default_factory=list, description="The cluster's nodes")
    resources: dict[str, dict[str, Any]] = Field(default_factory=dict, description="sid -> resource")
    rules: list[dict[str, Any]] = Field(default_factory=list)
    groups: list[dict[str, Any]] = Field(default_factory=list)
    vms: dict[int, ClusterVm] = Field(
        default_factory=dict, description="Every VM of the cluster whose hostpciN names a mapping"
    )

    @property
    def uses_rules(self) -> bool:
        return self.release >= 9


class CurrentState(Strict):
    """What Proxmox, the containers and the host files say now (read by gputopo.current)."""

    containers: dict[int, ContainerState] = Field(default_factory=dict)
    mappings: dict[str, MappingState] = Field(default_factory=dict)
    guests: dict[int, GuestState] = Field(default_factory=dict)
    files: dict[str, str | None] = Field(default_factory=dict, description="host path -> text (None: absent)")
    pve_version: str | None = Field(
        None, description="The node's Proxmox VE version (GET /version); null when read from files"
    )
    containers_known: bool = Field(
        False,
        description="True when the source lists the node's guests: a container the spec names that is "
        "not in containers does not exist (False: nothing was read, or Proxmox's files hold nothing "
        "for the node)",
    )
    api_user: str | None = Field(
        None,
        description="Who the Proxmox API source is logged in as: root@pam, another user@realm, or an API "
        "token's id user@realm!name; null when read from Proxmox's files (who applies is not known)",
    )
    guest_status_known: bool = Field(
        True,
        description="False when read from Proxmox's files, which cannot tell whether a guest runs "
        "(every guest then counts as running)",
    )
    ha_config: HaConfig | None = Field(
        None,
        description="The cluster's HA configuration and its VMs with mapped devices; null on a host "
        "that is not in a cluster, or when it was not read (--no-ha, Proxmox's files, no Sys.Audit)",
    )
    ha_unread: str | None = Field(
        None, description="Why the cluster's HA configuration could not be read (the API's refusal)"
    )
