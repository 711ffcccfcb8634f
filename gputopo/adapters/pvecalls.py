"""The ``ProxmoxPort`` calls, written once over one ``_call`` (method, path, parameters) that
each backend of :mod:`gputopo.adapters.proxmox` provides: which API path each call uses, what it
sends and what it reads back, tasks waited for."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from gputopo.adapters.credentials import ApiConfig
from gputopo.adapters.pvesh import wire_value
from gputopo.errors import ConfigError, ProxmoxError, TaskFailed, TaskTimeout
from gputopo.formats.tasklog import exitstatus_ok, parse_task_warnings, qemu_forced_stop
from gputopo.ports import TaskResult


class PveCalls(ABC):
    """The ``ProxmoxPort`` calls over :meth:`_call`.

    Every call raises :class:`ProxmoxError` (call, HTTP status, PVE's first-line message, its
    ``errors`` dict) when Proxmox refuses it; ``guest_action`` raises :class:`TaskFailed` or
    :class:`TaskTimeout`.
    """

    def __init__(self, cfg: ApiConfig):
        self._cfg = cfg
        self.node = cfg.node

    @abstractmethod
    def _call(self, method: str, path: str, _timeout: float | None = None, **params: Any) -> Any:
        """``method`` (GET, POST, PUT, DELETE) on the API ``path``: the result's ``data``.
        ``_timeout`` replaces the per-call timeout (pvesh: a task runs to its end within the
        call). Raises ProxmoxError when Proxmox refuses the call or cannot be reached."""

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

    def lxc_pending(self, vmid: int) -> list[dict[str, Any]]:
        """GET the container's keys with their pending changes, one item per key."""
        return self._call("GET", f"{self._n()}/lxc/{vmid}/pending")

    def lxc_update(
        self, vmid: int, set: dict[str, str], delete: list[str], digest: str, revert: list[str] = ()
    ) -> None:
        """PUT the container config: ``revert`` keys, ``set`` keys, ``delete`` keys, guarded by
        ``digest``.

        Booleans go as 0/1 (Proxmox refuses ``True``). Raises ProxmoxError.
        """
        self._put_config("lxc", vmid, set, delete, digest, revert)

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
        on_task: Callable[[str], None] | None = None,
    ) -> TaskResult:
        """POST status/{start|stop|shutdown} and wait up to ``timeout`` s for the task.

        A shutdown sends ``timeout=shutdown_timeout`` and ``forceStop=1`` only with ``force``.
        Returns the task's :class:`TaskResult`: ``WARNINGS: N`` is success, its ``WARN:`` lines
        are the warnings; ``forced`` says a forced shutdown had to kill the guest (QEMU logs it;
        an LXC task that ran the whole shutdown timeout was killed by lxc-stop, which logs
        nothing). Raises ProxmoxError when refused, TaskFailed when the task fails, TaskTimeout
        when it does not finish within ``timeout``. ``on_task`` gets the UPID once Proxmox
        accepted the task, before the wait (a journal keeps it: the task runs on if this process
        is interrupted).
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
        if on_task is not None:
            on_task(upid)
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

    def active_tasks(self, vmid: int) -> list[str]:
        """The UPIDs of the node's tasks of guest ``vmid`` still running (GET .../tasks with
        ``source=active``, ``vmid``: pve-manager API2/Tasks.pm node_tasks)."""
        out = self._call("GET", f"{self._n()}/tasks", source="active", vmid=vmid) or []
        return [str(t["upid"]) for t in out if isinstance(t, dict) and t.get("upid")]

    def recent_tasks(self, vmid: int, typefilter: str) -> list[str]:
        """The UPIDs of the node's tasks of guest ``vmid`` of type ``typefilter``, running or ended
        (GET .../tasks with ``source=all``, ``typefilter``, ``vmid``: pve-manager API2/Tasks.pm
        node_tasks, newest first)."""
        out = self._call("GET", f"{self._n()}/tasks", source="all", vmid=vmid, typefilter=typefilter) or []
        return [str(t["upid"]) for t in out if isinstance(t, dict) and t.get("upid")]

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

    def _put_config(
        self, kind: str, vmid: int, set: dict[str, str], delete: list[str], digest: str, revert=()
    ) -> None:
        params: dict[str, Any] = {k: wire_value(v) for k, v in set.items()}
        if delete:
            params["delete"] = ",".join(delete)
        if revert:
            params["revert"] = ",".join(revert)
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


def _kind(kind: str) -> str:
    if kind not in ("lxc", "qemu"):
        raise ConfigError(f"guest kind must be lxc or qemu, not {kind!r}")
    return kind
