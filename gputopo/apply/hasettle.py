"""The end of a recover or a rollback on a host with HA-managed guests: every request gputopo
queued for the HA manager carried out or withdrawn before it reports, and each guest's requested
state matching what runs (:func:`gputopo.actions.haguest.settle_guest`)."""

from __future__ import annotations

import time
from typing import Any

from gputopo.actions.guest import guest_name
from gputopo.actions.guesttasks import task_guest
from gputopo.actions.haguest import settle_guest, wait_settled
from gputopo.apply.journal import Journal, TaskStarted
from gputopo.apply.runner import Runner
from gputopo.errors import ProxmoxError

UNDONE = ("begun", "failed", "undo-begin")  # a stop step that may have queued a stop not carried out yet


def settle_ha_guests(runner: Runner) -> bool:
    """Settle every guest that a begun step of the journal stops or starts and that is an HA
    resource, noting what it did; False (noted, naming the guest and what to look at) when one
    did not settle."""
    guests: list[tuple[str, int]] = []
    actions = runner.j.header.actions
    for i in dict.fromkeys(runner.j.begun()):
        if not 0 <= i < len(actions):
            continue
        a = actions[i]
        for g in (a.stopped_guest(), a.started_guest()):
            if g is not None and g not in guests:
                guests.append(g)
    ok = True
    for guest, vmid in guests:
        try:
            done = settle_guest(runner.ctx, guest, vmid)
        except ProxmoxError as e:
            runner.progress.note(f"HA: {e}")
            ok = False
            continue
        if done:
            runner.progress.note(f"HA: {done}")
    return ok


def _queued_stops(runner: Runner, j: Journal) -> list[tuple[Any, str, int]]:
    """(the stop step, guest, vmid) of each HA resource whose stop a step asked the HA manager
    for and did not see carried out: its ``hastop`` task (the journal's, or one the node lists
    that started since the apply began: a kill can come between Proxmox's answer and the
    journal's write) ended at once, while the stop waits in the CRM's queue for its next round
    (pve-ha-manager src/PVE/HA/Config.pm queue_crm_commands, Manager.pm read_crm_commands)."""
    since = j.header.started - 1
    journaled = {task_guest(r.upid)[1] for r in j.of(TaskStarted) if r.upid.split(":")[5:6] == ["hastop"]}
    out = []
    for step in j.steps().values():
        a, before = step.action, step.before
        requested = (
            before.get("ha_requested") if isinstance(before, dict) else getattr(before, "ha_requested", None)
        )
        if a.kind != "stop_guest" or step.status not in UNDONE or requested is None:
            continue
        if str(a.vmid) not in journaled:
            try:
                upids = runner.ctx.ports.proxmox.recent_tasks(a.vmid, "hastop")
            except ProxmoxError:
                upids = []
            if not any(int(u.split(":")[4], 16) >= since for u in upids if len(u.split(":")) > 5):
                continue  # killed before its stop was asked for
        out.append((a, a.guest, a.vmid))
    return out


def wait_queued_ha_stops(runner: Runner, j: Journal) -> bool:
    """Before any undo decides on a guest's status: wait until the HA manager carried out each
    stop a step queued (:func:`_queued_stops`), within that step's limit, so that the undo starts
    the guest again rather than finding it running and leaving it to a stop that comes later.
    False (noted, naming the guest) when one was not carried out in time."""
    ok = True
    for a, guest, vmid in _queued_stops(runner, j):
        limit = runner.ctx.timeouts.shutdown(a.shutdown_timeout)
        runner.progress.note(
            f"waiting for the HA manager to carry out the stop of {guest_name(guest, vmid)} it was asked for"
        )
        try:
            wait_settled(runner.ctx, guest, vmid, "stopped", time.monotonic() + limit)
        except ProxmoxError as e:
            runner.progress.note(f"HA: {e}")
            ok = False
    return ok
