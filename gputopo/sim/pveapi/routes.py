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
)

API_PREFIX = "/api2/json"
_VM_CONFIG_ANY = ("VM.Config.Disk", "VM.Config.CPU", "VM.Config.Memory", "VM.Config.Network", "VM.Config.Options")


@dataclass
class Route:
    method: str
    pattern: str
    handler: str
    params: dict[str, P]
    perm: tuple[str, tuple[str, ...]] | None = None  # (acl path template, any-of privileges)
    extra: str | None = None  # "lxc": further parameters are container options
    regex: re.Pattern | None = None


_GUEST_STATUS_PARAMS = {"node": NODE, "vmid": VMID, "kind": P(fmt_enum("lxc", "qemu"), False)}

ROUTES = [
    Route("GET", "/version", "version", {}),
    Route("GET", "/nodes", "nodes", {}),
    Route("GET", "/nodes/{node}/{kind}", "list_guests", {"node": NODE, "kind": P(fmt_enum("lxc", "qemu"), False)}),
    Route("GET", "/nodes/{node}/lxc/{vmid}/config", "lxc_get", {"node": NODE, "vmid": VMID, "current": P(fmt_bool), "snapshot": P(fmt_string(40))}, ("/vms/{vmid}", ("VM.Audit",))),
    Route("PUT", "/nodes/{node}/lxc/{vmid}/config", "lxc_put", {"node": NODE, "vmid": VMID, "digest": DIGEST, "delete": P(fmt_configid_list), "revert": P(fmt_configid_list), "description": P(fmt_string(8192))}, ("/vms/{vmid}", _VM_CONFIG_ANY), extra="lxc"),
    Route("GET", "/nodes/{node}/lxc/{vmid}/interfaces", "lxc_interfaces", {"node": NODE, "vmid": VMID}, ("/vms/{vmid}", ("VM.Audit",))),
    Route("GET", "/nodes/{node}/qemu/{vmid}/config", "qemu_get", {"node": NODE, "vmid": VMID, "current": P(fmt_bool), "snapshot": P(fmt_string(40))}, ("/vms/{vmid}", ("VM.Audit",))),
    Route("PUT", "/nodes/{node}/qemu/{vmid}/config", "qemu_put", {"node": NODE, "vmid": VMID, "digest": DIGEST, "delete": P(fmt_configid_list), "revert": P(fmt_configid_list), "skiplock": P(fmt_bool)}, ("/vms/{vmid}", _VM_CONFIG_ANY), extra="qemu"),
    Route("POST", "/nodes/{node}/qemu/{vmid}/agent/ping", "agent_ping", {"node": NODE, "vmid": VMID}, ("/vms/{vmid}", ("VM.GuestAgent.Audit", "VM.GuestAgent.Unrestricted"))),
    Route("POST", "/nodes/{node}/qemu/{vmid}/agent/exec", "agent_exec", {"node": NODE, "vmid": VMID, "command": P(fmt_string_array), "input-data": P(fmt_string(64 * 1024))}, ("/vms/{vmid}", ("VM.GuestAgent.Unrestricted",))),
    Route("GET", "/nodes/{node}/qemu/{vmid}/agent/exec-status", "agent_exec_status", {"node": NODE, "vmid": VMID, "pid": P(fmt_int, False)}, ("/vms/{vmid}", ("VM.GuestAgent.Unrestricted",))),
    Route("GET", "/nodes/{node}/{kind}/{vmid}/status/current", "guest_current", _GUEST_STATUS_PARAMS, ("/vms/{vmid}", ("VM.Audit",))),
    Route("POST", "/nodes/{node}/{kind}/{vmid}/status/start", "guest_start", {**_GUEST_STATUS_PARAMS, "skiplock": P(fmt_bool), "timeout": P(fmt_int), "debug": P(fmt_bool)}, ("/vms/{vmid}", ("VM.PowerMgmt",))),
    Route("POST", "/nodes/{node}/{kind}/{vmid}/status/stop", "guest_stop", {**_GUEST_STATUS_PARAMS, "skiplock": P(fmt_bool), "overrule-shutdown": P(fmt_bool), "timeout": P(fmt_int)}, ("/vms/{vmid}", ("VM.PowerMgmt",))),
    Route("POST", "/nodes/{node}/{kind}/{vmid}/status/shutdown", "guest_shutdown", {**_GUEST_STATUS_PARAMS, "timeout": P(fmt_int), "forceStop": P(fmt_bool)}, ("/vms/{vmid}", ("VM.PowerMgmt",))),
    Route("GET", "/nodes/{node}/tasks/{upid}/status", "task_status", {"node": NODE, "upid": P(fmt_string(), False)}),
    Route("GET", "/nodes/{node}/tasks/{upid}/log", "task_log", {"node": NODE, "upid": P(fmt_string(), False), "start": P(fmt_int), "limit": P(fmt_int), "download": P(fmt_bool)}),
    Route("GET", "/nodes/{node}/hardware/pci", "hardware_pci", {"node": NODE, "pci-class-blacklist": P(fmt_string()), "verbose": P(fmt_bool)}),
    Route("GET", "/cluster/mapping/pci", "mapping_list", {"check-node": P(fmt_node)}),
    Route("POST", "/cluster/mapping/pci", "mapping_create", {"id": P(fmt_configid, False), "map": P(fmt_map_array, False), "description": P(fmt_string(4096)), "mdev": P(fmt_bool), "live-migration-capable": P(fmt_bool)}, ("/mapping/pci", ("Mapping.Modify",))),
    Route("GET", "/cluster/mapping/pci/{id}", "mapping_get", {"id": P(fmt_configid, False)}, ("/mapping/pci/{id}", ("Mapping.Audit", "Mapping.Use", "Mapping.Modify"))),
    Route("PUT", "/cluster/mapping/pci/{id}", "mapping_update", {"id": P(fmt_configid, False), "map": P(fmt_map_array), "description": P(fmt_string(4096)), "mdev": P(fmt_bool), "live-migration-capable": P(fmt_bool), "delete": P(fmt_configid_list), "digest": DIGEST}, ("/mapping/pci", ("Mapping.Modify",))),
    Route("DELETE", "/cluster/mapping/pci/{id}", "mapping_delete", {"id": P(fmt_configid, False)}, ("/mapping/pci", ("Mapping.Modify",))),
    Route("POST", "/access/ticket", "ticket", {"username": P(fmt_string(64), False), "password": P(fmt_string(), False), "realm": P(fmt_string()), "otp": P(fmt_string()), "tfa-challenge": P(fmt_string()), "path": P(fmt_string()), "privs": P(fmt_string())}),
]
for _r in ROUTES:
    # {kind} is a literal path element in Proxmox (two routes), so it only matches lxc|qemu
    _r.regex = re.compile("^" + re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", _r.pattern.replace("{kind}", "(?P<kind>lxc|qemu)")) + "$")

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
