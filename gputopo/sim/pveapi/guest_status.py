"""Guest status and power through the simulated API: status/current, start, stop, shutdown.

A start, stop or shutdown answers at once with the UPID of a task (:mod:`.tasks`) that does
the work.
"""

from __future__ import annotations

from typing import Any

from gputopo.formats.lxcconf import parse_lxc_conf
from gputopo.sim import state
from gputopo.sim.pveapi.answers import die
from gputopo.sim.pveapi.auth import Caller

TASK_TYPES = {
    ("lxc", "start"): "vzstart", ("lxc", "stop"): "vzstop", ("lxc", "shutdown"): "vzshutdown",
    ("qemu", "start"): "qmstart", ("qemu", "stop"): "qmstop", ("qemu", "shutdown"): "qmshutdown",
}


class GuestStatusHandlers:
    """Guest status and power handlers of :class:`gputopo.sim.pveapi.PveApiServer` (a mixin)."""

    def h_guest_current(self, caller: Caller, p: dict) -> Any:
        kind, vmid = p["kind"], p["vmid"]
        opts = parse_lxc_conf(self._load(kind, vmid)).options
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
