"""The real Proxmox VE adapters: both implement ``gputopo.ports.ProxmoxPort``.

* :class:`HttpsClient` -- the API over HTTPS through proxmoxer (an API token, or a root@pam
  password turned into a ticket);
* :class:`LocalClient` -- ``pvesh`` on the node itself (:mod:`gputopo.adapters.pvesh`).

:meth:`ProxmoxClient.from_config` builds the one an :class:`ApiConfig` asks for. Secrets come
from :mod:`gputopo.adapters.credentials` and never appear in ``repr``, logs or errors.
"""

from __future__ import annotations

import os
import time
from abc import ABC, abstractmethod
from typing import Any

from gputopo.adapters.credentials import ENV_PASSWORD, ApiConfig, Credentials, resolve_credentials
from gputopo.adapters.pvesh import Pvesh, Runner, wire_value
from gputopo.errors import ConfigError, ConnectFailed, LoginFailed, ProxmoxError, TaskFailed, TaskTimeout
from gputopo.formats.tasklog import exitstatus_ok, parse_task_warnings, qemu_forced_stop
from gputopo.ports import TaskResult


class ProxmoxClient(ABC):
    """The ``ProxmoxPort`` calls, written once over :meth:`_call`, which each backend provides.

    Every call raises :class:`ProxmoxError` (call, HTTP status, PVE's first-line message, its
    ``errors`` dict) when Proxmox refuses it; ``guest_action`` raises :class:`TaskFailed` or
    :class:`TaskTimeout`.
    """

    status_known = True  # the API tells whether a guest runs
    guests_known = True  # and which guests the node has

    def __init__(self, cfg: ApiConfig):
        self._cfg = cfg
        self.node = cfg.node

    @staticmethod
    def from_config(
        cfg: ApiConfig, env: dict[str, str] | None = None, runner: Runner | None = None
    ) -> ProxmoxClient:
        """Connect as ``cfg`` says. ``env`` defaults to ``os.environ``; ``runner`` replaces the
        way the local backend runs ``pvesh`` (tests pass a fake).

        Raises ConfigError for missing/unsafe credentials or options, ProxmoxError when the
        password login is refused.
        """
        if cfg.backend == "local":
            return LocalClient(cfg, Pvesh(runner, cfg.timeout))
        return HttpsClient.connect(cfg, dict(os.environ if env is None else env))

    @abstractmethod
    def _call(self, method: str, path: str, _timeout: float | None = None, **params: Any) -> Any:
        """``method`` (GET, POST, PUT, DELETE) on the API ``path``: the result's ``data``.
        ``_timeout`` replaces the per-call timeout (pvesh: a task runs to its end within the
        call). Raises ProxmoxError when Proxmox refuses the call or cannot be reached."""

    @property
    @abstractmethod
    def address(self) -> str:
        """Where the API is reached, for messages: its URL, or ``pvesh (--local)``."""

    @abstractmethod
    def identity(self) -> str:
        """The authenticated user id, e.g. ``root@pam`` or ``root@pam!gputopo`` for a token."""

    @abstractmethod
    def can_change_devices(self) -> tuple[bool, str]:
        """Whether this login may set or delete ``devN`` (Proxmox allows only root@pam).

        Returns (ok, why): ``why`` says what works when ``ok`` is False.
        """

    def _n(self) -> str:
        return f"/nodes/{self.node}"

    def _check_null(self, out: Any, call: str) -> None:
        # proxmoxer turns a body that is not JSON into {"errors": body}: an empty one is
        # Proxmox's null, anything else means a message came instead of a result
        if isinstance(out, dict) and set(out) == {"errors"} and str(out["errors"]).strip() not in ("", "b''"):
            raise ProxmoxError(call, 500, str(out["errors"]).strip().splitlines()[0])

    # --- ProxmoxPort ----------------------------------------------------------------------

    def version(self) -> dict[str, Any]:
        """GET /version: ``{version, release, repoid}``."""
        return self._call("GET", "/version")

    def lxc_config(self, vmid: int, current: bool = False) -> dict[str, Any]:
        """GET the container config with pending changes merged in (``current``: the values in
        effect); includes ``digest``."""
        params = {"current": 1} if current else {}
        return self._call("GET", f"{self._n()}/lxc/{vmid}/config", **params)

    def lxc_update(self, vmid: int, set: dict[str, str], delete: list[str], digest: str) -> None:
        """PUT the container config: ``set`` keys, ``delete`` keys, guarded by ``digest``.

        Booleans go as 0/1 (Proxmox refuses ``True``). Raises ProxmoxError.
        """
        self._put_config("lxc", vmid, set, delete, digest)

    def guest_status(self, kind: str, vmid: int) -> str:
        """'running' or 'stopped' (GET .../status/current)."""
        return self._call("GET", f"{self._n()}/{_kind(kind)}/{vmid}/status/current")["status"]

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
        """POST status/{start|stop|shutdown} and wait up to ``timeout`` s for the task.

        A shutdown sends ``timeout=shutdown_timeout`` and ``forceStop=1`` only with ``force``.
        Returns the task's :class:`TaskResult`: ``WARNINGS: N`` is success, its ``WARN:`` lines
        are the warnings; ``forced`` says a forced shutdown had to kill the guest (QEMU logs it;
        an LXC task that ran the whole shutdown timeout was killed by lxc-stop, which logs
        nothing). Raises ProxmoxError when refused, TaskFailed when the task fails, TaskTimeout
        when it does not finish within ``timeout``.
        """
        if action not in ("start", "stop", "shutdown"):
            raise ConfigError(f"unknown guest action {action!r} (start, stop, shutdown)")
        what = f"{'CT' if _kind(kind) == 'lxc' else 'VM'} {vmid} {action}"
        params: dict[str, Any] = {}
        if action == "shutdown":
            if shutdown_timeout is not None:
                params["timeout"] = int(shutdown_timeout)
            if force:
                params["forceStop"] = 1
        call = f"POST {self._n()}/{kind}/{vmid}/status/{action}"
        t0 = time.monotonic()
        upid = self._start_task(f"{self._n()}/{kind}/{vmid}/status/{action}", params, what, timeout)
        if isinstance(upid, dict) or not isinstance(upid, str) or not upid.startswith("UPID:"):
            raise ProxmoxError(call, None, f"expected a task id, got {str(upid)[:80]!r}")
        exitstatus = self.wait_task(upid, max(0.0, timeout - (time.monotonic() - t0)), what, timeout)
        seconds = time.monotonic() - t0
        result = TaskResult(upid=upid, exitstatus=exitstatus, seconds=seconds)
        if exitstatus != "OK" or (action == "shutdown" and force):
            log = self.task_log(upid)
            result.warnings = parse_task_warnings(log)
            if action == "shutdown" and force:
                limit = 60 if shutdown_timeout is None else shutdown_timeout
                result.forced = qemu_forced_stop(log) if kind == "qemu" else seconds >= limit
        return result

    def _start_task(self, path: str, params: dict[str, Any], what: str, timeout: float) -> Any:
        """POST ``path``: what Proxmox answers (a UPID). Raises ProxmoxError, TaskTimeout."""
        return self._call("POST", path, **params)

    def wait_task(
        self, upid: str, timeout: float, what: str | None = None, limit: float | None = None
    ) -> str:
        """Poll the task until it stops; its exitstatus (``OK`` or ``WARNINGS: N``).

        Raises TaskFailed for any other exitstatus, TaskTimeout (naming ``what`` and ``limit``,
        default ``timeout``) when it is still running after ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        interval = min(self._cfg.poll_interval, 0.05) if timeout < 5 else self._cfg.poll_interval
        while True:
            st = self._call("GET", f"{self._n()}/tasks/{upid}/status")
            if st.get("status") == "stopped":
                exitstatus = st.get("exitstatus")
                if not exitstatus_ok(exitstatus):
                    raise TaskFailed(upid, exitstatus, what)
                return exitstatus
            if time.monotonic() >= deadline:
                raise TaskTimeout(upid, what or f"task {upid}", timeout if limit is None else limit)
            time.sleep(min(interval, max(0.0, deadline - time.monotonic())) or 0.01)

    def task_log(self, upid: str) -> list[str]:
        """The lines of a task's log (GET .../tasks/{upid}/log, up to 1000 lines)."""
        out = self._call("GET", f"{self._n()}/tasks/{upid}/log", start=0, limit=1000) or []
        return [str(item.get("t", "")) for item in out if isinstance(item, dict)]

    def nodes(self) -> list[str]:
        """GET /nodes: the names of the nodes this API serves."""
        return [
            str(n["node"]) for n in self._call("GET", "/nodes") or [] if isinstance(n, dict) and n.get("node")
        ]

    def list_guests(self, kind: str) -> list[dict[str, Any]]:
        return self._call("GET", f"{self._n()}/{_kind(kind)}")

    def guest_ha(self, kind: str, vmid: int) -> dict[str, Any]:
        """status/current's ``ha`` (pve-container Status.pm vm_status / qemu-server Qemu.pm
        vmstatus: PVE::HA::Config::get_service_status); when managed, ``requested`` is the
        resource's state in GET /cluster/ha/resources (``started`` when it sets none, the
        schema's default; None when that list cannot be read, e.g. a token without Sys.Audit
        on /). Raises ProxmoxError when status/current fails."""
        ha = self._call("GET", f"{self._n()}/{_kind(kind)}/{vmid}/status/current").get("ha") or {}
        out: dict[str, Any] = {"managed": int(ha.get("managed") or 0)}
        if not out["managed"]:
            return out
        out["state"] = ha.get("state")
        sid = f"{'ct' if _kind(kind) == 'lxc' else 'vm'}:{vmid}"
        try:
            listed = self._call("GET", "/cluster/ha/resources") or []
        except ProxmoxError:
            listed = None
        out["requested"] = (
            None
            if listed is None
            else next((str(r.get("state") or "started") for r in listed if r.get("sid") == sid), None)
        )
        return out

    def ha_set_state(self, sid: str, state: str) -> None:
        """PUT /cluster/ha/resources/{sid} with ``state`` (pve-ha-manager API2/HA/Resources.pm
        update, what ``ha-manager set`` calls). Raises ProxmoxError."""
        self._call("PUT", f"/cluster/ha/resources/{sid}", state=state)

    def qemu_config(self, vmid: int) -> dict[str, Any]:
        return self._call("GET", f"{self._n()}/qemu/{vmid}/config")

    def qemu_update(self, vmid: int, set: dict[str, str], delete: list[str], digest: str) -> None:
        """PUT the VM config (synchronous): ``set`` keys, ``delete`` keys, guarded by ``digest``.

        Raises ProxmoxError.
        """
        self._put_config("qemu", vmid, set, delete, digest)

    def _put_config(self, kind: str, vmid: int, set: dict[str, str], delete: list[str], digest: str) -> None:
        params: dict[str, Any] = {k: wire_value(v) for k, v in set.items()}
        if delete:
            params["delete"] = ",".join(delete)
        params["digest"] = digest
        path = f"{self._n()}/{kind}/{vmid}/config"
        self._check_null(self._call("PUT", path, **params), f"PUT {path}")

    def agent_ping(self, vmid: int) -> None:
        """POST .../agent/ping. Raises ProxmoxError when the VM has no agent, is not running or its
        agent does not answer (qemu-server waits 3 s for ``guest-ping``)."""
        self._call("POST", f"{self._n()}/qemu/{vmid}/agent/ping")

    def agent_exec(self, vmid: int, argv: list[str]) -> int:
        """POST .../agent/exec with ``command`` as an array (one form field per word); the pid.

        Raises ProxmoxError, also when the answer carries no pid.
        """
        out = self._call("POST", f"{self._n()}/qemu/{vmid}/agent/exec", command=list(argv))
        if not isinstance(out, dict) or "pid" not in out:
            raise ProxmoxError(
                f"POST {self._n()}/qemu/{vmid}/agent/exec", None, f"no pid in the answer {str(out)[:80]!r}"
            )
        return int(out["pid"])

    def agent_exec_status(self, vmid: int, pid: int) -> dict[str, Any]:
        """GET .../agent/exec-status?pid=N: ``exited`` and, once exited, ``exitcode``, ``out-data``."""
        return self._call("GET", f"{self._n()}/qemu/{vmid}/agent/exec-status", pid=pid)

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
        self._check_null(
            self._call("PUT", f"/cluster/mapping/pci/{id}", **params), f"PUT /cluster/mapping/pci/{id}"
        )

    def mapping_delete(self, id: str) -> None:
        self._check_null(
            self._call("DELETE", f"/cluster/mapping/pci/{id}"), f"DELETE /cluster/mapping/pci/{id}"
        )


