"""The end of a recover or a rollback on a host with HA-managed guests: every request gputopo
queued for the HA manager carried out or withdrawn before it reports, and each guest's requested
state matching what runs (:func:`gputopo.actions.haguest.settle_guest`)."""

from __future__ import annotations

from gputopo.actions.haguest import settle_guest
from gputopo.apply.runner import Runner
from gputopo.errors import ProxmoxError


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
