"""The real Proxmox VE adapter: :class:`ProxmoxClient` implements ``ProxmoxPort`` over proxmoxer.

Two backends: ``https`` (API token, or a root@pam password turned into a ticket) and ``local``
(``pvesh`` on the node itself, through proxmoxer's local backend). Secrets come only from the
environment (``GPUTOPO_PVE_PASSWORD``, ``GPUTOPO_PVE_TOKEN`` = ``user@realm!tokenid=secret``,
``GPUTOPO_PVE_TOKEN_SECRET``) or from an owner-only file; they never appear in ``repr``, logs
or error messages.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Literal

from pydantic import BaseModel, ConfigDict

from gputopo.errors import ConfigError, ProxmoxError, TaskFailed

ENV_PASSWORD = "GPUTOPO_PVE_PASSWORD"
ENV_TOKEN = "GPUTOPO_PVE_TOKEN"
ENV_TOKEN_SECRET = "GPUTOPO_PVE_TOKEN_SECRET"

# runner(argv, timeout) -> (stdout, stderr, returncode): how the local backend runs pvesh
Runner = Callable[[list[str], float], tuple[str, str, int]]


class ApiConfig(BaseModel):
    """Where and as whom to reach the Proxmox API. Holds no secret.

    ``secret_file`` names an owner-only file holding the password (password login) or the
    token secret (``token_name`` set); the environment variables take precedence.
    """

    model_config = ConfigDict(extra="forbid")

    backend: Literal["https", "local"] = "https"
    host: str = "127.0.0.1"
    port: int = 8006
    node: str = "pve1"
    user: str = "root@pam"
    token_name: str | None = None
    verify_ssl: bool = True
    ca_bundle: str | None = None
    timeout: float = 60.0
    task_timeout: float = 300.0
    poll_interval: float = 0.5
    secret_file: str | None = None


def read_secret_file(path: str) -> str:
    """The first line of ``path``; refuses a file that group or others can read.

    Raises ConfigError naming the file when it is missing, unreadable or not owner-only.
    """
    try:
        st = os.stat(path)
    except OSError as e:
        raise ConfigError(f"{path}: cannot read secret file ({e.strerror})") from None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(f"{path}: secret file must be readable by its owner only (mode {stat.S_IMODE(st.st_mode):04o}; chmod 600 it)")
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read secret file ({e.strerror})") from None
    secret = text.strip().splitlines()[0] if text.strip() else ""
    if not secret:
        raise ConfigError(f"{path}: secret file is empty")
    return secret


def _resolve_auth(cfg: ApiConfig, env: dict[str, str]) -> tuple[str, str | None, str | None, str | None]:
    """(user, token_name, token_secret, password) from the environment or the secret file."""
    user, token_name = cfg.user, cfg.token_name
    full = env.get(ENV_TOKEN)
    if full:
        m = re.match(r"^(?P<user>[^!\s]+@[^!\s]+)!(?P<tid>[A-Za-z][A-Za-z0-9._-]*)=(?P<secret>\S+)$", full)
        if not m:
            raise ConfigError(f"{ENV_TOKEN}: expected user@realm!tokenid=secret")
        return m["user"], m["tid"], m["secret"], None
    if token_name:
        secret = env.get(ENV_TOKEN_SECRET) or (read_secret_file(cfg.secret_file) if cfg.secret_file else None)
        if not secret:
            raise ConfigError(f"token {user}!{token_name}: set {ENV_TOKEN_SECRET} or a secret file")
        return user, token_name, secret, None
    password = env.get(ENV_PASSWORD) or (read_secret_file(cfg.secret_file) if cfg.secret_file else None)
    if not password:
        raise ConfigError(f"{user}: no credentials: set {ENV_PASSWORD}, {ENV_TOKEN} or a secret file")
    return user, None, None, password


def _default_runner(argv: list[str], timeout: float) -> tuple[str, str, int]:
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise ConfigError(f"{argv[0]}: not found (the local backend runs on the Proxmox node itself)") from None
    except subprocess.TimeoutExpired:
        raise ProxmoxError(f"{argv[0]} {argv[1]} {argv[2]}", None, f"timed out after {timeout:g} s") from None
    return p.stdout, p.stderr, p.returncode


class ProxmoxClient:
    """``ProxmoxPort`` over proxmoxer. Build it with :meth:`from_config`.

    Every call raises :class:`ProxmoxError` (call, HTTP status, PVE's first-line message,
    its ``errors`` dict) when Proxmox refuses it; ``guest_action`` raises :class:`TaskFailed`.
    """

    def __init__(self, api: Any, cfg: ApiConfig, user: str, token_name: str | None, runner: Runner | None = None):
        self._api = api
        self._cfg = cfg
        self.node = cfg.node
        self._user = user
        self._token_name = token_name
        self._runner = runner

    def __repr__(self) -> str:
        who = f"{self._user}!{self._token_name}" if self._token_name else self._user
        where = "local pvesh" if self._cfg.backend == "local" else f"https://{self._cfg.host}:{self._cfg.port}"
        return f"ProxmoxClient({who} at {where}, node {self.node})"

    __str__ = __repr__

    @classmethod
    def from_config(cls, cfg: ApiConfig, env: dict[str, str] | None = None, runner: Runner | None = None) -> "ProxmoxClient":
        """Connect as ``cfg`` says. ``env`` defaults to ``os.environ``; ``runner`` replaces the
        way the local backend runs ``pvesh`` (tests pass a fake).

        Raises ConfigError for missing/unsafe credentials or options, ProxmoxError when the
        password login is refused.
        """
        from proxmoxer import ProxmoxAPI
        from proxmoxer.core import AuthenticationError

        env = dict(os.environ if env is None else env)
        if cfg.backend == "local":
            api = ProxmoxAPI(backend="local", service="PVE", timeout=cfg.timeout)
            run = runner or _default_runner
            # proxmoxer's LocalSession runs Popen itself; route it through our runner instead
            session = api._store["session"]
            session._exec = lambda cmd: run(list(cmd), cfg.timeout)
            return cls(api, cfg, "root@pam", None, run)
        user, token_name, token_secret, password = _resolve_auth(cfg, env)
        if cfg.ca_bundle and not os.path.isfile(cfg.ca_bundle):
            raise ConfigError(f"{cfg.ca_bundle}: CA bundle not found")
        verify: bool | str = cfg.ca_bundle if (cfg.verify_ssl and cfg.ca_bundle) else cfg.verify_ssl
        kw: dict[str, Any] = dict(host=cfg.host, port=cfg.port, user=user, verify_ssl=verify, timeout=cfg.timeout, service="PVE")
        try:
            if token_name:
                api = ProxmoxAPI(backend="https", token_name=token_name, token_value=token_secret, **kw)
            else:
                api = ProxmoxAPI(backend="https", password=password, **kw)
        except AuthenticationError:
            raise ProxmoxError("POST /access/ticket", 401, f"authentication failure for {user}") from None
        except Exception as e:  # requests' connection/TLS errors; never echo the secret
            raise ProxmoxError(f"connect https://{cfg.host}:{cfg.port}", None, _scrub(str(e).splitlines()[0] if str(e) else type(e).__name__, password, token_secret)) from None
        return cls(api, cfg, user, token_name)

    # --- plumbing -------------------------------------------------------------------------

    def _call(self, method: str, path: str, **params: Any) -> Any:
        from proxmoxer.core import ResourceException

        call = f"{method} {path}"
        res = self._api(path.lstrip("/"))
        try:
            if method == "GET":
                return res.get(**params)
            if method == "POST":
                return res.post(**params)
            if method == "PUT":
                return res.put(**params)
            return res.delete(**params)
        except ResourceException as e:
            message = str(e.content or e.status_message or "").strip().splitlines()
            errors = e.errors if isinstance(e.errors, dict) and "errors" not in e.errors else None
            raise ProxmoxError(call, e.status_code, message[0] if message else "", errors) from None
        except ProxmoxError:
            raise
        except Exception as e:
            raise ProxmoxError(call, None, str(e).splitlines()[0] if str(e) else type(e).__name__) from None

    def _n(self) -> str:
        return f"/nodes/{self.node}"

    # --- ProxmoxPort ----------------------------------------------------------------------

    def version(self) -> dict[str, Any]:
        """GET /version: ``{version, release, repoid}``."""
        return self._call("GET", "/version")

    def identity(self) -> str:
        """The authenticated user id (``root@pam!gputopo`` for a token; root@pam for pvesh)."""
        return f"{self._user}!{self._token_name}" if self._token_name else self._user

    def can_change_devices(self) -> tuple[bool, str]:
        """Whether this login may set or delete ``devN`` (Proxmox allows only root@pam).

        Returns (ok, why): ``why`` says what works when ``ok`` is False.
        """
        if self._cfg.backend == "local":
            return True, "pvesh on the node runs as root@pam"
        if self._token_name:
            return False, (f"API token {self.identity()} may not configure device passthrough (devN): only root@pam may; "
                           f"log in with a ticket as root@pam ({ENV_PASSWORD}) or use the local backend on the node")
        if self._user != "root@pam":
            return False, (f"user {self._user} may not configure device passthrough (devN): only root@pam may; "
                           f"log in as root@pam ({ENV_PASSWORD}) or use the local backend on the node")
        return True, "ticket login as root@pam"

    def lxc_config(self, vmid: int) -> dict[str, Any]:
        """GET the container config with pending changes merged in; includes ``digest``."""
        return self._call("GET", f"{self._n()}/lxc/{vmid}/config")

    def lxc_update(self, vmid: int, set: dict[str, str], delete: list[str], digest: str) -> None:
        """PUT the container config: ``set`` keys, ``delete`` keys, guarded by ``digest``.

        Booleans go as 0/1 (Proxmox refuses ``True``). Raises ProxmoxError.
        """
        params: dict[str, Any] = {k: _wire(v) for k, v in set.items()}
        if delete:
            params["delete"] = ",".join(delete)
        params["digest"] = digest
        out = self._call("PUT", f"{self._n()}/lxc/{vmid}/config", **params)
        self._check_null(out, f"PUT {self._n()}/lxc/{vmid}/config")

    def guest_status(self, kind: str, vmid: int) -> str:
        """'running' or 'stopped' (GET .../status/current)."""
        return self._call("GET", f"{self._n()}/{_kind(kind)}/{vmid}/status/current")["status"]

    def guest_action(self, kind: str, vmid: int, action: str, timeout: float) -> None:
        """POST status/{start|stop|shutdown} and wait up to ``timeout`` s for the task.

        Raises ProxmoxError when refused, TaskFailed when the task ends other than OK or
        does not end in time (exitstatus None).
        """
        if action not in ("start", "stop", "shutdown"):
            raise ConfigError(f"unknown guest action {action!r} (start, stop, shutdown)")
        upid = self._call("POST", f"{self._n()}/{_kind(kind)}/{vmid}/status/{action}")
        if isinstance(upid, dict) or not isinstance(upid, str) or not upid.startswith("UPID:"):
            raise ProxmoxError(f"POST {self._n()}/{_kind(kind)}/{vmid}/status/{action}", None, f"expected a task id, got {str(upid)[:80]!r}")
        self.wait_task(upid, timeout)

    def wait_task(self, upid: str, timeout: float) -> None:
        """Poll the task until it stops. Raises TaskFailed unless its exitstatus is OK."""
        deadline = time.monotonic() + timeout
        interval = min(self._cfg.poll_interval, 0.05) if timeout < 5 else self._cfg.poll_interval
        while True:
            st = self._call("GET", f"{self._n()}/tasks/{upid}/status")
            if st.get("status") == "stopped":
                if st.get("exitstatus") != "OK":
                    raise TaskFailed(upid, st.get("exitstatus"))
                return
            if time.monotonic() >= deadline:
                raise TaskFailed(upid, None)
            time.sleep(min(interval, max(0.0, deadline - time.monotonic())) or 0.01)

    def list_guests(self, kind: str) -> list[dict[str, Any]]:
        return self._call("GET", f"{self._n()}/{_kind(kind)}")

    def qemu_config(self, vmid: int) -> dict[str, Any]:
        return self._call("GET", f"{self._n()}/qemu/{vmid}/config")

    def lxc_interfaces(self, vmid: int) -> list[dict[str, Any]]:
        """GET .../lxc/{vmid}/interfaces; [] for a stopped container (Proxmox answers null)."""
        return self._call("GET", f"{self._n()}/lxc/{vmid}/interfaces") or []

    def mappings(self, check_node: str | None = None) -> list[dict[str, Any]]:
        """GET /cluster/mapping/pci (with ``checks`` per entry when ``check_node`` is set)."""
        params = {"check-node": check_node} if check_node else {}
        return self._call("GET", "/cluster/mapping/pci", **params)

    def mapping_create(self, id: str, map: list[str], description: str | None) -> None:
        if not map:
            raise ConfigError(f"mapping {id}: at least one map entry is required")
        params: dict[str, Any] = {"id": id, "map": list(map)}
        if description is not None:
            params["description"] = description
        if self._cfg.backend == "local":
            return self._pvesh("create", "/cluster/mapping/pci", params)
        self._check_null(self._call("POST", "/cluster/mapping/pci", **params), "POST /cluster/mapping/pci")

    def mapping_update(self, id: str, map: list[str], description: str | None, digest: str) -> None:
        """PUT a mapping; ``map`` is always sent (Proxmox requires it on every update)."""
        if not map:
            raise ConfigError(f"mapping {id}: at least one map entry is required")
        params: dict[str, Any] = {"map": list(map), "digest": digest}
        if description is not None:
            params["description"] = description
        else:
            params["delete"] = "description"
        if self._cfg.backend == "local":
            return self._pvesh("set", f"/cluster/mapping/pci/{id}", params)
        self._check_null(self._call("PUT", f"/cluster/mapping/pci/{id}", **params), f"PUT /cluster/mapping/pci/{id}")

    def mapping_delete(self, id: str) -> None:
        self._check_null(self._call("DELETE", f"/cluster/mapping/pci/{id}"), f"DELETE /cluster/mapping/pci/{id}")

    # --- helpers --------------------------------------------------------------------------

    def _check_null(self, out: Any, call: str) -> None:
        # a command backend turns pvesh's empty output into {"errors": ""}; anything else in
        # "errors" means pvesh printed a message instead of a result
        if isinstance(out, dict) and set(out) == {"errors"} and str(out["errors"]).strip() not in ("", "b''"):
            raise ProxmoxError(call, 500, str(out["errors"]).strip().splitlines()[0])

    def _pvesh(self, verb: str, path: str, params: dict[str, Any]) -> None:
        """Run pvesh with repeated options for list values (proxmoxer would str() a list)."""
        argv = ["pvesh", verb, path]
        for k, v in params.items():
            for item in v if isinstance(v, list) else [v]:
                argv += [f"--{k}", str(_wire(item))]
        argv += ["--output-format", "json"]
        assert self._runner is not None
        out, err, rc = self._runner(argv, self._cfg.timeout)
        call = f"{ {'create': 'POST', 'set': 'PUT', 'delete': 'DELETE'}.get(verb, 'GET')} {path}".strip()
        if rc != 0 or err.strip():
            lines = [ln for ln in err.strip().splitlines() if ln.strip()] or [f"pvesh exited {rc}"]
            m = re.match(r"^(\d{3}) (.*)$", lines[0])
            status, message = (int(m.group(1)), m.group(2)) if m else (500, lines[0])
            errors = {}
            for ln in lines[1:]:
                km = re.match(r"^([\w\-\[\]\.]+): (.*)$", ln)
                if km:
                    errors[km.group(1)] = km.group(2)
            raise ProxmoxError(call, status, message, errors or None)
        if out.strip():
            json.loads(out)


def _kind(kind: str) -> str:
    if kind not in ("lxc", "qemu"):
        raise ConfigError(f"guest kind must be lxc or qemu, not {kind!r}")
    return kind


def _wire(v: Any) -> Any:
    if isinstance(v, bool):
        return int(v)
    return v


def _scrub(text: str, *secrets: str | None) -> str:
    for s in secrets:
        if s:
            text = text.replace(s, "***")
    return text
