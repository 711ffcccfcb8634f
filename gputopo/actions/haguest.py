"""A guest that is an HA resource: what its start's undo and a rollback's end wait for.

For an HA resource a start is a ``hastart`` task that only writes ``state started`` into
``ha/resources.cfg`` (pve-container API2/LXC/Status.pm and qemu-server API2/Qemu.pm, the
``vm_is_ha_managed`` branch: ``ha-manager set <sid> --state started``); the HA manager starts the
guest on its own rounds afterwards (pve-ha-manager src/PVE/HA/Manager.pm l.1014-1026 adds a new
resource as ``request_start``, l.1320-1324 moves a ``stopped`` service requested ``started`` to
``request_start``; the LRM then starts it, src/PVE/HA/LRM.pm). So a guest found stopped after
such a start is not "never started": it may start any moment, on GPUs an undo is about to give
to another driver. Its undo takes the request back (the requested state before) and waits until
the manager has settled: the guest stopped and the manager's service state no longer a request
(``request_start``/``started``/``request_stop``), before any GPU moves.

A stop of an HA resource queues ``stop <sid> <timeout>`` for the CRM (``ha-manager crm-command
stop``), which on its next round writes ``state stopped`` back (Manager.pm, the ``stop`` crm
command, update_service_config): one queued by a run that was killed can land after a later
start and stop the guest again. :func:`ha_stop` keeps a retried stop from queuing another, and
:func:`settle_guest` waits for every request to be carried out and then makes the requested
state match what runs.
"""

from __future__ import annotations

import time
from typing import Any

from gputopo.actions.base import StepContext
from gputopo.errors import ProxmoxError

# the manager's service states that say a request is still being carried out (Manager.pm
# change_service_state: request_start -> started -> ... ; request_stop -> stopped)
MOVING = {"request_start", "request_stop", "migrate", "relocate", "fence", "recovery", "freeze"}


def _sid(guest: str, vmid: int) -> str:
    return f"{'ct' if guest == 'lxc' else 'vm'}:{vmid}"


def _name(guest: str, vmid: int) -> str:
    return f"{'CT' if guest == 'lxc' else 'VM'} {vmid}"


def _manager_limit(ctx: StepContext) -> float:
    """Seconds the HA manager's own stop of a guest may take: its shutdown waits 60 s
    (PVECT.pm, PVEVM.pm shutdown), with the same margin as a shutdown task's."""
    return max(ctx.timeouts.guest, 60 + 35)


def ha_requested(ctx: StepContext, guest: str, vmid: int) -> str | None:
    """The guest's requested state in ``ha/resources.cfg`` (None: not an HA resource, or one in
    state ``ignored``). Raises ProxmoxError."""
    ha = ctx.ports.proxmox.guest_ha(guest, vmid)
    return ha.get("requested") if int(ha.get("managed") or 0) else None


def _settled(ha: dict[str, Any], status: str, want: str) -> bool:
    """The guest is ``want`` and the manager has no request of its own under way for it: its
    service state is the one ``want`` means (``started``/``stopped``; ``error`` and ``disabled``
    end its moves too), or it is no longer managed."""
    if status != want:
        return False
    if not int(ha.get("managed") or 0):
        return True
    st = ha.get("state")
    return st not in MOVING and st != ("stopped" if want == "running" else "started")


def wait_settled(ctx: StepContext, guest: str, vmid: int, want: str, deadline: float) -> None:
    """Poll until the guest is ``want`` (``running``, ``stopped``) and the HA manager settled
    (:func:`_settled`). Raises ProxmoxError naming the guest, its state and the next step when it
    has not by ``deadline`` (``time.monotonic()``)."""
    while True:
        ha = ctx.ports.proxmox.guest_ha(guest, vmid)
        status = ctx.ports.proxmox.guest_status(guest, vmid)
        if _settled(ha, status, want):
            return
        if time.monotonic() >= deadline:
            break
        time.sleep(ctx.timeouts.poll)
    sid = _sid(guest, vmid)
    raise ProxmoxError(
        f"{_name(guest, vmid)} ({sid})",
        None,
        f"the HA manager did not settle: {_name(guest, vmid)} is {status}, its HA state "
        f"{ha.get('state')}, requested {ha.get('requested')} (want {want}); see 'ha-manager status'",
    )