class LocalClient(ProxmoxClient):
    """``ProxmoxPort`` through ``pvesh`` on the node: root@pam, tasks run synchronously."""

    def __init__(self, cfg: ApiConfig, pvesh: Pvesh):
        super().__init__(cfg)
        self._pvesh = pvesh

    def __repr__(self) -> str:
        return f"LocalClient(root@pam at local pvesh, node {self.node})"

    @property
    def address(self) -> str:
        return "pvesh (--local)"

    __str__ = __repr__

    def _call(self, method: str, path: str, _timeout: float | None = None, **params: Any) -> Any:
        return self._pvesh.call(method, path, params, timeout=_timeout)

    def _start_task(self, path: str, params: dict[str, Any], what: str, timeout: float) -> Any:
        # pvesh runs the task in the foreground: the command may take as long as the step
        # allows, and outliving that is the task's timeout
        try:
            return self._call("POST", path, _timeout=timeout, **params)
        except ProxmoxError as e:
            if e.status is None and e.pve_message.startswith("timed out after"):
                raise TaskTimeout(None, what, timeout) from None
            raise

    def identity(self) -> str:
        """root@pam: pvesh runs as root@pam on the node."""
        return "root@pam"

    def can_change_devices(self) -> tuple[bool, str]:
        return True, "pvesh on the node runs as root@pam"


