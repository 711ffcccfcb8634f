"""A simulated Proxmox VE API server: real HTTP(S) on loopback, state in real files.

It answers the calls gputopo makes the way a PVE node does (see docs: proxmox-api-wire.md):
the same paths under ``/api2/json``, the same request pipeline (401 before 501 before 403
before 400 before the handler), the same status codes, reason phrases and bodies, UPID tasks
that take time and can fail, and API-token / ticket+CSRF authentication.

State lives where Proxmox keeps it, in Proxmox's formats (written with :mod:`gputopo.formats.pvefmt`):
``<pve_root>/nodes/<node>/lxc/<vmid>.conf``, ``nodes/<node>/qemu-server/<vmid>.conf`` and
``mapping/pci.cfg``. Runtime state (guest status, tasks, latencies, faults) is JSON under
``run_dir`` through :mod:`gputopo.sim.state`, so another process sees the same host.
"""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import ssl
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable
from urllib.parse import parse_qsl, unquote, urlsplit

from gputopo.formats import pvefmt
from gputopo.sim import state
from gputopo.sim.addresses import container_address

API_PREFIX = "/api2/json"

# Keys a running container takes at once (fast-plug) or hot-plugs (pve-container
# LXC/Config.pm:update_pct_config); anything else on a running CT stays pending.
FASTPLUG = {"description", "onboot", "startup", "protection", "hostname", "hookscript", "cores", "tags", "lock"}
HOTPLUG = {"cpulimit", "cpuunits", "memory", "swap"}
_INT_KEYS = {"cores", "memory", "swap", "cpuunits", "tty", "snaptime"}
_BOOL_KEYS = {"onboot", "unprivileged", "protection", "console", "template", "debug"}

ROOT_PRIVS = None  # root@pam has every privilege
OPERATOR_PRIVS = frozenset(
    {
        "VM.Audit", "VM.PowerMgmt", "VM.Config.Disk", "VM.Config.CPU", "VM.Config.Memory",
        "VM.Config.Network", "VM.Config.Options", "Mapping.Audit", "Mapping.Modify", "Mapping.Use",
        "Sys.Audit",
    }
)
_VM_CONFIG_ANY = ("VM.Config.Disk", "VM.Config.CPU", "VM.Config.Memory", "VM.Config.Network", "VM.Config.Options")

TASK_TYPES = {
    ("lxc", "start"): "vzstart", ("lxc", "stop"): "vzstop", ("lxc", "shutdown"): "vzshutdown",
    ("qemu", "start"): "qmstart", ("qemu", "stop"): "qmstop", ("qemu", "shutdown"): "qmshutdown",
}
DEFAULT_LATENCY = 0.05
# run-state names; "faults" belongs to the container simulator (gputopo.sim.container)
TASK_FAULTS = "task-faults"
API_FAULTS = "api-faults"