def moved_away(ctx: StepContext, guest: str, vmid: int) -> str | None:
    """One line saying the HA manager moved the guest to another node, for a guest whose
    status/current this node no longer answers (its config is gone from here), or None where it
    is still here. A failed HA start is restarted ``max_restart`` times, then the CRM relocates
    the service to another node its rules or group allow (pve-ha-manager src/PVE/HA/Manager.pm
    l.1468-1497, ``failed_nodes``/``try_next``), where the LRM starts it: polling its status
    here until a timeout would only say "not running". Raises nothing."""
    try:
        ctx.ports.proxmox.guest_status(guest, vmid)
        return None
    except ProxmoxError:
        pass
    name, sid = _name(guest, vmid), _sid(guest, vmid)
    where = None
    cluster = ctx.ports.cluster
    if cluster is not None and guest == "qemu":
        try:
            where = next(
                (n for n in cluster.nodes() if any(int(g["vmid"]) == vmid for g in cluster.node_vms(n))),
                None,
            )
        except ProxmoxError:
            where = None
    if where is None:
        return (
            f"{name} is no longer on this node: the HA manager relocated it after its start failed "
            f"here (max_restart, max_relocate of {sid}); see 'ha-manager status' and this node's "
            f"start task log of {name}"
        )
    return (
        f"{name} was relocated by the HA manager to node {where} after its start failed here "
        f"(max_restart, max_relocate of {sid}): it no longer uses this node's GPUs; see this "
        f"node's start task log of {name} for why, and 'ha-manager status'"
    )


def take_back_start(ctx: StepContext, guest: str, vmid: int, requested_before: str) -> str:
    """Undo an HA resource's start that asked for ``started`` where it was ``requested_before``:
    set that state back (``PUT /cluster/ha/resources/{sid}``, what ``ha-manager set`` calls) and
    wait until the guest is stopped and the manager settled; a guest the manager started
    meanwhile is stopped by it (``stopped``/``disabled``), one no longer managed (``ignored``) is
    shut down here. Returns what it did ("" for nothing). Raises ProxmoxError."""
    sid = _sid(guest, vmid)
    done = []
    away = moved_away(ctx, guest, vmid)
    if away is not None:
        # no longer this node's: its requested state is the cluster's, the manager stops it
        # where it is now; nothing of it is left here to wait for
        ctx.ports.proxmox.ha_set_state(sid, requested_before)
        return f"set HA resource {sid} back to state {requested_before} ({away})"
    now = ctx.ports.proxmox.guest_ha(guest, vmid)
    if int(now.get("managed") or 0) and now.get("requested") != requested_before:
        ctx.ports.proxmox.ha_set_state(sid, requested_before)
        done.append(f"set HA resource {sid} back to state {requested_before}")
    limit = _manager_limit(ctx)
    deadline = time.monotonic() + limit
    if requested_before == "ignored":
        # no longer the manager's: a start it made meanwhile is stopped here
        if ctx.ports.proxmox.guest_status(guest, vmid) == "running":
            ctx.ports.proxmox.guest_action(guest, vmid, "shutdown", limit)
            done.append(f"stopped {guest} {vmid}")
    was_running = ctx.ports.proxmox.guest_status(guest, vmid) == "running"
    wait_settled(ctx, guest, vmid, "stopped", deadline)
    if was_running and requested_before != "ignored":
        done.append(f"the HA manager stopped {guest} {vmid} again")
    return "; ".join(done)


