"""Guest status and power through the simulated API: status/current, start, stop, shutdown.

A start, stop or shutdown answers at once with the UPID of a task (:mod:`.tasks`) that does
the work. A container's API refuses a start of a running one and a stop of a stopped one with
a 500 (pve-container API2/LXC/Status.pm); QEMU's checks nothing before it forks the worker
(qemu-server API2/Qemu.pm vm_start/vm_stop/vm_shutdown): the start task of a running VM fails
(``VM 201 already running``), the stop task of a stopped VM succeeds.

A guest that is an HA resource gets a ``hastart``/``hastop`` task instead, after the same
checks (:mod:`.hacrm`): it ends ``OK`` at once and the guest moves after the CRM's delay.
"""

from __future__ import annotations

from typing import Any

from gputopo.formats.lxcconf import parse_lxc_conf
from gputopo.sim import state
from gputopo.sim.pveapi.answers import die, param_error
from gputopo.sim.pveapi.auth import Caller
from gputopo.sim.pveapi.hacrm import HA_TASK

TASK_TYPES = {
    ("lxc", "start"): "vzstart",
    ("lxc", "stop"): "vzstop",
    ("lxc", "shutdown"): "vzshutdown",
    ("qemu", "start"): "qmstart",
    ("qemu", "stop"): "qmstop",
    ("qemu", "shutdown"): "qmshutdown",
}


class GuestStatusHandlers:
    """Guest status and power handlers of :class:`gputopo.sim.pveapi.PveApiServer` (a mixin)."""

    def h_guest_current(self, caller: Caller, p: dict) -> Any:
        kind, vmid = p["kind"], p["vmid"]
        opts = parse_lxc_conf(self._load(kind, vmid)).options
        self.finish_due_tasks(kind, vmid)  # a worker that is due has done its work
        status = state.guest_status(self.run_dir, kind, vmid)
        out: dict[str, Any] = {
            "vmid": vmid,
            "status": status,
            "uptime": 0,
            "cpu": 0,
            "cpus": int(opts.get("cores", 1) or 1),
            "maxmem": int(opts.get("memory", 512)) << 20,
            "mem": 0,
            "disk": 0,
            "maxdisk": 0,
            "netin": 0,
            "netout": 0,
            "diskread": 0,
            "diskwrite": 0,
            "ha": self.ha_status(kind, vmid),  # Status.pm vm_status / Qemu.pm vmstatus
        }
        if kind == "lxc":
            out.update(
                type="lxc",
                name=opts.get("hostname") or f"CT{vmid}",
                swap=0,
                maxswap=int(opts.get("swap", 512)) << 20,
            )
        else:
            out.update(name=opts.get("name") or f"VM{vmid}", qmpstatus=status)
        if status == "running":
            out["pid"] = 4242 + vmid
        if opts.get("lock"):
            out["lock"] = opts["lock"]
        return out

    def _guest_action(self, caller: Caller, p: dict, action: str) -> str:
        kind, vmid = p["kind"], p["vmid"]
        running = state.guest_status(self.run_dir, kind, vmid) == "running"
        if kind == "lxc":
            if action != "start":
                self._load(kind, vmid)
            if action == "start" and running:
                raise die(f"CT {vmid} already running")
            if action != "start" and not running:
                raise die(f"CT {vmid} not running")
        elif action == "shutdown" and not running:
            # vm_shutdown asks QEMU whether the VM is paused first (vm_is_paused), and warns
            # what that query died of: "VM 201 not running" (QemuServer/Monitor.pm qmp_cmd)
            self.print_stderr(f"VM {vmid} not running\n\n")  # Perl: warn "$@\n", $@ ending in \n
        params = {k: p[k] for k in ("timeout", "forceStop") if p.get(k) is not None}
        if p.get("overrule-shutdown") and self.ha_resource_of(kind, vmid) is not None:
            # vm_stop of an HA guest: pve-container src/PVE/API2/LXC/Status.pm l.268 (after its
            # running check), qemu-server src/PVE/API2/Qemu.pm vm_stop (raise_param_exc)
            raise param_error({"overrule-shutdown": "Not applicable for HA resources."})
        if self.ha_resource_of(kind, vmid) is not None:
            # Status.pm / Qemu.pm: vm_is_ha_managed($vmid) -> fork_worker('hastart'|'hastop'),
            # after the running checks above (a VM's shutdown checks vm_is_paused first)
            return self._new_task(
                HA_TASK[action], kind, vmid, f"ha{action}", caller.user if caller else "root@pam", params
            )
        return self._new_task(
            TASK_TYPES[(kind, action)], kind, vmid, action, caller.user if caller else "root@pam", params
        )

    def h_guest_start(self, caller: Caller, p: dict) -> Any:
        return self._guest_action(caller, p, "start")

    def h_guest_stop(self, caller: Caller, p: dict) -> Any:
        return self._guest_action(caller, p, "stop")

    def h_guest_shutdown(self, caller: Caller, p: dict) -> Any:
        return self._guest_action(caller, p, "shutdown")