class ApiError(Exception):
    """An error answer: ``status``, ``message`` (full text, as Proxmox builds it), ``errors``."""

    def __init__(self, status: int, message: str, errors: dict | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.errors = errors


def die(msg: str) -> ApiError:
    """A plain Perl ``die "$msg\\n"``: status 500, the message with its newline."""
    return ApiError(500, msg + "\n")


def param_error(errors: dict[str, str]) -> ApiError:
    return ApiError(400, "Parameter verification failed.\n", errors)


def perm_error(what: str | None = None) -> ApiError:
    return ApiError(403, f"Permission check failed ({what})\n" if what else "Permission check failed\n")


class AuthFailed(Exception):
    """A 401 from the auth handler: no body, the reason phrase only."""


# --- parameter formats: each returns the converted value or raises ValueError(message) ------


def _fmt_int(v: Any) -> int:
    if isinstance(v, bool) or not re.match(r"^[+-]?\d+$", str(v)):
        raise ValueError(f"type check ('integer') failed - got '{v}'")
    return int(v)


def _fmt_vmid(v: Any) -> int:
    n = _fmt_int(v)
    if n < 100:
        raise ValueError("value must have a minimum value of 100")
    return n


def _fmt_bool(v: Any) -> bool:
    if v is True or v is False:
        return v
    if str(v) in ("0", "1"):
        return str(v) == "1"
    raise ValueError(f"type check ('boolean') failed - got '{v}'")


def _fmt_node(v: Any) -> str:
    if not re.match(r"^[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?$", str(v)):
        raise ValueError("invalid format - value does not look like a valid node name\n")
    return str(v)


def _fmt_configid(v: Any) -> str:
    if not re.match(r"^[a-z][a-z0-9_-]+$", str(v), re.IGNORECASE):
        raise ValueError(f"invalid format - invalid configuration ID '{v}'\n")
    return str(v)


def _fmt_configid_list(v: Any) -> list[str]:
    items = [x for x in re.split(r"[,;\s]+", ",".join(v) if isinstance(v, list) else str(v)) if x]
    for x in items:
        _fmt_configid(x.lstrip("!"))
    return items


def _fmt_string(max_len: int | None = None) -> Callable[[Any], str]:
    def f(v: Any) -> str:
        if isinstance(v, list):
            raise ValueError("type check ('string') failed - got ARRAY")
        if max_len is not None and len(str(v)) > max_len:
            raise ValueError(f"value may only be {max_len} characters long")
        return str(v)

    return f


def _fmt_enum(*values: str) -> Callable[[Any], str]:
    def f(v: Any) -> str:
        if str(v) not in values:
            raise ValueError(f"value '{v}' does not have a value in the enumeration '{', '.join(values)}'")
        return str(v)

    return f


class ItemErrors(ValueError):
    """Errors of an array parameter's items, keyed ``<name>[<i>]`` (JS:check_prop)."""

    def __init__(self, errors: dict[int, str]):
        super().__init__("; ".join(errors.values()))
        self.by_index = errors


def _fmt_map_array(v: Any) -> list[str]:
    # a single scalar is an array of one (RH:$normalize_legacy_param_formats)
    items = v if isinstance(v, list) else [v]
    errs = {}
    for i, item in enumerate(items):
        problems = pvefmt.map_entry_problems(str(item))
        if problems:
            errs[i] = "invalid format - format error\n" + "".join(f"map[{i}].{p}\n" for p in problems)
    if errs:
        raise ItemErrors(errs)
    return [str(x) for x in items]


@dataclass(frozen=True)
class P:
    """A parameter: its format and whether it may be left out."""

    fmt: Callable[[Any], Any]
    optional: bool = True


NODE = P(_fmt_node, False)
VMID = P(_fmt_vmid, False)
DIGEST = P(_fmt_string(64))


@dataclass
class Route:
    method: str
    pattern: str
    handler: str
    params: dict[str, P]
    perm: tuple[str, tuple[str, ...]] | None = None  # (acl path template, any-of privileges)
    extra: str | None = None  # "lxc": further parameters are container options
    regex: re.Pattern | None = None


_GUEST_STATUS_PARAMS = {"node": NODE, "vmid": VMID, "kind": P(_fmt_enum("lxc", "qemu"), False)}

ROUTES = [
    Route("GET", "/version", "version", {}),
    Route("GET", "/nodes", "nodes", {}),
    Route("GET", "/nodes/{node}/{kind}", "list_guests", {"node": NODE, "kind": P(_fmt_enum("lxc", "qemu"), False)}),
    Route("GET", "/nodes/{node}/lxc/{vmid}/config", "lxc_get", {"node": NODE, "vmid": VMID, "current": P(_fmt_bool), "snapshot": P(_fmt_string(40))}, ("/vms/{vmid}", ("VM.Audit",))),
    Route("PUT", "/nodes/{node}/lxc/{vmid}/config", "lxc_put", {"node": NODE, "vmid": VMID, "digest": DIGEST, "delete": P(_fmt_configid_list), "revert": P(_fmt_configid_list), "description": P(_fmt_string(8192))}, ("/vms/{vmid}", _VM_CONFIG_ANY), extra="lxc"),
    Route("GET", "/nodes/{node}/lxc/{vmid}/interfaces", "lxc_interfaces", {"node": NODE, "vmid": VMID}, ("/vms/{vmid}", ("VM.Audit",))),
    Route("GET", "/nodes/{node}/qemu/{vmid}/config", "qemu_get", {"node": NODE, "vmid": VMID, "current": P(_fmt_bool), "snapshot": P(_fmt_string(40))}, ("/vms/{vmid}", ("VM.Audit",))),
    Route("GET", "/nodes/{node}/{kind}/{vmid}/status/current", "guest_current", _GUEST_STATUS_PARAMS, ("/vms/{vmid}", ("VM.Audit",))),
    Route("POST", "/nodes/{node}/{kind}/{vmid}/status/start", "guest_start", {**_GUEST_STATUS_PARAMS, "skiplock": P(_fmt_bool), "timeout": P(_fmt_int), "debug": P(_fmt_bool)}, ("/vms/{vmid}", ("VM.PowerMgmt",))),
    Route("POST", "/nodes/{node}/{kind}/{vmid}/status/stop", "guest_stop", {**_GUEST_STATUS_PARAMS, "skiplock": P(_fmt_bool), "overrule-shutdown": P(_fmt_bool), "timeout": P(_fmt_int)}, ("/vms/{vmid}", ("VM.PowerMgmt",))),
    Route("POST", "/nodes/{node}/{kind}/{vmid}/status/shutdown", "guest_shutdown", {**_GUEST_STATUS_PARAMS, "timeout": P(_fmt_int), "forceStop": P(_fmt_bool)}, ("/vms/{vmid}", ("VM.PowerMgmt",))),
    Route("GET", "/nodes/{node}/tasks/{upid}/status", "task_status", {"node": NODE, "upid": P(_fmt_string(), False)}),
    Route("GET", "/nodes/{node}/tasks/{upid}/log", "task_log", {"node": NODE, "upid": P(_fmt_string(), False), "start": P(_fmt_int), "limit": P(_fmt_int), "download": P(_fmt_bool)}),
    Route("GET", "/nodes/{node}/hardware/pci", "hardware_pci", {"node": NODE, "pci-class-blacklist": P(_fmt_string()), "verbose": P(_fmt_bool)}),
    Route("GET", "/cluster/mapping/pci", "mapping_list", {"check-node": P(_fmt_node)}),
    Route("POST", "/cluster/mapping/pci", "mapping_create", {"id": P(_fmt_configid, False), "map": P(_fmt_map_array, False), "description": P(_fmt_string(4096)), "mdev": P(_fmt_bool), "live-migration-capable": P(_fmt_bool)}, ("/mapping/pci", ("Mapping.Modify",))),
    Route("GET", "/cluster/mapping/pci/{id}", "mapping_get", {"id": P(_fmt_configid, False)}, ("/mapping/pci/{id}", ("Mapping.Audit", "Mapping.Use", "Mapping.Modify"))),
    Route("PUT", "/cluster/mapping/pci/{id}", "mapping_update", {"id": P(_fmt_configid, False), "map": P(_fmt_map_array), "description": P(_fmt_string(4096)), "mdev": P(_fmt_bool), "live-migration-capable": P(_fmt_bool), "delete": P(_fmt_configid_list), "digest": DIGEST}, ("/mapping/pci", ("Mapping.Modify",))),
    Route("DELETE", "/cluster/mapping/pci/{id}", "mapping_delete", {"id": P(_fmt_configid, False)}, ("/mapping/pci", ("Mapping.Modify",))),
    Route("POST", "/access/ticket", "ticket", {"username": P(_fmt_string(64), False), "password": P(_fmt_string(), False), "realm": P(_fmt_string()), "otp": P(_fmt_string()), "tfa-challenge": P(_fmt_string()), "path": P(_fmt_string()), "privs": P(_fmt_string())}),
]
for _r in ROUTES:
    # {kind} is a literal path element in Proxmox (two routes), so it only matches lxc|qemu
    _r.regex = re.compile("^" + re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", _r.pattern.replace("{kind}", "(?P<kind>lxc|qemu)")) + "$")

NO_AUTH = {("POST", "/access/ticket"), ("GET", "/access/ticket"), ("GET", "/access/domains")}


@dataclass
class Caller:
    user: str  # "root@pam" or "root@pam!gputopo" for a token
    via: str  # "ticket" | "token" | "cli"

    @property
    def is_root_pam(self) -> bool:
        return self.user == "root@pam"


class _Result:
    def __init__(self, data: Any, **extra: Any):
        self.data = data
        self.extra = extra


class PveApiServer:
    """The simulated API server of one PVE node.

    Credentials are attributes: ``root_password`` (ticket login as root@pam),
    ``root_token_id``/``root_token_secret`` (token ``root@pam!gputopo``), ``operator_user``
    with ``operator_password`` and ``operator_token_id``/``operator_token_secret`` (a non-root
    user with VM and mapping privileges). ``hooks`` may have ``on_guest_start(kind, vmid)`` /
    ``on_guest_stop(kind, vmid)``; they run inside the task and an exception fails the task
    with its message. ``on_lxc_hotplug(vmid, key, value)`` runs after a running container's
    new ``devN`` was hot-plugged (PVE 9). A VM start does Proxmox's PCI passthrough on the
    sysfs root (mapping check, device choice, vfio-pci binding through new_id; see
    :mod:`gputopo.sim.passthrough`) and fails its task with Proxmox's message.
    """

    def __init__(
        self,
        pve_root: Path,
        run_dir: Path,
        sysfs_root: Path | None = None,
        node: str = "pve1",
        version: str = "8.4.1",
        tls: bool = True,
        hooks: Any = None,
        auth_fail_delay: float = 0.0,
        port: int = 0,
    ):
        self.listen_port = port
        self.pve_root = Path(pve_root)
        self.run_dir = Path(run_dir)
        self.sysfs_root = Path(sysfs_root) if sysfs_root is not None else None
        self.node = node
        self.version = version
        self.tls = tls
        self.hooks = hooks
        # a real node answers auth failures after 3 s; tests keep it at 0
        self.auth_fail_delay = auth_fail_delay
        self.root_user = "root@pam"
        self.root_password = secrets.token_urlsafe(12)
        self.root_token_id = "root@pam!gputopo"
        self.root_token_secret = str(uuid.uuid4())
        self.operator_user = "ops@pve"
        self.operator_password = secrets.token_urlsafe(12)
        self.operator_token_id = "ops@pve!gputopo"
        self.operator_token_secret = str(uuid.uuid4())
        self.ca_cert_path: Path | None = None
        self._lock = threading.RLock()
        self._tickets: dict[str, tuple[str, str]] = {}  # ticket -> (user, csrf)
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._timers: list[threading.Timer] = []
        self._layout()

    # --- lifecycle ------------------------------------------------------------------------

    def _layout(self) -> None:
        nd = self.pve_root / "nodes" / self.node
        for sub in ("lxc", "qemu-server"):
            (nd / sub).mkdir(parents=True, exist_ok=True)
        (self.pve_root / "mapping").mkdir(parents=True, exist_ok=True)
        for name, target in (("lxc", f"nodes/{self.node}/lxc"), ("qemu-server", f"nodes/{self.node}/qemu-server"), ("local", f"nodes/{self.node}")):
            link = self.pve_root / name
            if not link.is_symlink() and not link.exists():
                link.symlink_to(target)
        self.run_dir.mkdir(parents=True, exist_ok=True)

    def start(self) -> "PveApiServer":
        """Listen on 127.0.0.1 (``port`` 0: an ephemeral port) in a background thread; returns self."""
        handler = type("Handler", (_Handler,), {"server_obj": self})
        httpd = ThreadingHTTPServer(("127.0.0.1", self.listen_port), handler)
        httpd.daemon_threads = True
        if self.tls:
            from gputopo.sim.tls import make_ca_and_server_cert

            ca, cert, key = make_ca_and_server_cert(self.run_dir / "tls")
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(cert, key)
            httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
            self.ca_cert_path = ca
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="pveapi", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening and cancel pending task timers (their tasks finish on next read)."""
        for t in self._timers:
            t.cancel()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> "PveApiServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._httpd is not None, "server not started"
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}{API_PREFIX}"

    # --- knobs for tests and the simulated host -------------------------------------------

    def set_latency(self, task_type: str, seconds: float) -> None:
        """How long tasks of ``task_type`` (``vzstart``, ``qmstop``...) take from now on."""
        with state.locked(self.run_dir, "latencies"):
            lat = state.read_state(self.run_dir, "latencies", {}) or {}
            lat[task_type] = seconds
            state.write_state(self.run_dir, "latencies", lat)

    def inject_fault(self, task_type: str, vmid: int, message: str, count: int = 1) -> None:
        """Make the next ``count`` tasks of ``task_type`` for ``vmid`` fail with ``message``."""
        with state.locked(self.run_dir, TASK_FAULTS):
            faults = state.read_state(self.run_dir, TASK_FAULTS, []) or []
            faults.append({"type": task_type, "vmid": str(vmid), "message": message, "count": count})
            state.write_state(self.run_dir, TASK_FAULTS, faults)

    def inject_api_fault(self, method: str, path: str, message: str, status: int = 500, count: int = 1) -> None:
        """Make the next ``count`` ``method`` calls whose API path (below ``/api2/json``) matches
        the regex ``path`` fail with ``status`` and ``message``, as a node answers when pmxcfs
        cannot take its lock (``cfs-lock 'file-pci_mapping' error: got lock request timeout``)."""
        with state.locked(self.run_dir, API_FAULTS):
            faults = state.read_state(self.run_dir, API_FAULTS, []) or []
            faults.append({"method": method, "path": path, "message": message, "status": status, "count": count})
            state.write_state(self.run_dir, API_FAULTS, faults)

    def _take_api_fault(self, method: str, path: str) -> ApiError | None:
        if not (self.run_dir / f"{API_FAULTS}.json").exists():
            return None
        with state.locked(self.run_dir, API_FAULTS):
            faults = state.read_state(self.run_dir, API_FAULTS, []) or []
            for f in faults:
                if f["method"] == method and re.fullmatch(f["path"], path) and f["count"] > 0:
                    f["count"] -= 1
                    state.write_state(self.run_dir, API_FAULTS, [x for x in faults if x["count"] > 0])
                    return ApiError(int(f["status"]), f["message"].rstrip("\n") + "\n")
        return None

    def conf_path(self, kind: str, vmid: int) -> Path:
        sub = "lxc" if kind == "lxc" else "qemu-server"
        return self.pve_root / "nodes" / self.node / sub / f"{vmid}.conf"

    def write_conf(self, kind: str, vmid: int, text: str) -> None:
        """Place a guest config file (as ``pct create``/``qm create`` would leave it)."""
        _atomic_write(self.conf_path(kind, vmid), text)

    def mapping_path(self) -> Path:
        return self.pve_root / "mapping" / "pci.cfg"

    # --- request pipeline -----------------------------------------------------------------

    def authenticate(self, method: str, path: str, headers: Any) -> Caller | None:
        """The caller, or None for paths without auth. Raises AuthFailed with the phrase."""
        if (method, path) in NO_AUTH:
            return None
        auth = headers.get("Authorization", "") or ""
        m = re.match(r"^PVEAPIToken[= ](?P<user>[^!]+)!(?P<tid>[^=]+)=(?P<secret>.+)$", auth)
        if m:
            token = f"{m['user']}!{m['tid']}"
            known = {self.root_token_id: self.root_token_secret, self.operator_token_id: self.operator_token_secret}
            if known.get(token) is None or not secrets.compare_digest(known[token], m["secret"]):
                raise AuthFailed("Authentication failed!")
            return Caller(token, "token")
        ticket = None
        m = re.match(r"^PVEAuthCookie=(.+)$", auth)
        if m:
            ticket = unquote(m.group(1))
        else:
            for part in (headers.get("Cookie", "") or "").split(";"):
                k, _, v = part.strip().partition("=")
                if k == "PVEAuthCookie":
                    ticket = unquote(v)
        if not ticket:
            raise AuthFailed("No ticket")
        entry = self._tickets.get(ticket)
        if entry is None:
            raise AuthFailed("Authentication failed!")
        user, csrf = entry
        if method != "GET":
            got = headers.get("CSRFPreventionToken", "") or ""
            if not secrets.compare_digest(got, csrf):
                raise AuthFailed("Permission denied - invalid csrf token")
        return Caller(user, "ticket")

    @staticmethod
    def route(method: str, path: str) -> tuple[Route, dict[str, str]]:
        """The route of ``method path`` and its URI parameters. Raises ApiError 501."""
        for r in ROUTES:
            if r.method != method:
                continue
            m = r.regex.match(path)
            if m:
                return r, {k: unquote(v) for k, v in m.groupdict().items()}
        raise ApiError(501, f"Method '{method} {path}' not implemented")

    def dispatch(self, method: str, path: str, params: dict[str, Any], caller: Caller | None) -> _Result:
        """Route, check permissions and parameters, run the handler. Raises ApiError."""
        route, uri = self.route(method, path)
        for k, v in uri.items():
            if k in params and _perl_str(params[k]) != v:
                raise param_error({k: "duplicate parameter (already defined in URI) with conflicting values!"})
            params[k] = v
        if route.perm and caller is not None:
            acl, privs = route.perm
            if not self._has_any(caller, privs):
                # an any-of check on a single object reports no detail (RPCEnvironment check_any)
                raise perm_error(None if route.handler == "mapping_get" else f"{acl.format(**uri)}, {'|'.join(privs)}")
        values, errors = {}, {}
        for name, spec in route.params.items():
            if name not in params:
                if not spec.optional:
                    errors[name] = "property is missing and it is not optional"
                continue
            try:
                values[name] = spec.fmt(params[name])
            except ItemErrors as e:
                errors.update({f"{name}[{i}]": msg for i, msg in e.by_index.items()})
            except ValueError as e:
                errors[name] = str(e)
        for name, value in params.items():
            if name in route.params or name == "_dc":
                continue
            if route.extra == "lxc":
                why = pvefmt.check_lxc_option(name, str(value)) if re.match(r"^[a-z][a-z_]*\d*$", name) else "unknown setting"
                if why is None and name in _BOOL_KEYS:
                    try:  # the wire takes only 0/1 (JSONSchema check_type), the file parser more
                        value = int(_fmt_bool(value))
                    except ValueError as e:
                        why = str(e)
                if why and why.startswith("unknown setting"):
                    errors[name] = "property is not defined in schema and the schema does not allow additional properties"
                elif why:
                    errors[name] = why if why.startswith(("type check", "value ")) else f"invalid format - {why}\n"
                else:
                    values[name] = str(value)
            else:
                errors[name] = "property is not defined in schema and the schema does not allow additional properties"
        if errors:
            raise param_error(errors)
        if "node" in values and values["node"] != self.node:
            raise die(f"hostname lookup '{values['node']}' failed - failed to get address info for: {values['node']}: Name or service not known")
        fault = self._take_api_fault(method, path)
        if fault is not None:
            raise fault
        out = getattr(self, "h_" + route.handler)(caller, values)
        return out if isinstance(out, _Result) else _Result(out)

    def _has_any(self, caller: Caller, privs: tuple[str, ...]) -> bool:
        user = caller.user.split("!")[0]
        if user == "root@pam":
            return True
        if user == self.operator_user:
            return any(p in OPERATOR_PRIVS for p in privs)
        return False

    # --- handlers: access, version, nodes -------------------------------------------------

    def h_ticket(self, caller: Caller | None, p: dict) -> Any:
        user = p["username"]
        if "@" not in user and p.get("realm"):
            user = f"{user}@{p['realm']}"
        pw = p["password"]
        if pw in self._tickets and self._tickets[pw][0] == user:
            ok = True  # renewal: the old ticket serves as the password
        else:
            ok = (user, pw) in ((self.root_user, self.root_password), (self.operator_user, self.operator_password))
        if not ok:
            if self.auth_fail_delay:
                time.sleep(self.auth_fail_delay)
            raise ApiError(401, "authentication failure\n")
        now = f"{int(time.time()):08X}"
        sig = base64.b64encode(secrets.token_bytes(48)).decode()
        ticket = f"PVE:{user}:{now}::{sig}"
        csrf = f"{now}:{base64.b64encode(secrets.token_bytes(32)).decode().rstrip('=')}"
        self._tickets[ticket] = (user, csrf)
        privs = {"VM.Audit": 1, "VM.PowerMgmt": 1}
        return {
            "username": user, "ticket": ticket, "CSRFPreventionToken": csrf,
            "cap": {"vms": privs, "access": {}, "storage": {}, "nodes": {"Sys.Audit": 1}, "sdn": {}, "dc": {}, "mapping": {"Mapping.Modify": 1}},
        }

    def h_version(self, caller: Caller | None, p: dict) -> Any:
        return {"version": self.version, "release": ".".join(self.version.split(".")[:2]), "repoid": "5a6b8c9d0e1f2a3b"}

    def h_nodes(self, caller: Caller | None, p: dict) -> Any:
        return [{"id": f"node/{self.node}", "node": self.node, "type": "node", "status": "online", "uptime": 86400,
                 "cpu": 0.01, "mem": 8 << 30, "maxmem": 512 << 30, "disk": 10 << 30, "maxdisk": 100 << 30,
                 "maxcpu": 128, "level": "", "ssl_fingerprint": "00:11"}]

    # --- guests ---------------------------------------------------------------------------

    def _config_rel(self, kind: str, vmid: int) -> str:
        return f"nodes/{self.node}/{'lxc' if kind == 'lxc' else 'qemu-server'}/{vmid}.conf"

    def _load(self, kind: str, vmid: int) -> str:
        try:
            return self.conf_path(kind, vmid).read_text()
        except FileNotFoundError:
            raise die(f"Configuration file '{self._config_rel(kind, vmid)}' does not exist") from None

    def _guest_view(self, kind: str, vmid: int, text: str, current: bool, snapshot: str | None = None) -> dict:
        conf = pvefmt.parse_lxc_conf(text)
        if snapshot:
            # AbstractConfig load_current_config: that snapshot's keys, the file's digest
            snap = conf.snapshots.get(snapshot)
            if snap is None:
                raise die(f"snapshot '{snapshot}' does not exist")
            conf = pvefmt.LxcConf(options=snap.options, lxc=snap.lxc, description=snap.description)
        opts = dict(conf.options)
        if not current:
            opts.update({k: v for k, v in conf.pending.options.items() if k != "delete"})
            for k in conf.pending_delete:
                if _truthy(opts.get(k)):
                    opts.pop(k, None)
        out: dict[str, Any] = {k: _typed(k, v) for k, v in opts.items()}
        if conf.description:
            out["description"] = conf.description
        if conf.lxc and kind == "lxc":
            out["lxc"] = [[k, v] for k, v in conf.lxc]
        out["digest"] = pvefmt.sha1_digest(text)
        return out

    def h_list_guests(self, caller: Caller, p: dict) -> Any:
        kind = p["kind"]
        folder = self.conf_path(kind, 100).parent
        out = []
        for f in sorted(folder.glob("*.conf")):
            if not f.stem.isdigit():
                continue
            vmid = int(f.stem)
            if not self._has_any(caller, ("VM.Audit",)):
                continue
            opts = pvefmt.parse_lxc_conf(f.read_text()).options
            name = opts.get("hostname" if kind == "lxc" else "name") or f"{'CT' if kind == 'lxc' else 'VM'}{vmid}"
            item = {"vmid": vmid, "status": state.guest_status(self.run_dir, kind, vmid), "name": name,
                    "maxmem": int(opts.get("memory", 512)) << 20, "cpus": int(opts.get("cores", 1) or 1)}
            if kind == "lxc":
                item["type"] = "lxc"
            out.append(item)
        return out

    def h_lxc_get(self, caller: Caller, p: dict) -> Any:
        if p.get("snapshot") and p.get("current"):
            msg = "cannot use 'snapshot' parameter with 'current'"
            raise param_error({"snapshot": msg, "current": msg})
        text = self._load("lxc", p["vmid"])
        return self._guest_view("lxc", p["vmid"], text, bool(p.get("current")), p.get("snapshot"))

    def h_qemu_get(self, caller: Caller, p: dict) -> Any:
        text = self._load("qemu", p["vmid"])
        return self._guest_view("qemu", p["vmid"], text, bool(p.get("current")), p.get("snapshot"))

    def h_lxc_interfaces(self, caller: Caller, p: dict) -> Any:
        """The running container's interfaces as ``ip --json a`` inside it shows them
        (pve-container ``PVE::LXC::get_interfaces``: lo and eth0 with ``inet`` as address/prefix,
        ``hwaddr`` and ``hardware-address``, ``ip-addresses``); a stopped container has no pid to
        enter, so the answer is null (``get_interfaces`` returns early)."""
        vmid = p["vmid"]
        opts = pvefmt.parse_lxc_conf(self._load("lxc", vmid)).options
        if state.guest_status(self.run_dir, "lxc", vmid) != "running":
            return None
        net0 = dict(kv.split("=", 1) for kv in str(opts.get("net0", "")).split(",") if "=" in kv)
        mac = net0.get("hwaddr", "bc:24:11:00:00:00").lower()
        out = []
        for name, addr, prefix, hw in (("lo", "127.0.0.1", 8, "00:00:00:00:00:00"),
                                       (net0.get("name", "eth0"), container_address(vmid), 24, mac)):
            out.append({"name": name, "hwaddr": hw, "hardware-address": hw, "inet": f"{addr}/{prefix}",
                        "ip-addresses": [{"ip-address-type": "inet", "ip-address": addr, "prefix": prefix}]})
        return out

    def h_lxc_put(self, caller: Caller, p: dict) -> Any:
        vmid = p.pop("vmid")
        p.pop("node")
        digest = p.pop("digest", None)
        deletes = [d.lstrip("!") for d in p.pop("delete", [])]
        p.pop("revert", None)
        sets = p
        with self._lock:
            text = self._load("lxc", vmid)
            conf = pvefmt.parse_lxc_conf(text)
            lock = conf.options.get("lock")
            if lock:
                raise die(f"CT is locked ({lock})")
            if digest and pvefmt.sha1_digest(text) != digest:
                raise die("detected modified configuration - file changed by other user? Try again.")
            dev_rule = "configuring device passthrough is only allowed for root@pam"
            if caller is not None and not caller.is_root_pam and any(_is_dev(k) for k in deletes):
                raise perm_error(dev_rule)
            for k in deletes:
                why = pvefmt.check_lxc_option(k, "0")
                if k in sets:
                    raise param_error({"delete": f"cannot set and delete '{k}' at the same time"})
                if why and why.startswith("unknown setting") and k != "description":
                    raise param_error({"delete": f"unknown option '{k}'"})
            if caller is not None and not caller.is_root_pam and any(_is_dev(k) for k in sets):
                raise perm_error(dev_rule)
            if not sets and not deletes:
                raise die("no options specified")
            for k, v in sets.items():
                if _is_dev(k):
                    path = pvefmt.parse_dev_value(v)["path"]
                    if self.sysfs_root is not None and not os.path.exists(self.sysfs_root / path.lstrip("/")):
                        raise die(f"Device {path} does not exist")
            running = state.guest_status(self.run_dir, "lxc", vmid) == "running"
            major = int(self.version.split(".")[0])
            plugged = []
            pend = conf.pending
            pdel = [d for d in conf.pending_delete if d not in sets and d not in deletes]
            for k, v in sets.items():
                pend.options.pop(k, None)
                now = (
                    not running
                    or k in FASTPLUG
                    or k in HOTPLUG
                    or (re.match(r"^net\d+$", k) and k not in conf.options)
                    or (major >= 9 and _is_dev(k) and k not in conf.options)
                )
                if now:
                    if running and _is_dev(k):
                        plugged.append((k, v))
                    if k == "description":
                        conf.description = v
                    else:
                        conf.options[k] = v
                else:
                    pend.options[k] = v
            for k in deletes:
                pend.options.pop(k, None)
                if not running or k in FASTPLUG:
                    conf.options.pop(k, None)
                    if k == "description":
                        conf.description = None
                else:
                    pdel.append(k)
            if pdel:
                pend.options["delete"] = ",".join(pdel)
            else:
                pend.options.pop("delete", None)
            _atomic_write(self.conf_path("lxc", vmid), pvefmt.write_lxc_conf(conf))
        for k, v in plugged:
            if self.hooks is not None and hasattr(self.hooks, "on_lxc_hotplug"):
                self.hooks.on_lxc_hotplug(vmid, k, v)
        return None

    def h_guest_current(self, caller: Caller, p: dict) -> Any:
        kind, vmid = p["kind"], p["vmid"]
        opts = pvefmt.parse_lxc_conf(self._load(kind, vmid)).options
        status = state.guest_status(self.run_dir, kind, vmid)
        out: dict[str, Any] = {
            "vmid": vmid, "status": status, "uptime": 0, "cpu": 0, "cpus": int(opts.get("cores", 1) or 1),
            "maxmem": int(opts.get("memory", 512)) << 20, "mem": 0, "disk": 0, "maxdisk": 0, "netin": 0,
            "netout": 0, "diskread": 0, "diskwrite": 0, "ha": {"managed": 0},
        }
        if kind == "lxc":
            out.update(type="lxc", name=opts.get("hostname") or f"CT{vmid}", swap=0, maxswap=int(opts.get("swap", 512)) << 20)
        else:
            out.update(name=opts.get("name") or f"VM{vmid}", qmpstatus=status)
        if status == "running":
            out["pid"] = 4242 + vmid
        if opts.get("lock"):
            out["lock"] = opts["lock"]
        return out

    def _guest_action(self, caller: Caller, p: dict, action: str) -> str:
        kind, vmid = p["kind"], p["vmid"]
        who = "CT" if kind == "lxc" else "VM"
        if action != "start" or kind == "qemu":
            self._load(kind, vmid)
        running = state.guest_status(self.run_dir, kind, vmid) == "running"
        if action == "start" and running:
            raise die(f"{who} {vmid} already running")
        if action != "start" and not running:
            raise die(f"{who} {vmid} not running")
        return self._new_task(TASK_TYPES[(kind, action)], kind, vmid, action, caller.user if caller else "root@pam")

    def h_guest_start(self, caller: Caller, p: dict) -> Any:
        return self._guest_action(caller, p, "start")

    def h_guest_stop(self, caller: Caller, p: dict) -> Any:
        return self._guest_action(caller, p, "stop")

    def h_guest_shutdown(self, caller: Caller, p: dict) -> Any:
        return self._guest_action(caller, p, "shutdown")

    # --- tasks ----------------------------------------------------------------------------

    def _new_task(self, ttype: str, kind: str, vmid: int, action: str, user: str) -> str:
        with state.locked(self.run_dir, "tasks"):
            tasks = state.read_state(self.run_dir, "tasks", {}) or {}
            pid = 100000 + len(tasks)
            start = int(time.time())
            pstart = 1000000 + len(tasks)
            # the UPID names the caller as it authenticated, a token as "user@realm!tokenid";
            # the status answer splits that (pve-manager API2/Tasks.pm $convert_token_task)
            upid = f"UPID:{self.node}:{pid:08X}:{pstart:08X}:{start:08X}:{ttype}:{vmid}:{user}:"
            lat = (state.read_state(self.run_dir, "latencies", {}) or {}).get(ttype, DEFAULT_LATENCY)
            tasks[upid] = {
                "upid": upid, "node": self.node, "pid": pid, "pstart": pstart, "starttime": start,
                "type": ttype, "id": str(vmid), "user": user.split("!")[0], "status": "running",
                "kind": kind, "vmid": vmid, "action": action, "due": time.time() + lat, "log": [],
            }
            if "!" in user:
                tasks[upid]["tokenid"] = user.split("!", 1)[1]
            state.write_state(self.run_dir, "tasks", tasks)
        timer = threading.Timer(lat, self._finish_task, (upid,))
        timer.daemon = True
        self._timers.append(timer)
        timer.start()
        return upid

    def _take_fault(self, ttype: str, vmid: int) -> str | None:
        with state.locked(self.run_dir, TASK_FAULTS):
            faults = state.read_state(self.run_dir, TASK_FAULTS, []) or []
            for f in faults:
                if f["type"] == ttype and f["vmid"] == str(vmid) and f["count"] > 0:
                    f["count"] -= 1
                    state.write_state(self.run_dir, TASK_FAULTS, [x for x in faults if x["count"] > 0])
                    return f["message"]
        return None

    def _finish_task(self, upid: str) -> None:
        """Run a task's effect once (timer or a status read after its due time)."""
        # Claim the task under the lock, then run it without: a VM start can block in the
        # kernel (an unbind of a held GPU) while other tasks, such as the container's stop that
        # releases the GPU, must still run, as on a real node.
        with state.locked(self.run_dir, "task-run"):
            with state.locked(self.run_dir, "tasks"):
                tasks = state.read_state(self.run_dir, "tasks", {}) or {}
                task = tasks.get(upid)
                if task is None or task["status"] == "stopped" or task.get("claimed"):
                    return
                task["claimed"] = True
                state.write_state(self.run_dir, "tasks", tasks)
        kind, vmid, action = task["kind"], task["vmid"], task["action"]
        log: list[str] = []
        try:
            fault = self._take_fault(task["type"], vmid)
            if fault:
                raise RuntimeError(fault)
            if action == "start":
                with self._lock:
                    text = self._load(kind, vmid)
                    if kind == "lxc":
                        conf = pvefmt.parse_lxc_conf(text)
                        if conf.options.get("template") in ("1",):
                            raise RuntimeError("you can't start a CT if it's a template")
                        if not conf.pending.is_empty():
                            _apply_pending(conf)
                            _atomic_write(self.conf_path(kind, vmid), pvefmt.write_lxc_conf(conf))
                if kind == "qemu":
                    self._qemu_pci_start(vmid, text)
                if self.hooks is not None and hasattr(self.hooks, "on_guest_start"):
                    self.hooks.on_guest_start(kind, vmid)
                state.set_guest_status(self.run_dir, kind, vmid, "running")
            else:
                if self.hooks is not None and hasattr(self.hooks, "on_guest_stop"):
                    self.hooks.on_guest_stop(kind, vmid)
                state.set_guest_status(self.run_dir, kind, vmid, "stopped")
                if kind == "qemu":
                    self._passthrough().release(vmid)
            exitstatus = "OK"
            log.append("TASK OK")
        except ApiError as e:
            exitstatus = e.message.rstrip("\n").replace("\n", " ")
            log += [exitstatus, f"TASK ERROR: {exitstatus}"]
        except Exception as e:  # a hook or a fault: the task fails with its message
            exitstatus = (str(e).rstrip("\n") or type(e).__name__).replace("\n", " ")
            log += [exitstatus, f"TASK ERROR: {exitstatus}"]
        with state.locked(self.run_dir, "tasks"):
            tasks = state.read_state(self.run_dir, "tasks", {}) or {}
            tasks[upid].update(status="stopped", exitstatus=exitstatus, log=log)
            state.write_state(self.run_dir, "tasks", tasks)

    def _passthrough(self) -> Any:
        """The VM-start PCI handling over this node's sysfs root (gputopo.sim.passthrough)."""
        from gputopo.sim.kernel import SimKernel
        from gputopo.sim.passthrough import Passthrough

        def write(path: str, value: str) -> None:
            if self.sysfs_root is None:
                raise RuntimeError("no simulated sysfs root")
            SimKernel(str(self.sysfs_root)).write(path, value)

        return Passthrough(self.sysfs_root or Path("/nonexistent"), self.run_dir, self.node, write,
                           self._assert_valid)

    def _qemu_pci_start(self, vmid: int, text: str) -> None:
        """Proxmox's PCI passthrough at VM start (qemu-server PCI.pm); see gputopo.sim.passthrough.

        Raises PassthroughError with Proxmox's message, which fails the task.
        """
        opts = {k: v for k, v in pvefmt.parse_lxc_conf(text).options.items() if k.startswith("hostpci")}
        if not opts:
            return
        _, maps = self._read_mappings()
        self._passthrough().start(vmid, opts, maps)

    def _task(self, p: dict) -> dict:
        upid = p["upid"]
        if not re.match(r"^UPID:[a-zA-Z0-9-]+:[0-9A-F]{8}:[0-9A-F]{8,9}:[0-9A-F]{8}:[^:\s]+:[^:\s]*:[^:\s]+:$", upid):
            raise param_error({"upid": "unable to parse worker upid"})
        task = (state.read_state(self.run_dir, "tasks", {}) or {}).get(upid)
        if task is None:
            raise param_error({"upid": "no such task"})
        if task["status"] == "running" and time.time() >= task["due"]:
            self._finish_task(upid)
            task = state.read_state(self.run_dir, "tasks", {})[upid]
        return task

    def h_task_status(self, caller: Caller, p: dict) -> Any:
        task = self._task(p)
        keys = ["upid", "node", "pid", "pstart", "starttime", "type", "id", "user", "status", "tokenid"]
        out = {k: task[k] for k in keys if k in task}
        if task["status"] == "stopped":
            out["exitstatus"] = task["exitstatus"]
        return out

    def h_task_log(self, caller: Caller, p: dict) -> Any:
        lines = self._task(p).get("log") or []
        start, limit = p.get("start", 0), p.get("limit", 50)
        if not lines:
            return _Result([{"n": 1, "t": "no content"}], total=1)
        return _Result([{"n": i + 1, "t": t} for i, t in enumerate(lines)][start : start + limit], total=len(lines))

    # --- hardware -------------------------------------------------------------------------

    def h_hardware_pci(self, caller: Caller, p: dict) -> Any:
        from gputopo.facts.pci import list_pci_functions

        if not self._has_any(caller, ("Sys.Audit",)) if caller else False:
            raise perm_error("/nodes/" + self.node + ", Sys.Audit")
        if self.sysfs_root is None:
            return []
        blacklist = [c for c in re.split(r"[;,\s]+", p.get("pci-class-blacklist", "05;06;0b")) if c]
        verbose = p.get("verbose", True)
        out = []
        for f in list_pci_functions(self.sysfs_root):
            klass = f.class_ or "0x000000"
            if any(klass[2:].startswith(b.lower()) for b in blacklist):
                continue
            item: dict[str, Any] = {"id": f.address, "class": klass, "vendor": f.vendor, "device": f.device,
                                    "iommugroup": f.iommu_group if f.iommu_group is not None else -1}
            if verbose:
                if f.subsystem_vendor:
                    item["subsystem_vendor"] = f.subsystem_vendor
                if f.subsystem_device:
                    item["subsystem_device"] = f.subsystem_device
            if f.vendor == "0x10de":
                item["nvidia"] = 1
            out.append(item)
        return sorted(out, key=lambda i: i["id"])

    # --- PCI mappings ---------------------------------------------------------------------

    def _read_mappings(self) -> tuple[str, list[pvefmt.PciMapping]]:
        try:
            text = self.mapping_path().read_text()
        except FileNotFoundError:
            text = ""
        return text, pvefmt.parse_pci_cfg(text)

    def _mapping_item(self, mp: pvefmt.PciMapping, digest: str) -> dict:
        item: dict[str, Any] = {"id": mp.id, "type": "pci", "map": list(mp.maps), "digest": digest}
        if mp.description is not None:
            item["description"] = mp.description
        if mp.mdev is not None:
            item["mdev"] = int(mp.mdev)
        if mp.live_migration_capable is not None:
            item["live-migration-capable"] = int(mp.live_migration_capable)
        return item

    def h_mapping_list(self, caller: Caller, p: dict) -> Any:
        check = p.get("check-node")
        if check is not None and check != self.node:
            raise die(f"wrong node to check - {check} != {self.node}")
        text, maps = self._read_mappings()
        digest = pvefmt.sha1_digest(text)
        out = []
        for mp in maps:
            if caller is not None and not self._has_any(caller, ("Mapping.Audit", "Mapping.Use", "Mapping.Modify")):
                continue
            item = self._mapping_item(mp, digest)
            if check is not None:
                item["checks"] = self._check_mapping(mp, check)
            out.append(item)
        return out

    def _check_mapping(self, mp: pvefmt.PciMapping, node: str) -> list[dict]:
        entries = []
        for raw in mp.maps:
            kv = dict(x.split("=", 1) for x in raw.split(",") if "=" in x)
            if kv.get("node") == node:
                entries.append(kv)
        if not entries:
            return [{"severity": "warning", "message": f"No mapping for node {node}."}]
        checks = []
        for kv in entries:
            err = self._assert_valid(mp.id, kv)
            if err:
                checks.append({"severity": "error", "message": f"Invalid configuration: {err}\n"})
        return checks

    def _assert_valid(self, name: str, cfg: dict[str, str]) -> str | None:
        """pve-guest-common Mapping/PCI.pm:assert_valid against the simulated sysfs."""
        from gputopo.facts.pci import read_pci_function

        for idx, path in enumerate((cfg.get("path") or "").split(";")):
            if not re.search(r"\.[0-9a-f]$", path, re.IGNORECASE):
                path = f"{path}.0"
            try:
                info = read_pci_function(self.sysfs_root, path) if self.sysfs_root is not None else None
            except Exception:
                info = None
            if info is None:
                return f"pci device '{path}' not found"
            expected = {"id": f"{info.vendor}:{info.device}".replace("0x", ""),
                        "iommugroup": str(info.iommu_group if info.iommu_group is not None else -1)}
            if info.subsystem_vendor and info.subsystem_device:
                expected["subsystem-id"] = f"{info.subsystem_vendor}:{info.subsystem_device}".replace("0x", "")
            configured = {k: cfg[k] for k in ("id", "iommugroup", "subsystem-id") if k in cfg}
            for prop in sorted(set(expected) | set(configured)):
                if prop == "iommugroup" and idx > 0:
                    continue
                if prop in expected and prop not in configured:
                    return f"missing expected property '{prop}' for device '{path}'"
                if prop not in expected and prop in configured:
                    return f"unexpected property '{prop}' configured for device '{path}'"
                e, c = expected[prop].replace("0x", ""), configured[prop].replace("0x", "")
                if e != c:
                    return f"'{prop}' does not match for '{name}' ({e} != {c})"
        return None

    def h_mapping_get(self, caller: Caller, p: dict) -> Any:
        text, maps = self._read_mappings()
        for mp in maps:
            if mp.id == p["id"]:
                item = self._mapping_item(mp, pvefmt.sha1_digest(text))
                del item["id"]
                return item
        raise die(f"mapping '{p['id']}' not found")

    def _apply_mapping_props(self, mp: pvefmt.PciMapping, p: dict) -> None:
        if "map" in p:
            mp.maps = p["map"]
        if "description" in p:
            mp.description = p["description"]
        if "mdev" in p:
            mp.mdev = p["mdev"]
        if "live-migration-capable" in p:
            mp.live_migration_capable = p["live-migration-capable"]

    def h_mapping_create(self, caller: Caller, p: dict) -> Any:
        with self._lock:
            _, maps = self._read_mappings()
            if any(m.id == p["id"] for m in maps):
                raise die(f"create hardware mapping failed: pci ID '{p['id']}' already defined")
            mp = pvefmt.PciMapping(id=p["id"])
            self._apply_mapping_props(mp, p)
            _atomic_write(self.mapping_path(), pvefmt.write_pci_cfg(maps + [mp]))
        return None

    def h_mapping_update(self, caller: Caller, p: dict) -> Any:
        prefix = "update hardware mapping failed: "
        with self._lock:
            text, maps = self._read_mappings()
            if p.get("digest") and pvefmt.sha1_digest(text) != p["digest"]:
                raise die(prefix + "detected modified configuration - file changed by other user? Try again.")
            mp = next((m for m in maps if m.id == p["id"]), None)
            if mp is None:
                raise die(prefix + f"pci ID '{p['id']}' does not exist")
            deletes = p.get("delete", [])
            if "map" in deletes:
                raise die(prefix + "unable to delete required option 'map'")
            if "map" not in p:
                raise die(prefix + "missing value for required option 'map'")
            for k in deletes:
                if k == "description":
                    mp.description = None
                elif k == "mdev":
                    mp.mdev = None
                elif k == "live-migration-capable":
                    mp.live_migration_capable = None
                else:
                    raise die(prefix + f"invalid key '{k}' in 'delete'")  # not a mapping property
            self._apply_mapping_props(mp, p)
            _atomic_write(self.mapping_path(), pvefmt.write_pci_cfg(maps))
        return None

    def h_mapping_delete(self, caller: Caller, p: dict) -> Any:
        with self._lock:
            _, maps = self._read_mappings()
            keep = [m for m in maps if m.id != p["id"]]
            if len(keep) != len(maps):
                _atomic_write(self.mapping_path(), pvefmt.write_pci_cfg(keep))
        return None


def _is_dev(key: str) -> bool:
    return re.match(r"^dev\d+$", key) is not None


def _truthy(v: str | None) -> bool:
    return v not in (None, "", "0")


def _typed(key: str, value: str) -> Any:
    if key in _INT_KEYS and re.match(r"^-?\d+$", value):
        return int(value)
    if key in _BOOL_KEYS:
        return 1 if value.lower() in ("1", "yes", "on", "true") else 0
    return value


def _apply_pending(conf: pvefmt.LxcConf) -> None:
    for k in conf.pending_delete:
        conf.options.pop(k, None)
    for k, v in conf.pending.options.items():
        if k != "delete":
            conf.options[k] = v
    conf.pending = pvefmt.LxcSection()


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _perl_str(v: Any) -> Any:
    """A JSON value as Perl's ``ne`` sees it: numbers and booleans compare as their text."""
    if isinstance(v, bool):
        return "1" if v else "0"
    return str(v) if isinstance(v, (int, float)) else v


class BadBody(Exception):
    """A request body that cannot become parameters."""


def _merge(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """Form pairs to a dict; a repeated key (``map=a&map=b``) becomes a list."""
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            out[k] = (out[k] if isinstance(out[k], list) else [out[k]]) + [v]
        else:
            out[k] = v
    return out


class _Handler(BaseHTTPRequestHandler):
    server_obj: PveApiServer
    protocol_version = "HTTP/1.1"
    server_version = "pve-api-daemon/3.0"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
        pass

    def _params(self) -> dict[str, Any]:
        url = urlsplit(self.path)
        pairs: list[tuple[str, Any]] = []
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if body:
            ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip()
            if ctype == "application/json":
                try:
                    obj = json.loads(body)
                except ValueError as e:
                    raise BadBody(f"unable to parse JSON body - {e}") from None
                if not isinstance(obj, dict):
                    raise BadBody("unable to parse JSON body - not an object")
                pairs += list(obj.items())
            else:
                pairs += parse_qsl(body.decode(), keep_blank_values=True)
        params = _merge(pairs)
        params.update(_merge(parse_qsl(url.query, keep_blank_values=True)))  # the query string wins
        params.pop("_dc", None)
        return params

    def _handle(self, method: str) -> None:
        srv = self.server_obj
        path = urlsplit(self.path).path
        try:
            params = self._params()
        except BadBody as e:
            # the daemon answers every request; the exact text of this 400 is not in the wire doc
            return self._send(400, str(e), {"data": None, "message": str(e) + "\n"})
        if not path.startswith(API_PREFIX + "/"):
            return self._send(501, f"Method '{method} {path}' not implemented", None)
        rel = path[len(API_PREFIX):].rstrip("/") or "/"
        try:
            caller = srv.authenticate(method, rel, self.headers)
        except AuthFailed as e:
            if srv.auth_fail_delay:
                time.sleep(srv.auth_fail_delay)
            return self._send(401, str(e), None)
        try:
            result = srv.dispatch(method, rel, params, caller)
        except ApiError as e:
            body: dict[str, Any] = {"data": None, "message": e.message}
            if e.errors is not None:
                body["errors"] = e.errors
            return self._send(e.status, e.message, body)
        return self._send(200, "OK", {"data": result.data, **result.extra})

    def _send(self, status: int, message: str, body: dict | None) -> None:
        reason = message.split("\n", 1)[0]
        payload = b"" if body is None else json.dumps(body).encode()
        self.send_response(status, reason)
        if body is not None:
            self.send_header("Content-Type", "application/json;charset=UTF-8")
        self.send_header("Cache-Control", "max-age=0")
        self.send_header("Pragma", "no-cache")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_DELETE(self) -> None:
        self._handle("DELETE")


FORMAT_OPTIONS = ("output-format", "quiet", "noproxy")


def _cli_option(route: Route, name: str) -> bool:
    if name in route.params:
        return True
    if route.extra == "lxc" and re.match(r"^[a-z][a-z_]*\d*$", name):
        why = pvefmt.check_lxc_option(name, "")
        return not (why and why.startswith("unknown setting"))
    return False


def _cli_boolean(route: Route, name: str) -> bool:
    spec = route.params.get(name)
    if spec is not None:
        return spec.fmt is _fmt_bool
    return route.extra == "lxc" and name in _BOOL_KEYS


class PveshSim:
    """``pvesh`` on the simulated node, as a runner for the local backend (wire doc section 6).

    Call it as ``runner(argv, timeout) -> (stdout, stderr, rc)``. It runs as root@pam without
    the API permission check, takes ``-k v``/``--k v`` options (a repeated option becomes an
    array), prints canonical JSON (nothing for a null result), runs tasks synchronously, and
    reports errors on stderr the way Perl prints them.
    """

    VERBS = {"get": "GET", "set": "PUT", "create": "POST", "delete": "DELETE"}

    def __init__(self, server: PveApiServer):
        self.server = server
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str], timeout: float) -> tuple[str, str, int]:
        self.calls.append(list(argv))
        if len(argv) < 3 or argv[0] != "pvesh" or argv[1] not in self.VERBS:
            return "", "USAGE: pvesh <COMMAND> [ARGS] [OPTIONS]\n", 255
        method, path = self.VERBS[argv[1]], "/" + argv[2].strip("/")
        try:
            route, _ = self.server.route(method, path)
        except ApiError:
            return "", f"No '{argv[1]}' handler defined for '{path}'\n", 1
        params: dict[str, Any] = {}
        rest = argv[3:]
        i = 0
        while i < len(rest):
            m = re.match(r"^--?([a-zA-Z][\w-]*)$", rest[i])
            k = m.group(1) if m else rest[i]
            # JS:get_options offers only the method's own parameters (Getopt::Long)
            if not m or i + 1 >= len(rest) or not (k in FORMAT_OPTIONS or _cli_option(route, k)):
                return "", f"Unknown option: {k}\n400 unable to parse option\n", 255
            v = rest[i + 1]
            i += 2
            if k in FORMAT_OPTIONS:
                continue
            if _cli_boolean(route, k):
                # JS:parse_boolean, for boolean parameters only
                v = {"yes": "1", "on": "1", "true": "1", "no": "0", "off": "0", "false": "0"}.get(v.lower(), v)
            params[k] = (params[k] if isinstance(params[k], list) else [params[k]]) + [v] if k in params else v
        try:
            result = self.server.dispatch(method, path, params, Caller("root@pam", "cli"))
        except ApiError as e:
            if e.status == 500 and e.errors is None:
                return "", e.message, 255
            lines = f"{e.status} {e.message}"
            for k, v in (e.errors or {}).items():
                lines += f"{k}: {v}\n"
            return "", lines, 255
        data = result.data
        if isinstance(data, str) and data.startswith("UPID:"):
            self.server._finish_task(data)
            task = state.read_state(self.server.run_dir, "tasks", {})[data]
            err = "" if task["exitstatus"] == "OK" else task["exitstatus"] + "\n"
            return json.dumps(data) + "\n", err, 0
        if data is None:
            return "", "", 0
        return json.dumps(data, sort_keys=True, separators=(",", ":")) + "\n", "", 0
