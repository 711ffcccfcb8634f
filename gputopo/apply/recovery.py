"""Settle the journal an interrupted apply left: roll it back (the default) or finish it.

Nothing is asked of the Proxmox API before the journal is found: the node the API calls name
is compared with this host first (no API call), then, under the lock, a host without an open
journal returns ``nothing-to-recover`` whether or not the API answers. With a journal, the
API must serve this host (:func:`gputopo.apply.preflight.check_recover_node`); one that does
not answer (pmxcfs or pveproxy down after a crash) is warned about and recover goes on when
the journal names this host: the undo steps on sysfs and host files run, those that need the
API fail and are named (ApplyFailed, the journal stays open for a recover once it answers).

``dry_run`` changes nothing: the result (``dry-run``) lists in ``would`` what recover would
do, in order (the undo steps, then the guests and services it would start; with ``finish``
the steps it would run), after the same checks (the lock, the node, ``finish`` after a
rollback began).
"""

from __future__ import annotations

import os
import time

from gputopo.actions import RunningBefore, Timeouts
from gputopo.apply import signals
from gputopo.apply.hasettle import settle_ha_guests
from gputopo.apply.journal import End, Journal, Recover, find_unfinished
from gputopo.apply.lock import HostLock
from gputopo.apply.outcome import would_recover
from gputopo.apply.preflight import check_recover_node, refuse_other_node_here
from gputopo.apply.progress import ApplyResult, Progress, Quiet
from gputopo.apply.rollback import roll_back, roll_back_and_raise
from gputopo.apply.runner import Runner, step_context
from gputopo.errors import ApplyFailed, JournalError, ProxmoxError
from gputopo.ports import Ports


def recover(
    ports: Ports,
    *,
    root: str | os.PathLike,
    finish: bool = False,
    progress: Progress | None = None,
    timeouts: Timeouts | None = None,
    dry_run: bool = False,
) -> ApplyResult:
    """Settle the journal an interrupted apply left under ``root``.

    By default it rolls back: every begun step is undone from its journaled before-state, then
    what ran before is started again. Rolling back is the default because the before-state is a
    host that was known to work, recorded in full; finishing forward depends on every remaining
    step working on a host in an unknown middle state. ``finish`` instead runs the steps that
    did not complete (each step is idempotent); if one fails, everything is rolled back.
    A journal left open by a rollback that needed a human is retried the same way: every undo
    that did not complete runs again from its before-state (devices on which a write hung are
    tried again, under the timeout); when all succeed the journal ends ``rolled-back``, else a
    new ``NeedsHuman`` record keeps it open. A journal whose steps were all done and only the
    verification ran is closed as applied: verification is not part of the transaction.

    ``dry_run`` changes nothing (the module says what it lists).

    Returns an ApplyResult (``nothing-to-recover``, ``recovered``, ``finished``, ``applied``,
    ``dry-run``).
    Raises PreflightError (an API whose node is not this host, or that does not answer while
    the journal does not name this host), LockHeld, JournalError
    (``finish`` on a journal whose rollback began), ApplyFailed (exit 3 naming the devices still
    stuck; the journal stays open).
    """
    root = str(root)
    refuse_other_node_here(ports, root)
    t = timeouts or Timeouts()
    progress = Quiet(progress or Progress())
    t0 = time.monotonic()
    with HostLock(root), signals.interruptible():
        j = find_unfinished(root)
        if j is None:
            return ApplyResult("nothing-to-recover")
        check_recover_node(ports, root, j.header.node, progress.note)
        if not dry_run:
            progress.note(f"recovering {j.describe()}")
        runner = Runner(step_context(ports, root, t, progress), j, progress)
        rb = RunningBefore(
            guests=dict(j.header.running_before.guests), services=dict(j.header.running_before.services)
        )
        undoing = any(r.type.startswith("undo-") for r in j.records)
        early = _without_steps(runner, j, rb, t0, dry_run, finish, undoing)
        if early is not None:
            return early
        if finish and undoing:
            # half of it is already undone: finishing forward would build on an unknown middle
            raise JournalError(
                f"{j.path}: its rollback already began; run 'gputopo recover' without --finish"
            )
        j.append(Recover(mode="finish" if finish else "rollback", pid=os.getpid()))
        if finish:
            return _finish(runner, j, rb, t0)
        return _roll_back_again(runner, j, rb, t0)


# what a signal says once the journal is about to end applied
SETTLED = "{name} received: every step is done; the journal ends applied"


def _without_steps(
    runner: Runner, j: Journal, rb: RunningBefore, t0: float, dry_run: bool, finish: bool, undoing: bool
) -> ApplyResult | None:
    """What recover returns without running a step: the dry run's list of what it would do, or
    an apply whose steps were all done and only its verification ran, closed as applied.
    None: the steps are to be settled."""
    if dry_run:
        return ApplyResult(
            "dry-run",
            wall_s=time.monotonic() - t0,
            journal=str(j.path),
            would=would_recover(runner, j, rb, finish, undoing),
        )
    if j.verifying and not undoing:
        signals.settle(runner.progress.note, SETTLED)
        j.append(End(result="applied", verify="did not finish"))
        runner.progress.note(
            "every step was done; only the verification was interrupted: run 'gputopo verify'"
        )
        return ApplyResult("applied", wall_s=time.monotonic() - t0, journal=str(j.path))
    return None


def _finish(runner: Runner, j: Journal, rb: RunningBefore, t0: float) -> ApplyResult:
    """Run the steps that did not complete (each is idempotent); one that fails rolls back
    everything (:func:`roll_back_and_raise`)."""
    done = {i for i, s in j.steps().items() if s.status == "done"}
    try:
        runner.forward(list(j.header.actions), skip=done)
        if not settle_ha_guests(runner):
            raise ProxmoxError("HA", None, "the HA manager did not settle after the finished steps")
    except BaseException as exc:
        roll_back_and_raise(runner, j, exc, rb)
    signals.settle(runner.progress.note, SETTLED)
    j.append(End(result="applied"))
    return ApplyResult("finished", steps=runner.results, wall_s=time.monotonic() - t0, journal=str(j.path))


def _roll_back_again(runner: Runner, j: Journal, rb: RunningBefore, t0: float) -> ApplyResult:
    """Undo every begun step again from its before-state (retrying those that did not
    complete). Raises ApplyFailed (exit 3) when one is still stuck: the journal stays open."""
    complete, stuck = roll_back(runner, j, rb, retry=True)
    nh = j.needs_human
    if nh is not None:
        raise ApplyFailed(
            "recover",
            JournalError(f"{j.path} stays open: {nh.left}"),
            complete,
            stuck,
            next_step=nh.next_step,
        )
    return ApplyResult("recovered", steps=runner.results, wall_s=time.monotonic() - t0, journal=str(j.path))