def _error_line(guest: str, vmid: int, timeout: int) -> str:
    sid, name = _sid(guest, vmid), _name(guest, vmid)
    return (
        f"{name} did not shut down within {timeout} s and the HA manager put {sid} in its error "
        f"state; it still runs (an HA {'container' if guest == 'lxc' else 'VM'}'s stop"
        + (" has no force: policy.force_stop does not apply" if guest == "lxc" else " failed")
        + f"): stop what keeps it up, run 'ha-manager set {sid} --state disabled', then "
        f"'ha-manager set {sid} --state started', then 'gputopo recover'"
    )


def ha_stop(ctx: StepContext, guest: str, vmid: int, shutdown_timeout: int) -> bool:
    """Stop an HA resource through the HA manager and wait until it is stopped and the manager
    settled; False (nothing done) for a guest that is not one. A stop already under way (its
    requested state ``stopped`` or its service state ``request_stop``: the CRM writes both in
    the round that takes a ``stop`` command, Manager.pm l.1422-1438, e.g. one queued before a
    kill) is waited for, not queued again: a second ``stop`` would be taken a round later and
    could write ``stopped`` after the guest's next start (one taken while the service is
    ``stopped`` is ignored, l.1292-1293). The manager's shutdown of a container has no force
    (PVECT.pm l.85-105): one that outlasts its timeout puts the service in ``error`` while it runs
    (l.1199-1217), which fails here at once with the way out. Raises ProxmoxError."""
    ha = ctx.ports.proxmox.guest_ha(guest, vmid)
    if not int(ha.get("managed") or 0):
        return False
    limit = ctx.timeouts.shutdown(shutdown_timeout)
    deadline = time.monotonic() + limit
    if ha.get("requested") != "stopped" and ha.get("state") != "request_stop":
        res = ctx.ports.proxmox.guest_action(
            guest, vmid, "shutdown", limit, shutdown_timeout=shutdown_timeout
        )
        for w in res.warnings:
            ctx.warn(f"{_name(guest, vmid)} shutdown: {w}")
    while True:
        ha = ctx.ports.proxmox.guest_ha(guest, vmid)
        status = ctx.ports.proxmox.guest_status(guest, vmid)
        if _settled(ha, status, "stopped"):
            return True
        if ha.get("state") == "error":
            raise ProxmoxError(f"{_name(guest, vmid)} stop", None, _error_line(guest, vmid, shutdown_timeout))
        if time.monotonic() >= deadline:
            wait_settled(ctx, guest, vmid, "stopped", deadline)  # raises, naming it
        time.sleep(ctx.timeouts.poll)


def settle_guest(ctx: StepContext, guest: str, vmid: int) -> str:
    """Wait until the HA manager carried out every request for the guest (its service state
    agrees with what runs), then make the requested state match what runs where it does not:
    ``started`` under a running guest (a late ``stop`` wrote ``stopped``, and the manager would
    stop it). Returns what it did ("" for nothing). Raises ProxmoxError when the manager does not
    settle within the guest timeout."""
    if moved_away(ctx, guest, vmid) is not None:
        return ""  # the HA manager relocated it: nothing of it left on this node to settle
    deadline = time.monotonic() + _manager_limit(ctx)
    while True:
        ha = ctx.ports.proxmox.guest_ha(guest, vmid)
        if not int(ha.get("managed") or 0):
            return ""
        status = ctx.ports.proxmox.guest_status(guest, vmid)
        if _settled(ha, status, status):
            break
        if time.monotonic() >= deadline:
            wait_settled(ctx, guest, vmid, status, deadline)  # raises, naming it
        time.sleep(ctx.timeouts.poll)
    if status != "running" or ha.get("requested") in (None, "started"):
        return ""
    sid = _sid(guest, vmid)
    ctx.ports.proxmox.ha_set_state(sid, "started")
    wait_settled(ctx, guest, vmid, "running", deadline)
    return f"set HA resource {sid} back to state started under the running {_name(guest, vmid)}"
