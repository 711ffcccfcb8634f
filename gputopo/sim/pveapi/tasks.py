"""Tasks of the simulated API: UPIDs that take time, can fail, and do a guest's start or stop.

A task finishes on a timer after its latency (``latencies`` in the run dir; settable per task
type and per guest), or when its status (or its guest's status) is read after it was due. A task
is the node's, not its client's: pve-container API2/LXC/Status.pm vm_shutdown (and vm_start,
vm_stop) and qemu-server API2/Qemu.pm vm_shutdown return the UPID of a worker forked by
pve-common RESTEnvironment.pm fork_worker, which detaches it (``POSIX::setsid``) and lets it run
on when the client disconnects or dies. Here the server may live in the client's process: a
server that starts again arms the timers of the tasks still running (:meth:`resume_tasks`), and
a status read of a guest carries out its tasks that are due (:meth:`finish_due_tasks`). Its effect runs once: a
container start applies pending changes and boots the container (hooks), a VM start does
Proxmox's PCI passthrough and the rest of qemu-server's start (:mod:`gputopo.sim.pveapi.qemu_vm`);
an injected fault or a hook's exception fails the task with its message. A shutdown's latency is how long the guest takes to
go down: Proxmox's ``timeout`` and ``forceStop`` decide how the task ends
(:mod:`.shutdown`).

The log is what pve-common RESTEnvironment.pm fork_worker writes: the worker's lines (a
``RESTEnvironment::warn`` as ``WARN: <message>``), then ``TASK OK``, ``TASK WARNINGS: N`` or
``TASK ERROR: <message>``; the exitstatus is ``OK``, ``WARNINGS: N`` or the message (UPID.pm
read_status).
"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Any

from gputopo.formats.lxcconf import parse_lxc_conf, write_lxc_conf
from gputopo.sim import state
from gputopo.sim.files import PMXCFS_MODE, atomic_write
from gputopo.sim.pveapi import workers
from gputopo.sim.pveapi.answers import ApiError, Result, param_error
from gputopo.sim.pveapi.auth import Caller
from gputopo.sim.pveapi.lxc_update import apply_pending
from gputopo.sim.pveapi.shutdown import lxc_shutdown, qemu_shutdown

DEFAULT_LATENCY = 0.05
# run-state name; "faults" belongs to the container simulator (gputopo.sim.container)
TASK_FAULTS = "task-faults"


class _Reached(Exception):
    """A taken-over task whose guest is already where it leads: its worker died after the effect."""


class TaskHandlers:
    """Tasks of :class:`gputopo.sim.pveapi.PveApiServer` (a mixin)."""

    def set_latency(self, task_type: str, seconds: float, vmid: int | None = None) -> None:
        """How long tasks of ``task_type`` (``vzstart``, ``qmstop``...) take from now on, for
        guest ``vmid`` only when given. For ``vzshutdown``/``qmshutdown`` it is how long the
        guest takes to shut down. ``second`` sets how long one second of Proxmox's own timers
        (a shutdown's ``timeout``) lasts."""
        with state.locked(self.run_dir, "latencies"):
            lat = state.read_state(self.run_dir, "latencies", {}) or {}
            lat[task_type if vmid is None else f"{task_type}:{vmid}"] = seconds
            state.write_state(self.run_dir, "latencies", lat)

    def _latency(self, task_type: str, vmid: int) -> float:
        lat = state.read_state(self.run_dir, "latencies", {}) or {}
        return float(lat.get(f"{task_type}:{vmid}", lat.get(task_type, DEFAULT_LATENCY)))

    def inject_fault(self, task_type: str, vmid: int, message: str, count: int = 1) -> None:
        """Make the next ``count`` tasks of ``task_type`` for ``vmid`` fail with ``message``."""
        with state.locked(self.run_dir, TASK_FAULTS):
            faults = state.read_state(self.run_dir, TASK_FAULTS, []) or []
            faults.append({"type": task_type, "vmid": str(vmid), "message": message, "count": count})
            state.write_state(self.run_dir, TASK_FAULTS, faults)

    def _new_task(
        self, ttype: str, kind: str, vmid: int, action: str, user: str, params: dict[str, Any] | None = None
    ) -> str:
        params = params or {}
        lat = self._latency(ttype, vmid)
        if action.startswith("ha"):
            # the hastart/hastop worker only runs ha-manager: it ends at once (tasks' default
            # latency), always before the CRM moves the guest (hacrm)
            lat = min(lat, DEFAULT_LATENCY)
        outcome = None
        if action == "shutdown" and state.guest_status(self.run_dir, kind, vmid) == "running":
            second = float((state.read_state(self.run_dir, "latencies", {}) or {}).get("second", 1.0))
            shutdown = lxc_shutdown if kind == "lxc" else qemu_shutdown
            timeout = int(params["timeout"]) if params.get("timeout") is not None else None
            outcome = shutdown(vmid, lat, timeout, bool(params.get("forceStop")), second)
            lat = outcome.seconds
        with state.locked(self.run_dir, "tasks"):
            tasks = state.read_state(self.run_dir, "tasks", {}) or {}
            pid = 100000 + len(tasks)
            start = int(time.time())
            pstart = 1000000 + len(tasks)
            # the UPID names the caller as it authenticated, a token as "user@realm!tokenid";
            # the status answer splits that (pve-manager API2/Tasks.pm $convert_token_task)
            upid = f"UPID:{self.node}:{pid:08X}:{pstart:08X}:{start:08X}:{ttype}:{vmid}:{user}:"
            tasks[upid] = {
                "upid": upid,
                "node": self.node,
                "pid": pid,
                "pstart": pstart,
                "starttime": start,
                "type": ttype,
                "id": str(vmid),
                "user": user.split("!")[0],
                "status": "running",
                "kind": kind,
                "vmid": vmid,
                "action": action,
                "due": time.time() + lat,
                "log": [],
            }
            if action.startswith("ha") and params:
                tasks[upid]["params"] = params
            if outcome is not None:
                tasks[upid]["outcome"] = {
                    "stopped": outcome.stopped,
                    "log": outcome.log,
                    "error": outcome.error,
                }
            if "!" in user:
                tasks[upid]["tokenid"] = user.split("!", 1)[1]
            state.write_state(self.run_dir, "tasks", tasks)
        timer = threading.Timer(lat, self._finish_task, (upid,))
        timer.daemon = True
        self._timers.append(timer)
        timer.start()
        return upid

    def resume_tasks(self) -> None:
        """Arm the timers of the tasks still running (a server started again: the process that
        served them is gone, the node's workers are not)."""
        tasks = state.read_state(self.run_dir, "tasks", {}) or {}
        for upid, task in tasks.items():
            if task["status"] == "running" and (not task.get("claimed") or workers.orphaned(task)):
                timer = threading.Timer(max(0.0, task["due"] - time.time()), self._finish_task, (upid,))
                timer.daemon = True
                self._timers.append(timer)
                timer.start()

    def finish_due_tasks(self, kind: str, vmid: int) -> None:
        """Carry out the tasks of guest ``vmid`` that are due and still running, oldest first:
        what the guest's status says comes after its tasks' effects, as on a node."""
        tasks = state.read_state(self.run_dir, "tasks", {}) or {}
        now = time.time()
        due = [
            u
            for u, t in tasks.items()
            if t["status"] == "running" and t["kind"] == kind and t["vmid"] == vmid and t["due"] <= now
        ]
        for upid in sorted(due, key=lambda u: tasks[u]["due"]):
            self._finish_task(upid)

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
        # A task whose claimer died (:mod:`.workers`) is taken over: the node's worker would
        # have run on.
        with state.locked(self.run_dir, "task-run"):
            with state.locked(self.run_dir, "tasks"):
                tasks = state.read_state(self.run_dir, "tasks", {}) or {}
                task = tasks.get(upid)
                if task is None or task["status"] == "stopped":
                    return
                if task.get("claimed") and not workers.orphaned(task):
                    return
                taken_over = bool(task.get("claimed"))
                task["claimed"] = workers.me()
                state.write_state(self.run_dir, "tasks", tasks)
        kind, vmid, action = task["kind"], task["vmid"], task["action"]
        log: list[str] = []  # the worker's output
        warnings = 0
        try:
            if taken_over and workers.reached(self.run_dir, task):
                raise _Reached
            fault = self._take_fault(task["type"], vmid)
            if fault:
                raise RuntimeError(fault)
            if action.startswith("ha"):
                log += self.ha_task_lines(kind, vmid, action[2:])
                params = task.get("params") or {}
                timeout = int(params["timeout"]) if params.get("timeout") is not None else None
                self.ha_task_effect(kind, vmid, action[2:], timeout)
            elif action == "start":
                warnings = self._start_guest(kind, vmid, log)
            else:
                self._stop_guest(kind, vmid, task.get("outcome"), log)
            exitstatus = f"WARNINGS: {warnings}" if warnings else "OK"
            log.append(f"TASK {exitstatus}")
        except _Reached:
            exitstatus = "OK"
            log.append("TASK OK")
        except ApiError as e:
            exitstatus = e.message.rstrip("\n").replace("\n", " ")
            log.append(f"TASK ERROR: {exitstatus}")
        except Exception as e:  # a hook or a fault: the task fails with its message
            exitstatus = (str(e).rstrip("\n") or type(e).__name__).replace("\n", " ")
            log.append(f"TASK ERROR: {exitstatus}")
        with state.locked(self.run_dir, "tasks"):
            tasks = state.read_state(self.run_dir, "tasks", {}) or {}
            tasks[upid].update(status="stopped", exitstatus=exitstatus, log=log)
            state.write_state(self.run_dir, "tasks", tasks)

    def _start_guest(self, kind: str, vmid: int, log: list[str]) -> int:
        """Start the guest (pve-container vm_start, qemu-server vm_start), logging into
        ``log``; returns how many warnings it logged. Raises what fails the task."""
        with self._lock:
            text = self._load(kind, vmid)
            if kind == "qemu" and state.guest_status(self.run_dir, kind, vmid) == "running":
                # QemuServer.pm vm_start, inside the task: the API answered with a UPID
                raise RuntimeError(f"VM {vmid} already running")
            if kind == "lxc":
                conf = parse_lxc_conf(text)
                if conf.options.get("template") in ("1",):
                    raise RuntimeError("you can't start a CT if it's a template")
                if not conf.pending.is_empty():
                    apply_pending(conf)
                    atomic_write(self.conf_path(kind, vmid), write_lxc_conf(conf), PMXCFS_MODE)
        warnings = 0
        if kind == "qemu":
            warnings += self._efi_warnings(vmid, text, log)
            self._qemu_pci_start(vmid, text)
        if self.hooks is not None and hasattr(self.hooks, "on_guest_start"):
            # what the container's start logged as warnings (pve-container LXC.pm
            # print_ct_warn_log: each line of /run/pve/ct-ID.warnings goes to log_warn)
            for message in self.hooks.on_guest_start(kind, vmid) or []:
                warnings += _warn(log, message)
        state.set_guest_status(self.run_dir, kind, vmid, "running")
        return warnings

    def _stop_guest(self, kind: str, vmid: int, outcome: dict | None, log: list[str]) -> None:
        """Stop or shut down the guest as ``outcome`` (a shutdown's, :mod:`.shutdown`) says.
        Raises what fails the task."""
        if kind == "qemu":
            self._load(kind, vmid)  # QemuServer.pm check_running asserts the config exists
            if state.guest_status(self.run_dir, kind, vmid) != "running":
                return  # _do_vm_stop: nothing runs, nothing to do
        if outcome is not None:
            log += outcome["log"]
            if not outcome["stopped"]:
                raise RuntimeError(outcome["error"])
        if self.hooks is not None and hasattr(self.hooks, "on_guest_stop"):
            self.hooks.on_guest_stop(kind, vmid)
        state.set_guest_status(self.run_dir, kind, vmid, "stopped")
        if kind == "qemu":
            self._qemu_stop(vmid)

    def _efi_warnings(self, vmid: int, text: str, log: list[str]) -> int:
        """qemu-server 9 QemuServer.pm check_efi_vars (OVMF.pm should_enroll_ms_2023_cert): an
        OVMF VM whose efidisk0 has pre-enrolled keys but not ``ms-cert=2023k`` warns at start,
        then prints how to enroll the 2023 certificates."""
        if int(self.version.split(".")[0]) < 9:
            return 0
        opts = parse_lxc_conf(text).options
        efi = dict(kv.split("=", 1) for kv in str(opts.get("efidisk0", "")).split(",")[1:] if "=" in kv)
        if opts.get("bios") != "ovmf" or "efidisk0" not in opts or opts.get("template") == "1":
            return 0
        if efi.get("pre-enrolled-keys") != "1" or efi.get("ms-cert") == "2023k":
            return 0
        _warn(
            log,
            "EFI disk without 'ms-cert=2023k' option, suggesting that not all UEFI 2023\n"
            "certificates from Microsoft are enrolled yet.",
        )
        log += [
            "The UEFI 2011 certificates expire in June 2026! The new certificates are required",
            "for secure boot update for Windows and common Linux distributions.",
            "Use 'Disk Action > Enroll Updated Certificates' in the UI or, while the VM is",
            f"shut down, run 'qm enroll-efi-keys {vmid}' to enroll the new certificates.",
            "",
        ]
        return 1

    def _passthrough(self) -> Any:
        """The VM-start PCI handling over this node's sysfs root (gputopo.sim.passthrough)."""
        from gputopo.sim.kernel import SimKernel
        from gputopo.sim.passthrough import Passthrough

        def write(path: str, value: str) -> None:
            if self.sysfs_root is None:
                raise RuntimeError("no simulated sysfs root")
            SimKernel(str(self.sysfs_root)).write(path, value)

        return Passthrough(
            self.sysfs_root or Path("/nonexistent"), self.run_dir, self.node, write, self._assert_valid
        )

    def _task(self, p: dict) -> dict:
        upid = p["upid"]
        if not re.match(
            r"^UPID:[a-zA-Z0-9-]+:[0-9A-F]{8}:[0-9A-F]{8,9}:[0-9A-F]{8}:[^:\s]+:[^:\s]*:[^:\s]+:$", upid
        ):
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

    def h_node_tasks(self, caller: Caller, p: dict) -> Any:
        """GET /nodes/{node}/tasks (pve-manager API2/Tasks.pm node_tasks): the node's tasks,
        newest first; ``source`` ``archive`` (the default: those that ended, with ``status``
        their exitstatus and ``endtime``), ``active`` (those still running) or ``all``; ``vmid``
        and ``typefilter`` narrow it; ``start``/``limit`` (50) page it. A task that is due has
        ended (a node's worker does not wait for a reader)."""
        tasks = state.read_state(self.run_dir, "tasks", {}) or {}
        for upid in [u for u, t in tasks.items() if t["status"] == "running" and t["due"] <= time.time()]:
            self._finish_task(upid)
        tasks = state.read_state(self.run_dir, "tasks", {}) or {}
        source = p.get("source") or "archive"
        out = []
        for t in sorted(tasks.values(), key=lambda t: (t["starttime"], t["pid"]), reverse=True):
            running = t["status"] == "running"
            if (source == "active" and not running) or (source == "archive" and running):
                continue
            if p.get("vmid") is not None and str(t["id"]) != str(p["vmid"]):
                continue
            if p.get("typefilter") and p["typefilter"] not in t["type"]:
                continue
            row = {k: t[k] for k in ("upid", "node", "pid", "pstart", "starttime", "type", "id", "user")}
            if not running:
                row.update(status=t["exitstatus"], endtime=int(t["due"]))
            out.append(row)
        start, limit = int(p.get("start") or 0), int(p.get("limit") or 50)
        return Result(out[start : start + limit], total=len(out))

    def h_task_log(self, caller: Caller, p: dict) -> Any:
        lines = self._task(p).get("log") or []
        start, limit = p.get("start", 0), p.get("limit", 50)
        if not lines:
            return Result([{"n": 1, "t": "no content"}], total=1)
        return Result(
            [{"n": i + 1, "t": t} for i, t in enumerate(lines)][start : start + limit], total=len(lines)
        )


def _warn(log: list[str], message: str) -> int:
    """RESTEnvironment.pm warn: ``WARN: <message>`` (chomped) into the task log; counts one."""
    log.extend(f"WARN: {message.rstrip(chr(10))}".split("\n"))
    return 1
