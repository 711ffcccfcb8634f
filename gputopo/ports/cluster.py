"""The ports of a cluster: commands on another node, and the cluster-wide calls of the API."""

from __future__ import annotations

from typing import Any, Protocol, TypedDict, runtime_checkable

from gputopo.ports.host import ExecResult


class HaResource(TypedDict, total=False):
    """One HA resource of GET /cluster/ha/resources."""

    sid: str  # vm:201
    type: str  # vm | ct
    state: str
    group: str  # PVE 8


class HaRule(TypedDict, total=False):
    """One rule of GET /cluster/ha/rules (PVE 9)."""

    rule: str
    type: str  # node-affinity | resource-affinity
    resources: str  # vm:201,vm:202
    nodes: str  # pve1,pve2:2
    strict: int
    disable: int
    comment: str
    digest: str


class HaGroup(TypedDict, total=False):
    """One group of GET /cluster/ha/groups (PVE 8)."""

    group: str
    type: str
    nodes: str
    restricted: int
    nofailback: int
    comment: str
    digest: str


class VmListing(TypedDict, total=False):
    """One VM of GET /nodes/{node}/qemu (more keys come; these are the ones read)."""

    vmid: int
    status: str
    name: str


# GET /nodes/{node}/qemu/{vmid}/migrate: the nodes a VM may move to, and why not
# the others (``not_allowed_nodes``: node -> ``unavailable-resources``...).
MigrateCheck = TypedDict(
    "MigrateCheck",
    {
        "allowed_nodes": list[str],
        "not_allowed_nodes": dict[str, dict[str, Any]],
        "mapped-resources": list[str],
        "mapped-resource-info": dict[str, Any],
        "local_resources": list[str],
    },
    total=False,
)


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

    def ha_resources(self) -> list[HaResource]: ...

    def ha_rules(self) -> list[HaRule]: ...

    def ha_groups(self) -> list[HaGroup]: ...

    def ha_rule_create(self, rule: str, params: dict[str, Any]) -> None: ...

    def ha_rule_update(self, rule: str, params: dict[str, Any]) -> None: ...

    def ha_rule_delete(self, rule: str) -> None: ...

    def ha_group_create(self, group: str, params: dict[str, Any]) -> None: ...

    def ha_group_update(self, group: str, params: dict[str, Any]) -> None: ...

    def ha_group_delete(self, group: str) -> None: ...

    def ha_resource_update(self, sid: str, params: dict[str, Any]) -> None: ...

    def node_vms(self, node: str) -> list[VmListing]:
        """GET /nodes/{node}/qemu: the VMs of ``node`` (``vmid``, ``status``...)."""
        ...

    def vm_config(self, node: str, vmid: int) -> dict[str, Any]:
        """GET /nodes/{node}/qemu/{vmid}/config: pending changes merged in."""
        ...

    def migrate_check(self, node: str, vmid: int) -> MigrateCheck:
        """GET /nodes/{node}/qemu/{vmid}/migrate: ``allowed_nodes``, ``not_allowed_nodes``..."""
        ...
