"""Rolling back what an apply or a recover began: every begun step undone from the journal, the
journal ended ``rolled-back``, or left open with a ``NeedsHuman`` record naming what is left."""

from __future__ import annotations

from typing import NoReturn

from gputopo.actions import RunningBefore
from gputopo.actions.guesttasks import running_tasks, task_guest, wait_tasks
from gputopo.apply import signals
from gputopo.apply.hasettle import settle_ha_guests, wait_queued_ha_stops
from gputopo.apply.journal import End, Journal, NeedsHuman, RestartFailed, TaskStarted
from gputopo.apply.outcome import left_over, next_step
from gputopo.apply.runner import Runner
from gputopo.errors import ApplyFailed, GputopoError, Interrupted, SysfsTimeout


def _fail_step(runner: Runner) -> str:
    """The step whose error stopped the run, or (interrupted between two steps) the last one that began."""
    actions = runner.j.header.actions
    picks = [runner.failed_at] if runner.failed_at is not None else runner.j.begun()
    if picks and 0 <= picks[-1] < len(actions):
        return f"step {picks[-1] + 1} ({actions[picks[-1]].describe()})"
    return "a step"


def roll_back(
    runner: Runner, j: Journal, running_before: RunningBefore, retry: bool = False, reason: str | None = None
) -> tuple[bool, list[str]]:
    """Undo what ``runner``'s journal began, then end the journal as rolled back, or (when the
    rollback could not complete) append a ``NeedsHuman`` record naming the devices, the steps
    still to undo and what else is left, and leave it open: the next apply refuses and
    ``gputopo recover`` retries. Signals wait until the rollback ends (a second Ctrl-C must not
    leave half of it undone), and after it until the command's handlers are gone: a rollback
    that ended is not reported as interrupted."""
    signals.settle(runner.progress.note)
    mark = len(j.records)
    late = _wait_for_tasks(runner, j, running_before)
    stops_done = wait_queued_ha_stops(runner, j)
    complete, stuck = runner.backward(running_before, retry=retry)
    complete = stops_done and complete
    complete = settle_ha_guests(runner) and complete
    for key, line in late:  # its guest's status decided nothing: a human looks at it
        complete = False
        j.append(RestartFailed(what=key, error=line))
    if complete and not stuck:
        j.append(End(result="rolled-back", reason=reason))
    else:
        j.append(
            NeedsHuman(
                needs_human=list(stuck),
                pending=j.pending_undo(),
                reason=reason,
                left=left_over(j, mark),
                next_step=next_step(j, mark, list(stuck)),
            )
        )
    return complete, stuck


def _wait_for_tasks(runner: Runner, j: Journal, running_before: RunningBefore) -> list[tuple[str, str]]:
    """Wait for the guests' tasks the journal names that Proxmox still runs (the one a signal
    or a kill interrupted the wait for), each until its step's limit: every undo then decides
    on a guest's status once nothing gputopo asked of it is under way. Returns (guest key,
    line) of each task still running at its limit."""
    tasks = [(r.upid, r.t + r.limit) for r in j.of(TaskStarted)]
    guests = {int(k.split("/")[1]) for k in running_before.guests}
    for a in j.header.actions:
        guests |= {g[1] for g in (a.stopped_guest(), a.started_guest()) if g is not None}
    tasks += running_tasks(runner.ctx, guests, {u for u, _ in tasks})
    out = []
    for upid, line in wait_tasks(runner.ctx, tasks):
        runner.progress.note(f"warning: {line}")
        kind, vmid = task_guest(upid)
        keys = [
            k for k in running_before.guests if k.split("/")[1] == vmid and kind in (None, k.split("/")[0])
        ]
        out.append((keys[0] if keys else f"{kind or 'lxc'}/{vmid}", line))
    return out


def roll_back_and_raise(
    runner: Runner, j: Journal, exc: BaseException, running_before: RunningBefore
) -> NoReturn:
    """Undo what ``runner`` did after ``exc`` stopped it, close the journal, raise the outcome.

    Raises ApplyFailed (exit 3 naming the devices a human must look at, when the rollback could
    not complete or a write hung), or ``exc`` itself when it is not one of gputopo's errors.
    """
    e = signals.as_error(exc)
    where = _fail_step(runner)
    if isinstance(e, Interrupted):
        runner.progress.note(f"{where} was {e}; rolling back")
    else:
        runner.progress.note(f"{where} failed: {e}; rolling back")
    mark = len(j.records)
    complete, stuck = roll_back(runner, j, running_before)
    if isinstance(e, SysfsTimeout) and e.address:
        stuck = sorted(set(stuck) | {e.address})
    if not isinstance(e, GputopoError):
        raise exc
    nh = j.needs_human
    if nh is None:
        err = ApplyFailed(where, e, complete, stuck)
    else:  # the journal stays open: say what is left and what to do (exit 3)
        left = left_over(j, mark, said=str(e))
        err = ApplyFailed(where, e, complete, stuck, left=left, next_step=nh.next_step)
    if isinstance(e, Interrupted) and err.exit_code != 3:
        err.exit_code = e.exit_code  # a rollback left to a human (3) still outranks it
    raise err from exc
