"""The simulated node's HA local resource manager (LRM): what it does with a request the CRM
handed it (:mod:`gputopo.sim.pveapi.hacrm` queues them), and how the CRM answers its result.

* a stop runs the resource's ``shutdown`` (pve-ha-manager src/PVE/HA/Resources/PVECT.pm
  l.85-105: a container gets ``vm_shutdown`` with the timeout only, never ``forceStop``;
  PVEVM.pm: a VM's with ``forceStop => 1``; timeout 0 is ``vm_stop``). A container that outlasts
  its timeout is not stopped: the stop fails and the CRM puts the service in ``error`` while the
  container keeps running (src/PVE/HA/Manager.pm l.1199-1217, next_state_request_stop);
* a start that fails is retried by the LRM ``max_restart`` times (default 1: src/PVE/HA/Config.pm
  l.121; src/PVE/HA/LRM.pm l.857-903, handle_service_exitcode: ``ETRY_AGAIN``), then the CRM
  records the node as failed (l.1363-1371, a node once per failure) and relocates the service to another node while it has failed on
  no more than ``max_relocate`` nodes (default 1: Config.pm l.122; Manager.pm l.1468-1497); with
  no other node to go to it retries on the same one (l.1550-1558, "Tried all available nodes"),
  and only then puts it in ``error``. On this one-node simulator a start is so tried
  (1 + max_restart) x (1 + max_relocate) times (4 by default) before ``error``; a move to another
  node is not modelled.
"""

from __future__ import annotations

from typing import Any

from gputopo.sim import state
from gputopo.sim.pveapi.shutdown import lxc_shutdown, qemu_shutdown

REQUESTS = "ha-requests"
SERVICE_STATES = "ha-service-states"  # sid -> the manager's state where it is not the guest's
START_FAILURES = "ha-start-failures"  # sid -> failed starts of its current request


class HaLrmHandlers:
    """The LRM's side of :class:`gputopo.sim.pveapi.hacrm.HaCrmHandlers` (a mixin)."""

    def _ha_run(self, q: dict[str, Any]) -> None:
        """Carry out request ``q`` (due now), then record the manager's service state."""
        kind, vmid, sid = q["kind"], int(q["vmid"]), q["sid"]
        running = state.guest_status(self.run_dir, kind, vmid) == "running"
        if q["op"] == "stop":
            result = self._ha_stop(kind, vmid, int(q.get("timeout") or 0)) if running else "stopped"
            r = self.ha_resource_of(kind, vmid)
            if result != "error" and r is not None and r.props.get("state", "started") == "started":
                # asked for 'started' again meanwhile: the CRM starts the stopped service
                # (Manager.pm next_state_stopped)
                self.ha_queue(kind, vmid, "start")
        elif (self._ha_requested(sid) or "started") != "started":
            # asked for another state meanwhile: the CRM's round moves the service to
            # request_stop instead of starting it (Manager.pm next_state_started, a requested
            # state other than 'started'), so the LRM never starts it
            result = "started" if running else "stopped"
            if running:
                self.ha_queue(kind, vmid, "stop", 60)
        else:
            result = "started" if running else self._ha_start(kind, vmid, sid)
        with state.locked(self.run_dir, SERVICE_STATES):
            states = state.read_state(self.run_dir, SERVICE_STATES, {}) or {}
            if result == "error":
                states[sid] = "error"
            else:
                states.pop(sid, None)
            state.write_state(self.run_dir, SERVICE_STATES, states)

    def _ha_stop(self, kind: str, vmid: int, timeout: int) -> str:
        """The resource's shutdown (PVECT.pm l.85-105 / PVEVM.pm): ``stopped``, or ``error``
        where the guest outlasted its timeout without force (a container: always without)."""
        lat = state.read_state(self.run_dir, "latencies", {}) or {}
        if timeout:
            key = "vzshutdown" if kind == "lxc" else "qmshutdown"
            takes = float(lat.get(f"{key}:{vmid}", lat.get(key, 0.0)))
            second = float(lat.get("second", 1.0))
            outcome = (
                lxc_shutdown(vmid, takes, timeout, False, second)
                if kind == "lxc"
                else qemu_shutdown(vmid, takes, timeout, True, second)
            )
            if not outcome.stopped:
                return "error"  # the guest keeps running (Manager.pm l.1210-1214)
        try:
            self._stop_guest(kind, vmid, None, [])
        except Exception:  # Manager.pm next_state_request_stop: a failed stop is 'error'
            return "error"
        return "stopped"

    def _ha_start(self, kind: str, vmid: int, sid: str) -> str:
        """The LRM's start; a failed one is tried again (a new request) until the restart and
        relocate policies are spent, then ``error`` (LRM.pm l.857-903, Manager.pm l.1468-1497)."""
        try:
            self._start_guest(kind, vmid, [])
        except Exception:
            r = self.ha_resource_of(kind, vmid)
            props = r.props if r is not None else {}
            tries = (1 + int(props.get("max_restart", 1))) * (1 + int(props.get("max_relocate", 1)))
            with state.locked(self.run_dir, START_FAILURES):
                failures = state.read_state(self.run_dir, START_FAILURES, {}) or {}
                failures[sid] = failures.get(sid, 0) + 1
                spent = failures[sid] >= tries
                if spent:
                    failures.pop(sid)
                state.write_state(self.run_dir, START_FAILURES, failures)
            if spent:
                return "error"
            self.ha_queue(kind, vmid, "start")
            return "stopped"
        with state.locked(self.run_dir, START_FAILURES):
            failures = state.read_state(self.run_dir, START_FAILURES, {}) or {}
            if failures.pop(sid, None) is not None:
                state.write_state(self.run_dir, START_FAILURES, failures)
        return "started"
