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
  and only then puts it in ``error``. On one node a start is so tried
  (1 + max_restart) x (1 + max_relocate) times (4 by default) before ``error``; on a simulated
  cluster (the server's ``peers``) the stopped service is relocated: its config moves to the
  other node (an allowed one, :func:`gputopo.sim.pveapi.harules.start_failure_target`), whose
  LRM starts it, and a move record names it (:data:`gputopo.sim.pveapi.harules.MOVES`).
"""

from __future__ import annotations

import time
from typing import Any

from gputopo.sim import state
from gputopo.sim.pveapi.harules import move_config, record, start_failure_target
from gputopo.sim.pveapi.shutdown import lxc_shutdown, qemu_shutdown

REQUESTS = "ha-requests"
SERVICE_STATES = "ha-service-states"  # sid -> the manager's state where it is not the guest's
START_FAILURES = "ha-start-failures"  # sid -> failed starts of its current request
FAILED_NODES = "ha-failed-nodes"  # sid -> the nodes its start failed on (the CRM's failed_nodes)


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
            elif result == "relocated":
                # no longer this node's: its state follows it (Manager.pm change_service_state)
                states.pop(sid, None)
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
        """The LRM's start; a failed one is tried again (a new request) ``max_restart`` times on
        this node (LRM.pm l.857-903), then the CRM relocates the service to another node while it
        failed on no more than ``max_relocate`` nodes, or retries it here where no other node is
        left, and then puts it in ``error`` (Manager.pm l.1468-1497). Returns ``started``,
        ``stopped`` (tried again), ``relocated`` or ``error``."""
        if not self.conf_path(kind, vmid).is_file():
            return "relocated"  # a request of before the service moved to another node
        try:
            self._start_guest(kind, vmid, [])
        except Exception as e:
            return self._ha_start_failed(kind, vmid, sid, str(e).strip() or type(e).__name__)
        for name in (START_FAILURES, FAILED_NODES):
            with state.locked(self.run_dir, name):
                failures = state.read_state(self.run_dir, name, {}) or {}
                if failures.pop(sid, None) is not None:
                    state.write_state(self.run_dir, name, failures)
        return "started"

    def _ha_start_failed(self, kind: str, vmid: int, sid: str, why: str) -> str:
        r = self.ha_resource_of(kind, vmid)
        props = r.props if r is not None else {}
        with state.locked(self.run_dir, START_FAILURES):
            failures = state.read_state(self.run_dir, START_FAILURES, {}) or {}
            failures[sid] = failures.get(sid, 0) + 1
            restart = failures[sid] <= int(props.get("max_restart", 1))
            if not restart:
                failures.pop(sid)
            state.write_state(self.run_dir, START_FAILURES, failures)
        if restart:  # LRM.pm handle_service_exitcode: ETRY_AGAIN
            self.ha_queue(kind, vmid, "start")
            return "stopped"
        # Manager.pm l.1363-1371: the node is recorded as failed, once per failure
        with state.locked(self.run_dir, FAILED_NODES):
            nodes = state.read_state(self.run_dir, FAILED_NODES, {}) or {}
            failed = [*nodes.pop(sid, []), self.node]
            if len(failed) <= int(props.get("max_relocate", 1)):
                nodes[sid] = failed
            state.write_state(self.run_dir, FAILED_NODES, nodes)
        if len(failed) > int(props.get("max_relocate", 1)):
            return "error"  # Manager.pm l.1491-1496: unrecoverable
        target = start_failure_target(self, r, failed) if r is not None else None
        if target is None:  # l.1550-1558: "Tried all available nodes", tried here again
            self.ha_queue(kind, vmid, "start")
            return "stopped"
        self._ha_relocate(kind, vmid, sid, target, failed, why)
        return "relocated"

    def _ha_relocate(self, kind: str, vmid: int, sid: str, target: str, failed: list[str], why: str) -> None:
        """Relocate the stopped service to ``target`` (Manager.pm l.1484-1489, state
        ``relocate``; the LRM moves the config, PVEVM.pm/PVECT.pm migrate offline) and let
        ``target``'s LRM start it, the nodes it failed on going with it."""
        dst = self.peers[target]
        with state.locked(self.run_dir, FAILED_NODES):
            nodes = state.read_state(self.run_dir, FAILED_NODES, {}) or {}
            nodes.pop(sid, None)
            state.write_state(self.run_dir, FAILED_NODES, nodes)
        try:
            move_config(self, dst, kind, vmid)
        except FileNotFoundError:
            return  # another of its requests relocated it already
        with state.locked(dst.run_dir, FAILED_NODES):
            there = state.read_state(dst.run_dir, FAILED_NODES, {}) or {}
            there[sid] = failed
            state.write_state(dst.run_dir, FAILED_NODES, there)
        record(
            self,
            {
                "sid": sid,
                "op": "relocate",
                "node": self.node,
                "target": target,
                "error": None,
                "why": why,
                "log": f"relocate service '{sid}' to node '{target}' after its start failed on "
                f"{', '.join(failed)}: {why}",
                "at": time.time(),
            },
        )
        dst.ha_queue(kind, vmid, "start")