class HttpsClient(ProxmoxClient):
    """``ProxmoxPort`` over HTTPS through proxmoxer. Build it with :meth:`connect`."""

    def __init__(self, api: Any, cfg: ApiConfig, creds: Credentials):
        super().__init__(cfg)
        self._api = api
        self._user = creds.user
        self._token_name = creds.token_name

    def __repr__(self) -> str:
        return (
            f"HttpsClient({self.identity()} at https://{self._cfg.host}:{self._cfg.port}, node {self.node})"
        )

    __str__ = __repr__

    @property
    def address(self) -> str:
        host = self._cfg.host
        if ":" in host:  # an IPv6 address
            host = f"[{host}]"
        return f"https://{host}:{self._cfg.port}"

    @classmethod
    def connect(cls, cfg: ApiConfig, env: dict[str, str]) -> HttpsClient:
        """Log in as ``cfg`` says with the credentials in ``env`` (or ``cfg.secret_file``).

        With ``cfg.fingerprint`` every connection must present that certificate
        (:mod:`gputopo.adapters.pinning`), else ``cfg.ca_bundle`` or the system CAs check it
        (``cfg.verify_ssl`` False: nothing does). A token is tried with one ``GET /version``, so
        a wrong secret fails here, before anything else.

        Raises ConfigError for missing/unsafe credentials or a missing CA bundle, LoginFailed
        when the login is refused or the certificate is not the pinned one, ProxmoxError when
        the host cannot be reached.
        """
        from proxmoxer import ProxmoxAPI
        from proxmoxer.core import AuthenticationError

        from gputopo.adapters.pinning import pinned_api, presented_fingerprint

        creds = resolve_credentials(cfg, env)
        if cfg.ca_bundle and not os.path.isfile(cfg.ca_bundle):
            raise ConfigError(f"{cfg.ca_bundle}: CA bundle not found")
        verify: bool | str = cfg.ca_bundle if (cfg.verify_ssl and cfg.ca_bundle) else cfg.verify_ssl
        where = f"connect https://{cfg.host}:{cfg.port}"
        try:
            if cfg.fingerprint:
                api = pinned_api(
                    cfg.host,
                    cfg.port,
                    cfg.fingerprint,
                    creds.user,
                    cfg.timeout,
                    password=creds.password,
                    token_name=creds.token_name,
                    token_value=creds.token_secret,
                )
            else:
                kw: dict[str, Any] = dict(
                    host=cfg.host,
                    port=cfg.port,
                    user=creds.user,
                    verify_ssl=verify,
                    timeout=cfg.timeout,
                    service="PVE",
                )
                if creds.token_name:
                    api = ProxmoxAPI(
                        backend="https", token_name=creds.token_name, token_value=creds.token_secret, **kw
                    )
                else:
                    api = ProxmoxAPI(backend="https", password=creds.password, **kw)
        except AuthenticationError:
            raise LoginFailed(
                "POST /access/ticket", 401, f"authentication failure for {creds.user}"
            ) from None
        except Exception as e:  # requests' connection/TLS errors; never echo the secret
            got = presented_fingerprint(e)
            if got:
                raise LoginFailed(
                    where,
                    None,
                    f"the certificate's SHA-256 fingerprint is {got}, not the pinned {cfg.fingerprint}",
                ) from None
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise ConnectFailed(where, None, creds.scrub(first), tls_hint(e, cfg.ca_bundle)) from None
        client = cls(api, cfg, creds)
        if creds.token_name:
            try:
                client.version()
            except ProxmoxError as e:
                if e.status == 401:
                    raise LoginFailed(
                        "GET /version", 401, f"{e.pve_message} (API token {client.identity()})"
                    ) from None
                raise
        return client

    def _call(self, method: str, path: str, _timeout: float | None = None, **params: Any) -> Any:
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
            if e.status_code == 401:  # the token (or ticket) is refused: nothing can be done with it
                raise LoginFailed(call, 401, message[0] if message else "authentication failure") from None
            errors = e.errors if isinstance(e.errors, dict) and "errors" not in e.errors else None
            raise ProxmoxError(call, e.status_code, message[0] if message else "", errors) from None
        except ProxmoxError:
            raise
        except Exception as e:
            from gputopo.adapters.pinning import presented_fingerprint

            got = presented_fingerprint(e)
            if got:
                raise LoginFailed(
                    call,
                    None,
                    f"the certificate's SHA-256 fingerprint is {got}, not the pinned {self._cfg.fingerprint}",
                ) from None
            raise ProxmoxError(call, None, str(e).splitlines()[0] if str(e) else type(e).__name__) from None

    def identity(self) -> str:
        """The authenticated user id (``root@pam!gputopo`` for a token)."""
        return f"{self._user}!{self._token_name}" if self._token_name else self._user

    def can_change_devices(self) -> tuple[bool, str]:
        if self._token_name:
            return False, (
                f"API token {self.identity()} may not configure device passthrough (devN): only root@pam may; "
                f"log in with a ticket as root@pam ({ENV_PASSWORD}) or use the local backend on the node"
            )
        if self._user != "root@pam":
            return False, (
                f"user {self._user} may not configure device passthrough (devN): only root@pam may; "
                f"log in as root@pam ({ENV_PASSWORD}) or use the local backend on the node"
            )
        return True, "ticket login as root@pam"


PVE_CA = "/etc/pve/pve-root-ca.pem"


def tls_hint(exc: BaseException, ca_bundle: str | None) -> str:
    """The known fix for a connection error, or '': a certificate that is not trusted is
    usually a node's self-signed one, whose CA every node keeps in ``/etc/pve/pve-root-ca.pem``."""
    text = f"{type(exc).__name__} {exc}"
    if "CERTIFICATE_VERIFY_FAILED" not in text and "SSLError" not in text:
        return ""
    if ca_bundle:
        return f"the certificate does not chain to {ca_bundle}; pass the node's {PVE_CA} as --ca-bundle"
    return f"pass --ca-bundle {PVE_CA} (copied from the node) or --insecure"


def _kind(kind: str) -> str:
    if kind not in ("lxc", "qemu"):
        raise ConfigError(f"guest kind must be lxc or qemu, not {kind!r}")
    return kind
