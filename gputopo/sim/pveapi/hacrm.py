"""HA-managed guests of the simulated node: ``hastart``/``hastop`` tasks and the CRM's delay.

What a real node does (pve-container src/PVE/API2/LXC/Status.pm vm_start/vm_stop/vm_shutdown,
qemu-server src/PVE/API2/Qemu.pm vm_start/vm_stop/vm_shutdown, each behind
``PVE::HA::Config::vm_is_ha_managed($vmid)``):

* a start of a guest listed in ``ha/resources.cfg`` forks a ``hastart`` worker that prints
  ``Requesting HA start for CT 101`` and runs ``ha-manager set ct:101 --state started``: the
  task rewrites the resource's requested state and ends ``OK`` at once;
* a stop forks a ``hastop`` worker (``Requesting HA stop for CT 101``) that runs
  ``ha-manager crm-command stop ct:101 0`` (a shutdown: ``... stop ct:101 <timeout>``, 60 by
  default), which only appends ``stop <sid> <timeout>`` to the CRM's command queue
  (pve-ha-manager src/PVE/HA/Config.pm queue_crm_commands) and ends ``OK`` at once;
* the CRM reads the queue on its next round (src/PVE/HA/Manager.pm read_crm_commands: the
  ``stop`` command; then the ``cmd`` branch of manage: ``request_stop`` and
  ``update_service_config`` with ``state => 'stopped'``: the requested state in
  ``resources.cfg`` becomes ``stopped``), and the node's LRM runs the real stop on its round
  (src/PVE/HA/Resources/PVECT.pm / PVEVM.pm shutdown: timeout 0 is ``vm_stop``, a timeout is
  ``vm_shutdown``, for a VM with ``forceStop => 1``). CRM and LRM each work in rounds of 10 s
  (src/PVE/HA/CRM.pm and LRM.pm: ``$max_time = 10``, ``sleep_until($startime + $max_time)``),
  so the guest moves seconds after the task ended;
* a resource whose requested state changes (``PUT /cluster/ha/resources/{sid}`` with
  ``state``, what ``ha-manager set`` calls: src/PVE/API2/HA/Resources.pm update) is moved by
  the CRM the same way (Manager.pm next_state_stopped / next_state_started).

Here a request is a run-state entry (``ha-requests``): the CRM takes it after half its delay
(latency ``ha.crm``: :data:`DEFAULT_CRM_DELAY` unless set, :data:`gputopo.sim.pace.HA_CRM`
times the pace scale when paced; a ``stop`` then rewrites the requested state), and the guest
moves after the whole delay plus its own stop or start latency; it runs on a timer or when a
status read finds it due, so a restarted API server still carries it out. ``status/current``
answers ``ha: {managed: 1, state: <the manager's service state>}`` (Config.pm
get_service_status; ``{managed: 0}`` otherwise, and for a resource in state ``ignored``:
``service_check_ha_state``). The manager's states modelled: ``started``, ``stopped``,
``request_start``, ``request_stop``, ``error`` (a start that failed, a stop that did not end).
The state shown is the manager's last round's: a request shows once the CRM took it, a resource
the CRM has not added yet has none (``state: null``).

The CRM also acts on its own, in rounds (a timer every half delay while the API server listens,
and every status read): a resource requested ``started`` whose guest is stopped is started
(Manager.pm l.1014-1026, l.1320-1324), and a start whose resource is no longer requested
``started`` when it is due is not carried out (next_state_started). The LRM's side (no-force
container shutdowns, start retries) is :mod:`gputopo.sim.pveapi.halrm`. A run opts into a real
node's pace with :func:`gputopo.sim.pace.set_latencies` (``ha.crm`` 10 s); the default stays fast.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from gputopo.formats.hacfg import Section
from gputopo.sim import state
from gputopo.sim.pveapi.halrm import REQUESTS, SERVICE_STATES, HaLrmHandlers
from gputopo.sim.pveapi.harules import rules_round

DEFAULT_CRM_DELAY = 0.3  # seconds; always longer than a task's default latency (tasks.DEFAULT_LATENCY)
# how the CRM names a guest (Config.pm parse_sid: vm:<id>, ct:<id>)
SID_TYPE = {"lxc": "ct", "qemu": "vm"}
HA_TASK = {"start": "hastart", "stop": "hastop", "shutdown": "hastop"}
SEEN = "ha-seen"  # sid -> when the CRM first saw the resource (0: before this server ran)
_worker_clock = threading.local()  # when an orphaned hastart/hastop worker ran (its due time)


class HaCrmHandlers(HaLrmHandlers):
    """The HA manager's handling of guests on :class:`gputopo.sim.pveapi.PveApiServer` (a mixin)."""

    def ha_resource_of(self, kind: str, vmid: int) -> Section | None:
        """The ``resources.cfg`` section that makes guest ``vmid`` HA-managed, or None.

        Config.pm vm_is_ha_managed looks up both ``vm:<id>`` and ``ct:<id>``; a resource in state
        ``ignored`` counts as not managed (service_check_ha_state)."""
        for r in self._ha_read("resources.cfg")[1]:
            if r.type in ("vm", "ct") and r.id == str(vmid):
                return None if r.props.get("state") == "ignored" else r
        return None

    def ha_status(self, kind: str, vmid: int) -> dict[str, Any]:
        """status/current's ``ha`` (Config.pm get_service_status on ``ct:ID``/``vm:ID``)."""
        self.ha_tick()
        sid = f"{SID_TYPE[kind]}:{vmid}"
        r = self.ha_resource_of(kind, vmid)
        if r is None or r.sid != sid:
            return {"managed": 0}
        return {"managed": 1, "state": self._ha_service_state(kind, vmid, sid)}

    def _ha_service_state(self, kind: str, vmid: int, sid: str) -> str | None:
        """The manager's state of service ``sid`` as the node shows it (Config.pm
        get_service_status reads manager_status, which the CRM writes once per round): None for
        a resource the CRM has not added yet (Manager.pm l.1014-1026 adds it on its round); a
        request shows only once the CRM took it (``request_stop``/``request_start``), before
        that the state it had (``started`` under a guest a stop is queued for)."""
        now = time.time()
        pending = [q for q in state.read_state(self.run_dir, REQUESTS, []) or [] if q["sid"] == sid]
        taken = [q for q in pending if q["pickup"] <= now]
        if taken:
            return "request_stop" if taken[-1]["op"] == "stop" else "request_start"
        stored = (state.read_state(self.run_dir, SERVICE_STATES, {}) or {}).get(sid)
        if stored:
            return stored
        seen = (state.read_state(self.run_dir, SEEN, {}) or {}).get(sid)
        if seen is None or now < seen + self._crm_round():
            return None
        return "started" if state.guest_status(self.run_dir, kind, vmid) == "running" else "stopped"

    def _crm_round(self) -> float:
        """Half the CRM's delay: how long the simulated CRM takes to notice anything."""
        lat = state.read_state(self.run_dir, "latencies", {}) or {}
        return float(lat.get("ha.crm", DEFAULT_CRM_DELAY)) / 2

    def _ha_track_added(self) -> None:
        """Note when the CRM first saw each resource (:data:`SEEN`); those present on its first
        round ever count as added long ago (the node's CRM ran before this API server)."""
        path = self.pve_root / "ha" / "resources.cfg"
        if not path.is_file():
            return
        sids = [r.sid for r in self._ha_read("resources.cfg")[1]]
        with state.locked(self.run_dir, SEEN):
            seen = state.read_state(self.run_dir, SEEN, None)
            if seen is None:
                seen = {sid: 0.0 for sid in sids}
            elif all(sid in seen for sid in sids):
                return
            seen.update({sid: time.time() for sid in sids if sid not in seen})
            state.write_state(self.run_dir, SEEN, seen)

    def ha_task_lines(self, kind: str, vmid: int, action: str) -> list[str]:
        """What the hastart/hastop worker prints (Status.pm / Qemu.pm $hacmd)."""
        what = f"{'CT' if kind == 'lxc' else 'VM'} {vmid}"
        return [f"Requesting HA {'start' if action == 'start' else 'stop'} for {what}"]

    def ha_task_effect(self, kind: str, vmid: int, action: str, timeout: int | None) -> None:
        """Run the hastart/hastop worker's command: ``ha-manager set <sid> --state started``
        (the requested state written now) or ``ha-manager crm-command stop <sid> <timeout>``
        (queued for the CRM); either way the guest moves only after the CRM's delay."""
        sid = f"{SID_TYPE[kind]}:{vmid}"
        if action == "start":
            self._ha_set_requested(sid, "started")
            self.ha_queue(kind, vmid, "start")
        else:
            # vm_stop passes 0 (hard stop); vm_shutdown its timeout, 60 by default
            self.ha_queue(kind, vmid, "stop", 0 if action == "stop" else (60 if timeout is None else timeout))

    def _ha_set_requested(self, sid: str, requested: str) -> None:
        # Config.pm update_resources_config under lock_ha_domain; 'started' is the schema
        # default but is written out when set (Resources.pm update -> write_config)
        with self._ha_lock("update resource failed"):
            _, resources = self._ha_read("resources.cfg")
            for r in resources:
                if r.sid == sid:
                    r.props["state"] = requested
            self._ha_write("resources.cfg", resources)

    def _crm_delay(self, kind: str, op: str) -> float:
        lat = state.read_state(self.run_dir, "latencies", {}) or {}
        guest = {
            "lxc": {"start": "vzstart", "stop": "vzstop"},
            "qemu": {"start": "qmstart", "stop": "qmstop"},
        }
        own = float(lat.get(guest[kind][op], 0.0))
        return float(lat.get("ha.crm", DEFAULT_CRM_DELAY)) + own

    def ha_queue(self, kind: str, vmid: int, op: str, timeout: int = 0) -> None:
        """Queue a CRM request to ``op`` (start, stop) the guest: the CRM takes it after half
        the delay (a ``stop`` then writes the requested state ``stopped``), the guest moves
        after all of it."""
        sid = f"{SID_TYPE[kind]}:{vmid}"
        delay = self._crm_delay(kind, op)
        now = getattr(_worker_clock, "at", None) or time.time()
        crm = float((state.read_state(self.run_dir, "latencies", {}) or {}).get("ha.crm", DEFAULT_CRM_DELAY))
        with state.locked(self.run_dir, REQUESTS):
            queue = state.read_state(self.run_dir, REQUESTS, []) or []
            queue.append(
                {
                    "sid": sid,
                    "kind": kind,
                    "vmid": vmid,
                    "op": op,
                    "timeout": timeout,
                    "pickup": now + crm / 2,
                    "due": now + delay,
                }
            )
            state.write_state(self.run_dir, REQUESTS, queue)
        for seconds in (crm / 2, delay):
            timer = threading.Timer(max(0.0, now + seconds - time.time()), self.ha_tick)
            timer.daemon = True
            self._timers.append(timer)
            timer.start()

    def ha_tick(self) -> None:
        """Carry out every CRM request that is due (a timer, or a read after its due time), then
        let the CRM act on its own (:meth:`_ha_own_will`)."""
        self._ha_arm_rounds()
        rules_round(self)  # the placement rules, once per round (harules.py)
        self._ha_track_added()
        self._ha_run_workers()
        self._ha_take_due()
        self._ha_own_will()

    def _ha_run_workers(self) -> None:
        """Run every hastart/hastop worker that is due, whether or not its caller still asks
        for its status: the worker is the node's (a forked ``ha-manager`` call, pve-container
        Status.pm / qemu-server Qemu.pm ``$rpcenv->fork_worker('hastart', ...)``), it runs to its
        end when the process that asked for it is gone."""
        now = time.time()
        for upid, task in list((state.read_state(self.run_dir, "tasks", {}) or {}).items()):
            if task["action"].startswith("ha") and task["status"] == "running" and task["due"] <= now:
                # its request queued when the worker ran, not when someone looked
                _worker_clock.at = task["due"]
                try:
                    self._finish_task(upid)
                finally:
                    _worker_clock.at = None

    def _ha_take_due(self) -> None:
        if not state.read_state(self.run_dir, REQUESTS, []):
            return  # nothing queued: a read leaves the run state as it was
        with state.locked(self.run_dir, REQUESTS):
            queue = state.read_state(self.run_dir, REQUESTS, []) or []
            now = time.time()
            taken = [q for q in queue if q["pickup"] <= now and not q.get("taken")]
            due = [q for q in queue if q["due"] <= now]
            if not taken and not due:
                return
            for q in taken:
                q["taken"] = True
            state.write_state(self.run_dir, REQUESTS, [q for q in queue if q["due"] > now])
        errored = state.read_state(self.run_dir, SERVICE_STATES, {}) or {}
        # Manager.pm: a crm 'stop' acts only on a started service (next_state_started); one in
        # 'error' stays as it is until it is disabled (next_state_error)
        due = [q for q in due if errored.get(q["sid"]) != "error"]
        starting = {q["sid"] for q in queue if q["op"] == "start"}
        for q in taken:
            running = state.guest_status(self.run_dir, q["kind"], q["vmid"]) == "running"
            if not running and q["sid"] not in starting:
                # Manager.pm l.1292-1293 (next_state_stopped): a 'stop' command for a service
                # already stopped is ignored; nothing is written
                continue
            if q["op"] == "stop" and errored.get(q["sid"]) != "error":
                # Manager.pm manage, the 'stop' crm command: request_stop, and the requested
                # state written back as 'stopped' (update_service_config)
                self._ha_set_requested(q["sid"], "stopped")
        for q in due:
            self._ha_run(q)

    def ha_requested_changed(self, sid: str, before: str | None, after: str | None) -> None:
        """The CRM's answer to a resource's requested state changed through the API (Manager.pm
        next_state_stopped: ``started`` starts a stopped guest; next_state_started:
        ``stopped``/``disabled`` stops a running one)."""
        if before == after or ":" not in sid:
            return
        t, vmid = sid.split(":", 1)
        kind = "lxc" if t == "ct" else "qemu"
        running = state.guest_status(self.run_dir, kind, vmid) == "running"
        if (after or "started") == "started" and not running:
            self.ha_queue(kind, int(vmid), "start")
        elif after in ("stopped", "disabled") and running:
            self.ha_queue(kind, int(vmid), "stop", 60)

    def _ha_requested(self, sid: str) -> str | None:
        """The requested state of resource ``sid`` in ``resources.cfg`` (None: not one)."""
        r = next((x for x in self._ha_read("resources.cfg")[1] if x.sid == sid), None)
        return None if r is None else r.props.get("state", "started")

    def _ha_own_will(self) -> None:
        """The CRM's own rounds: a resource requested ``started`` whose guest is stopped, with no
        request of its own under way and not in ``error``, is started without anyone asking
        (pve-ha-manager src/PVE/HA/Manager.pm l.1014-1026: a new resource requested 'started'
        is added as 'request_start'; l.1320-1324, next_state_stopped: a 'stopped' service whose
        requested state is 'started' goes to 'request_start'; the LRM then starts it)."""
        path = self.pve_root / "ha" / "resources.cfg"
        if not path.is_file():
            return
        pending = {q["sid"] for q in state.read_state(self.run_dir, REQUESTS, []) or []}
        errored = state.read_state(self.run_dir, SERVICE_STATES, {}) or {}
        for r in self._ha_read("resources.cfg")[1]:
            if r.type not in ("vm", "ct") or r.props.get("state", "started") != "started":
                continue
            if r.sid in pending or errored.get(r.sid) == "error":
                continue
            kind = "lxc" if r.type == "ct" else "qemu"
            conf = self.pve_root / "nodes" / self.node / ("lxc" if kind == "lxc" else "qemu-server")
            if (conf / f"{r.id}.conf").is_file() and state.guest_status(
                self.run_dir, kind, r.id
            ) != "running":
                self.ha_queue(kind, int(r.id), "start")

    def _ha_arm_rounds(self) -> None:
        """Keep the CRM's rounds going while the API server listens (CRM.pm: a round every
        ``$max_time`` = 10 s; here every half of ``ha.crm``), so it acts with nobody reading."""
        if getattr(self, "_ha_round", None) is not None or getattr(self, "_httpd", None) is None:
            return
        crm = float((state.read_state(self.run_dir, "latencies", {}) or {}).get("ha.crm", DEFAULT_CRM_DELAY))

        def round_() -> None:
            self._ha_round = None
            if getattr(self, "_httpd", None) is None:
                return
            try:
                self.ha_tick()
            except Exception:  # a round that fails (a file mid-write) is retried on the next
                self._ha_arm_rounds()

        timer = threading.Timer(max(crm / 2, 0.05), round_)
        timer.daemon = True
        self._ha_round = timer
        self._timers[:] = [t for t in self._timers if t.is_alive()] + [timer]
        timer.start()
