"""The API paths the simulated node answers, each with its parameters and permission check."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote

from gputopo.sim.pveapi.answers import ApiError
from gputopo.sim.pveapi.params import (
    DIGEST,
    NODE,
    VMID,
    P,
    fmt_bool,
    fmt_configid,
    fmt_configid_list,
    fmt_enum,
    fmt_int,
    fmt_map_array,
    fmt_node,
    fmt_string,
    fmt_string_array,
    fmt_vmid,
)

API_PREFIX = "/api2/json"
_VM_CONFIG_ANY = (
    "VM.Config.Disk",
    "VM.Config.CPU",
    "VM.Config.Memory",
    "VM.Config.Network",
    "VM.Config.Options",
)


@dataclass
class Route:
    method: str
    pattern: str
    handler: str
    params: dict[str, P]
    perm: tuple[str, tuple[str, ...]] | None = None  # (acl path template, any-of privileges)
    extra: str | None = None  # "lxc": further parameters are container options
    regex: re.Pattern | None = None


_RULE = {
    "resources": P(fmt_string(4096)),
    "nodes": P(fmt_string(4096)),
    "strict": P(fmt_bool),
    "comment": P(fmt_string(4096)),
    "disable": P(fmt_bool),
}
_GROUP = {
    "nodes": P(fmt_string(4096)),
    "restricted": P(fmt_bool),
    "nofailback": P(fmt_bool),
    "comment": P(fmt_string(4096)),
    "type": P(fmt_enum("group")),
}
_RESOURCE = {
    "state": P(fmt_enum("started", "stopped", "enabled", "disabled", "ignored")),
    "group": P(fmt_configid),
    "comment": P(fmt_string(4096)),
    "max_restart": P(fmt_int),
    "max_relocate": P(fmt_int),
    "failback": P(fmt_bool),
}
_UPDATE = {"delete": P(fmt_configid_list), "digest": DIGEST}
_AUDIT = ("/", ("Sys.Audit",))
_CONSOLE = ("/", ("Sys.Console",))
# pve-ha-manager src/PVE/API2/HA/{Rules,Groups,Resources}.pm
HA_ROUTES = [
    Route(
        "GET",
        "/cluster/ha/rules",
        "ha_rules",
        {"type": P(fmt_enum("node-affinity", "resource-affinity")), "resource": P(fmt_string())},
        _AUDIT,
    ),
    Route(
        "POST",
        "/cluster/ha/rules",
        "ha_rule_create",
        {
            "rule": P(fmt_configid, False),
            "type": P(fmt_enum("node-affinity", "resource-affinity"), False),
            **_RULE,
        },
        _CONSOLE,
    ),
    Route("GET", "/cluster/ha/rules/{rule}", "ha_rule_get", {"rule": P(fmt_configid, False)}, _AUDIT),
    Route(
        "PUT",
        "/cluster/ha/rules/{rule}",
        "ha_rule_update",
        {
            "rule": P(fmt_configid, False),
            "type": P(fmt_enum("node-affinity", "resource-affinity")),
            **_RULE,
            **_UPDATE,
        },
        _CONSOLE,
    ),
    Route("DELETE", "/cluster/ha/rules/{rule}", "ha_rule_delete", {"rule": P(fmt_configid, False)}, _CONSOLE),
    Route("GET", "/cluster/ha/groups", "ha_groups", {}, _AUDIT),
    Route(
        "POST", "/cluster/ha/groups", "ha_group_create", {"group": P(fmt_configid, False), **_GROUP}, _CONSOLE
    ),
    Route(
        "PUT",
        "/cluster/ha/groups/{group}",
        "ha_group_update",
        {"group": P(fmt_configid, False), **_GROUP, **_UPDATE},
        _CONSOLE,
    ),
    Route(
        "DELETE", "/cluster/ha/groups/{group}", "ha_group_delete", {"group": P(fmt_configid, False)}, _CONSOLE
    ),
    Route("GET", "/cluster/ha/resources", "ha_resources", {"type": P(fmt_enum("vm", "ct"))}, _AUDIT),
    Route(
        "POST",
        "/cluster/ha/resources",
        "ha_resource_create",
        {"sid": P(fmt_string(), False), **_RESOURCE},
        _CONSOLE,
    ),
    Route("GET", "/cluster/ha/resources/{sid}", "ha_resource_get", {"sid": P(fmt_string(), False)}, _AUDIT),
    Route(
        "DELETE",
        "/cluster/ha/resources/{sid}",
        "ha_resource_delete",
        {"sid": P(fmt_string(), False), "purge": P(fmt_bool)},
        _CONSOLE,
    ),
    Route(
        "PUT",
        "/cluster/ha/resources/{sid}",
        "ha_resource_update",
        {"sid": P(fmt_string(), False), **_RESOURCE, **_UPDATE},
        _CONSOLE,
    ),
]

_GUEST_STATUS_PARAMS = {"node": NODE, "vmid": VMID, "kind": P(fmt_enum("lxc", "qemu"), False)}

ROUTES = [
    Route("GET", "/version", "version", {}),
    Route("GET", "/nodes", "nodes", {}),
    Route(
        "GET",
        "/nodes/{node}/{kind}",
        "list_guests",
        {"node": NODE, "kind": P(fmt_enum("lxc", "qemu"), False)},
    ),
    Route(
        "GET",
        "/nodes/{node}/lxc/{vmid}/config",
        "lxc_get",
        {"node": NODE, "vmid": VMID, "current": P(fmt_bool), "snapshot": P(fmt_string(40))},
        ("/vms/{vmid}", ("VM.Audit",)),
    ),
    Route(
        "PUT",
        "/nodes/{node}/lxc/{vmid}/config",
        "lxc_put",
        {
            "node": NODE,
            "vmid": VMID,
            "digest": DIGEST,
            "delete": P(fmt_configid_list),
            "revert": P(fmt_configid_list),
            "description": P(fmt_string(8192)),
        },
        ("/vms/{vmid}", _VM_CONFIG_ANY),
        extra="lxc",
    ),
    Route(
        "GET",
        "/nodes/{node}/lxc/{vmid}/pending",
        "lxc_pending",
        {"node": NODE, "vmid": VMID},
        ("/vms/{vmid}", ("VM.Audit",)),
    ),
    Route(
        "GET",
        "/nodes/{node}/lxc/{vmid}/interfaces",
        "lxc_interfaces",
        {"node": NODE, "vmid": VMID},
        ("/vms/{vmid}", ("VM.Audit",)),
    ),
    Route(
        "GET",
        "/nodes/{node}/qemu/{vmid}/config",
        "qemu_get",
        {"node": NODE, "vmid": VMID, "current": P(fmt_bool), "snapshot": P(fmt_string(40))},
        ("/vms/{vmid}", ("VM.Audit",)),
    ),
    Route(
        "PUT",
        "/nodes/{node}/qemu/{vmid}/config",
        "qemu_put",
        {
            "node": NODE,
            "vmid": VMID,
            "digest": DIGEST,
            "delete": P(fmt_configid_list),
            "revert": P(fmt_configid_list),
            "skiplock": P(fmt_bool),
        },
        ("/vms/{vmid}", _VM_CONFIG_ANY),
        extra="qemu",
    ),
    Route(
        "GET",
        "/nodes/{node}/qemu/{vmid}/pending",
        "qemu_pending",
        {"node": NODE, "vmid": VMID},
        ("/vms/{vmid}", ("VM.Audit",)),
    ),
    Route(
        "POST",
        "/nodes/{node}/qemu/{vmid}/agent/ping",
        "agent_ping",
        {"node": NODE, "vmid": VMID},
        ("/vms/{vmid}", ("VM.GuestAgent.Audit", "VM.GuestAgent.Unrestricted")),
    ),
    Route(
        "POST",
        "/nodes/{node}/qemu/{vmid}/agent/exec",
        "agent_exec",
        {"node": NODE, "vmid": VMID, "command": P(fmt_string_array), "input-data": P(fmt_string(64 * 1024))},
        ("/vms/{vmid}", ("VM.GuestAgent.Unrestricted",)),
    ),
    Route(
        "GET",
        "/nodes/{node}/qemu/{vmid}/agent/exec-status",
        "agent_exec_status",
        {"node": NODE, "vmid": VMID, "pid": P(fmt_int, False)},
        ("/vms/{vmid}", ("VM.GuestAgent.Unrestricted",)),
    ),
    Route(
        "GET",
        "/nodes/{node}/{kind}/{vmid}/status/current",
        "guest_current",
        _GUEST_STATUS_PARAMS,
        ("/vms/{vmid}", ("VM.Audit",)),
    ),
    Route(
        "POST",
        "/nodes/{node}/{kind}/{vmid}/status/start",
        "guest_start",
        {**_GUEST_STATUS_PARAMS, "skiplock": P(fmt_bool), "timeout": P(fmt_int), "debug": P(fmt_bool)},
        ("/vms/{vmid}", ("VM.PowerMgmt",)),
    ),
    Route(
        "POST",
        "/nodes/{node}/{kind}/{vmid}/status/stop",
        "guest_stop",
        {
            **_GUEST_STATUS_PARAMS,
            "skiplock": P(fmt_bool),
            "overrule-shutdown": P(fmt_bool),
            "timeout": P(fmt_int),
        },
        ("/vms/{vmid}", ("VM.PowerMgmt",)),
    ),
    Route(
        "POST",
        "/nodes/{node}/{kind}/{vmid}/status/shutdown",
        "guest_shutdown",
        {**_GUEST_STATUS_PARAMS, "timeout": P(fmt_int), "forceStop": P(fmt_bool)},
        ("/vms/{vmid}", ("VM.PowerMgmt",)),
    ),
    Route(  # pve-manager API2/Tasks.pm node_tasks: every user lists, the handler filters
        "GET",
        "/nodes/{node}/tasks",
        "node_tasks",
        {
            "node": NODE,
            "vmid": P(fmt_vmid),
            "source": P(fmt_enum("archive", "active", "all")),
            "typefilter": P(fmt_string()),
            "start": P(fmt_int),
            "limit": P(fmt_int),
        },
    ),
    Route(
        "GET",
        "/nodes/{node}/tasks/{upid}/status",
        "task_status",
        {"node": NODE, "upid": P(fmt_string(), False)},
    ),
    Route(
        "GET",
        "/nodes/{node}/tasks/{upid}/log",
        "task_log",
        {
            "node": NODE,
            "upid": P(fmt_string(), False),
            "start": P(fmt_int),
            "limit": P(fmt_int),
            "download": P(fmt_bool),
        },
    ),
    Route(
        "GET",
        "/nodes/{node}/hardware/pci",
        "hardware_pci",
        {"node": NODE, "pci-class-blacklist": P(fmt_string()), "verbose": P(fmt_bool)},
    ),
    Route("GET", "/cluster/mapping/pci", "mapping_list", {"check-node": P(fmt_node)}),
    Route(
        "POST",
        "/cluster/mapping/pci",
        "mapping_create",
        {
            "id": P(fmt_configid, False),
            "map": P(fmt_map_array, False),
            "description": P(fmt_string(4096)),
            "mdev": P(fmt_bool),
            "live-migration-capable": P(fmt_bool),
        },
        ("/mapping/pci", ("Mapping.Modify",)),
    ),
    Route(
        "GET",
        "/cluster/mapping/pci/{id}",
        "mapping_get",
        {"id": P(fmt_configid, False)},
        ("/mapping/pci/{id}", ("Mapping.Audit", "Mapping.Use", "Mapping.Modify")),
    ),
    Route(
        "PUT",
        "/cluster/mapping/pci/{id}",
        "mapping_update",
        {
            "id": P(fmt_configid, False),
            "map": P(fmt_map_array),
            "description": P(fmt_string(4096)),
            "mdev": P(fmt_bool),
            "live-migration-capable": P(fmt_bool),
            "delete": P(fmt_configid_list),
            "digest": DIGEST,
        },
        ("/mapping/pci", ("Mapping.Modify",)),
    ),
    Route(
        "DELETE",
        "/cluster/mapping/pci/{id}",
        "mapping_delete",
        {"id": P(fmt_configid, False)},
        ("/mapping/pci", ("Mapping.Modify",)),
    ),
    Route("GET", "/cluster/status", "cluster_status", {}),
    Route(
        "GET",
        "/nodes/{node}/qemu/{vmid}/migrate",
        "qemu_migrate_check",
        {"node": NODE, "vmid": VMID, "target": P(fmt_node)},
        ("/vms/{vmid}", ("VM.Migrate",)),
    ),
    *HA_ROUTES,
    Route(
        "POST",
        "/access/ticket",
        "ticket",
        {
            "username": P(fmt_string(64), False),
            "password": P(fmt_string(), False),
            "realm": P(fmt_string()),
            "otp": P(fmt_string()),
            "tfa-challenge": P(fmt_string()),
            "path": P(fmt_string()),
            "privs": P(fmt_string()),
        },
    ),
]
for _r in ROUTES:
    # {kind} is a literal path element in Proxmox (two routes), so it only matches lxc|qemu
    _r.regex = re.compile(
        "^" + re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", _r.pattern.replace("{kind}", "(?P<kind>lxc|qemu)")) + "$"
    )

NO_AUTH = {("POST", "/access/ticket"), ("GET", "/access/ticket"), ("GET", "/access/domains")}


def find_route(method: str, path: str) -> tuple[Route, dict[str, str]]:
    """The route of ``method path`` and its URI parameters. Raises ApiError 501."""
    for r in ROUTES:
        if r.method != method:
            continue
        m = r.regex.match(path)
        if m:
            return r, {k: unquote(v) for k, v in m.groupdict().items()}
    raise ApiError(501, f"Method '{method} {path}' not implemented")
