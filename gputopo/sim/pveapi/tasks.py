"""Tasks of the simulated API: UPIDs that take time, can fail, and do a guest's start or stop.

A task finishes on a timer after its latency (``latencies`` in the run dir; settable per task
type), or when its status is read after it was due. Its effect runs once: a container start
applies pending changes and boots the container (hooks), a VM start does Proxmox's PCI
passthrough and the rest of qemu-server's start (:mod:`gputopo.sim.pveapi.qemu_vm`); an injected
fault or a hook's exception fails the task with its message.
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
from gputopo.sim.pveapi.answers import ApiError, Result, param_error
from gputopo.sim.pveapi.auth import Caller
from gputopo.sim.pveapi.guest_config import apply_pending

DEFAULT_LATENCY = 0.05
# run-state name; "faults" belongs to the container simulator (gputopo.sim.container)
TASK_FAULTS = "task-faults"


class TaskHandlers:
    """Tasks of :class:`gputopo.sim.pveapi.PveApiServer` (a mixin)."""

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
                        conf = parse_lxc_conf(text)
                        if conf.options.get("template") in ("1",):
                            raise RuntimeError("you can't start a CT if it's a template")
                        if not conf.pending.is_empty():
                            apply_pending(conf)
                            atomic_write(self.conf_path(kind, vmid), write_lxc_conf(conf), PMXCFS_MODE)
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
                    self._qemu_stop(vmid)
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
            return Result([{"n": 1, "t": "no content"}], total=1)
        return Result([{"n": i + 1, "t": t} for i, t in enumerate(lines)][start : start + limit], total=len(lines))
