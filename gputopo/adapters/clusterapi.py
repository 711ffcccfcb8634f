"""The cluster-wide Proxmox API calls (:class:`gputopo.ports.ClusterApiPort`), over the same
client as the node calls (:class:`gputopo.adapters.proxmox.ProxmoxClient`: HTTPS through
proxmoxer, or pvesh on a node).

Paths and parameters as pve-manager and pve-ha-manager define them: ``/cluster/status``,
``/cluster/ha/rules`` (PVE 9), ``/cluster/ha/groups`` (PVE 8), ``/cluster/ha/resources/{sid}``
and qemu-server's ``GET /nodes/{node}/qemu/{vmid}/migrate`` (proxied to the VM's node).
"""

from __future__ import annotations

from typing import Any

from gputopo.adapters.proxmox import ProxmoxClient
from gputopo.adapters.pvesh import wire_value


def _wire(params: dict[str, Any]) -> dict[str, Any]:
    return {k: wire_value(v) for k, v in params.items() if v is not None}


class ClusterApi:
    """``ClusterApiPort`` over ``client``."""

    def __init__(self, client: ProxmoxClient):
        self.client = client

    def __repr__(self) -> str:
        return f"ClusterApi({self.client!r})"

    def _call(self, method: str, path: str, **params: Any) -> Any:
        return self.client._call(method, path, **params)

    def members(self) -> list[str]:
        return [e["name"] for e in self._call("GET", "/cluster/status") if e.get("type") == "node"]

    def nodes(self) -> list[str]:
        return self.client.nodes()

    def release(self) -> int:
        from gputopo.plan.restarts import pve_major

        return pve_major(self.client.version().get("version"))

    def ha_resources(self) -> list[dict[str, Any]]:
        return self._call("GET", "/cluster/ha/resources") or []

    def ha_rules(self) -> list[dict[str, Any]]:
        return self._call("GET", "/cluster/ha/rules") or []

    def ha_groups(self) -> list[dict[str, Any]]:
        return self._call("GET", "/cluster/ha/groups") or []

    def ha_rule_create(self, rule: str, params: dict[str, Any]) -> None:
        self._call("POST", "/cluster/ha/rules", rule=rule, **_wire(params))

    def ha_rule_update(self, rule: str, params: dict[str, Any]) -> None:
        self._call("PUT", f"/cluster/ha/rules/{rule}", **_wire(params))

    def ha_rule_delete(self, rule: str) -> None:
        self._call("DELETE", f"/cluster/ha/rules/{rule}")

    def ha_group_create(self, group: str, params: dict[str, Any]) -> None:
        self._call("POST", "/cluster/ha/groups", group=group, **_wire(params))

    def ha_group_update(self, group: str, params: dict[str, Any]) -> None:
        self._call("PUT", f"/cluster/ha/groups/{group}", **_wire(params))

    def ha_group_delete(self, group: str) -> None:
        self._call("DELETE", f"/cluster/ha/groups/{group}")

    def ha_resource_update(self, sid: str, params: dict[str, Any]) -> None:
        self._call("PUT", f"/cluster/ha/resources/{sid}", **_wire(params))

    def node_vms(self, node: str) -> list[dict[str, Any]]:
        return self._call("GET", f"/nodes/{node}/qemu") or []

    def vm_config(self, node: str, vmid: int) -> dict[str, Any]:
        return self._call("GET", f"/nodes/{node}/qemu/{vmid}/config") or {}

    def migrate_check(self, node: str, vmid: int) -> dict[str, Any]:
        return self._call("GET", f"/nodes/{node}/qemu/{vmid}/migrate") or {}
