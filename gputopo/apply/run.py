"""Apply a plan to a host, and recover one that was interrupted.

:func:`apply` runs, in this order:

0. the Proxmox API must act on this host (:func:`gputopo.apply.preflight.refuse_other_node`):
   sysfs and ``pct`` act on this machine whoever calls, so a library caller is refused too;
a. discover + read the current state + plan; an empty plan returns ``no-changes``;
b. preflight (:mod:`gputopo.apply.preflight`): every problem is one line of a
   :class:`PreflightFailed` (exit 2) and nothing is changed;
c. the host lock ``<root>/run/lock/gputopo.lock`` (a second apply gets LockHeld);
d. facts and state are read again under the lock and planned again: a different plan means the
   host changed since it was checked and confirmed (:class:`HostChanged`); preflight again;
   the NVIDIA device nodes the containers will be given are made where missing
   (:func:`gputopo.apply.preflight.make_device_nodes`), or the apply is refused, nothing stopped;
e. the steps (:mod:`gputopo.apply.runner`), each journaled with the state before it, so any
   failure, or a later :func:`recover` after a crash, can undo the completed steps in reverse
   from the journal alone, then restart what ran before.

A sysfs write that hangs is never retried by the apply that saw it: the rollback leaves that
IOMMU group alone, the error names the device (exit 3) and the journal stays open (a
``NeedsHuman`` record), so the next apply refuses until :func:`recover`, run once a human fixed
the device, retries the undo steps left over. Once every step is done the apply is finished:
the verification that follows is not part of the transaction (a crash during it leaves an
applied host), except with ``rollback_on_verify_failure``, where a failed verification rolls back.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any, NoReturn

from gputopo.actions import RunningBefore, Timeouts
from gputopo.apply import signals
from gputopo.apply.journal import (
    End,
    Header,
    Journal,
    NeedsHuman,
    Recover,
    RunningBeforeRec,
    Verifying,
    find_unfinished,
)
from gputopo.apply.lock import HostLock
from gputopo.apply.outcome import left_over, next_step, would_recover
from gputopo.apply.preflight import (
    check_recover_node,
    make_device_nodes,
    preflight,
    refuse_other_node,
    refuse_other_node_here,
)
from gputopo.apply.progress import ApplyResult, Progress, Quiet
from gputopo.apply.runner import Runner, running_before_of, step_context
from gputopo.errors import (
    ApplyCancelled,
    ApplyFailed,
    GputopoError,
    HostChanged,
    Interrupted,
    JournalError,
    PreflightFailed,
    SysfsTimeout,
    VerifyFailed,
)
from gputopo.exitcodes import NEEDS_HUMAN
from gputopo.facts.observe import observe
from gputopo.model.facts import Facts
from gputopo.model.state import CurrentState
from gputopo.plan.model import Plan
from gputopo.plan.planner import plan as make_plan
from gputopo.plan.reads import spec_reads
from gputopo.plan.saved import SavedPlan, spec_digest
from gputopo.plan.spec import Spec
from gputopo.ports import Ports


def read_and_plan(
    spec: Spec, ports: Ports, root: str, node: str | None = None, ha: bool = True
) -> tuple[Facts, CurrentState, Plan]:
    """Discover ``root``, read the current state through ``ports`` and plan; ``ha`` False
    leaves the cluster's HA placement out (not read, not planned).

    Raises what observe and plan raise (RootError, SpecError, ProxmoxError, PlanRefused...).
    """
    facts, current = observe(
        root,
        spec_reads(spec, node),
        proxmox=ports.proxmox,
        exec=ports.exec,
        files=ports.files,
        cluster=ports.cluster if ha else None,
    )
    return facts, current, make_plan(facts, spec, current, node=node)


def _diff_text(a: Plan, b: Plan) -> str:
    old = [x.describe() for x in a.actions]
    new = [x.describe() for x in b.actions]
    added = [x for x in new if x not in old]
    gone = [x for x in old if x not in new]
    if added:
        return f"now also: {added[0]}"
    if gone:
        return f"no longer: {gone[0]}"
    return "the actions' details differ"


def _facts_summary(facts: Facts) -> dict[str, Any]:
    return {
        "gpus": {
            g.address: {
                "driver": g.driver,
                "override": g.driver_override,
                "numa": g.numa_node,
                "minor": g.minor,
                "group": g.iommu_group,
            }
            for g in facts.gpus
        },
        "iommu": facts.host.iommu_enabled,
        "nvidia": facts.host.nvidia_driver_version,
    }


def _fail_step(runner: Runner) -> str:
    """The step whose error stopped the run, or (interrupted between two steps) the last one that began."""
    actions = runner.j.header.actions
    picks = [runner.failed_at] if runner.failed_at is not None else runner.j.begun()
    if picks and 0 <= picks[-1] < len(actions):
        return f"step {picks[-1] + 1} ({actions[picks[-1]].describe()})"
    return "a step"


def _roll_back(
    runner: Runner, j: Journal, running_before: RunningBefore, retry: bool = False, reason: str | None = None
) -> tuple[bool, list[str]]:
    """Undo what ``runner``'s journal began, then end the journal as rolled back, or (when the
    rollback could not complete) append a ``NeedsHuman`` record naming the devices, the steps
    still to undo and what else is left, and leave it open: the next apply refuses and
    ``gputopo recover`` retries. Signals wait until the rollback ends (a second Ctrl-C must not
    leave half of it undone)."""
    with signals.deferred(runner.progress.note):
        mark = len(j.records)
        complete, stuck = runner.backward(running_before, retry=retry)
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


def _roll_back_and_raise(
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
    complete, stuck = _roll_back(runner, j, running_before)
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


def _read_checked(spec, ports, root, node, expected, spec_path, ha=True):
    """(facts, current, plan) read now, refusing an earlier apply's open journal first; with a
    saved plan, its actions, refused when the host is no longer what it was made from."""
    j0 = find_unfinished(root)
    if j0 is not None:
        raise j0.unfinished_error()
    facts, current, p = read_and_plan(spec, ports, root, node, ha)
    if expected is not None:
        p = expected.checked(facts, current, spec_path or "saved plan")
    return facts, current, p


def apply(
    spec: Spec,
    ports: Ports,
    *,
    root: str | os.PathLike,
    dry_run: bool = False,
    confirm: Callable[[Plan], bool] | None = None,
    progress: Progress | None = None,
    timeouts: Timeouts | None = None,
    verify: Callable[[], Any] | None = None,
    rollback_on_verify_failure: bool = False,
    spec_path: str | None = None,
    node: str | None = None,
    expected: SavedPlan | None = None,
    expect_plan: str | None = None,
    ha: bool = True,
) -> ApplyResult:
    """Bring the host to what ``spec`` asks (see the module docstring for the order).

    ``expected`` (a saved plan, ``gputopo apply PLANFILE``): its actions run, and only while
    the facts and state read before and again under the lock are the ones it was made from;
    otherwise SavedPlanStale (exit 2, naming what changed) and nothing changes.

    ``confirm(plan)`` is asked before anything changes (False cancels); ``verify()`` runs after
    a successful apply and returns a report with ``.ok``. ``expect_plan`` is the signature
    (``Plan.signature``) of the plan the operator was shown elsewhere (a cluster's rolling
    apply): any other plan is refused as HostChanged. ``ha`` False leaves the cluster's HA
    placement alone (``--no-ha``). Returns an :class:`ApplyResult`.
    Raises PreflightError (an API whose node is not this host), UnfinishedApply (an earlier
    apply's journal is open), PlanRefused, PreflightFailed, ApplyCancelled, LockHeld,
    HostChanged (all: nothing changed), ApplyFailed (rolled back, or exit 3 naming the device
    that needs a human).
    """
    root = str(root)
    refuse_other_node(ports, root)
    t = timeouts or Timeouts()
    progress = progress or Progress()
    t_start = time.monotonic()
    HostLock(root).check()  # a running apply is named before its journal is blamed
    facts, current, p = _read_checked(spec, ports, root, node, expected, spec_path, ha)
    if expect_plan is not None and p.signature() != expect_plan:
        raise HostChanged(f"its plan is now {p.signature()}, not the plan {expect_plan} that was shown")
    progress.plan(p)
    if p.is_empty:
        return ApplyResult("no-changes", plan=p, wall_s=time.monotonic() - t_start)
    if dry_run:
        return ApplyResult("dry-run", plan=p, wall_s=time.monotonic() - t_start)
    problems = preflight(p, facts, current, spec, ports, root, node)
    if problems:
        raise PreflightFailed(problems)
    asked = time.monotonic()
    if confirm is not None and not confirm(p):
        raise ApplyCancelled()
    # the time the operator spent at the prompt is not the apply's: its wall time leaves it out
    t_start += time.monotonic() - asked
    progress = Quiet(progress)
    with HostLock(root), signals.interruptible():
        facts, current, p2 = _read_checked(spec, ports, root, node, expected, spec_path, ha)
        if p2.signature() != p.signature():  # without the digests re-read before each write
            raise HostChanged(_diff_text(p, p2))
        p = p2
        # again under the lock: the operator may have read the plan for minutes, long enough
        # for a job to open a GPU that is about to move (its unbind would then hang)
        problems = preflight(p, facts, current, spec, ports, root, node)
        if problems:
            raise PreflightFailed(problems)
        # the NVIDIA device nodes the containers will be given, made before anything stops
        made, problems = make_device_nodes(p, facts, current, ports, root, t.exec)
        for line in made:
            progress.note(line)
        if problems:
            raise PreflightFailed(problems)
        running_before = running_before_of(list(p.actions), current)
        j = Journal.create(
            root,
            Header(
                pid=os.getpid(),
                started=time.time(),
                argv=list(sys.argv),
                spec=os.path.abspath(spec_path) if spec_path else None,
                spec_sha256=expected.spec_sha256 if expected else spec_digest(spec, spec_path),
                node=p.node,
                actions=list(p.actions),
                facts=_facts_summary(facts),
                running_before=RunningBeforeRec(
                    guests=running_before.guests, services=running_before.services
                ),
            ),
        )
        runner = Runner(step_context(ports, root, t, progress), j, progress)
        try:
            runner.forward(list(p.actions))
        except BaseException as exc:
            _roll_back_and_raise(runner, j, exc, running_before)
        window = runner.stop_window()
        report = None

        def _finished(outcome: str, steps: list) -> ApplyResult:
            res = ApplyResult(
                outcome,
                plan=p,
                steps=steps,
                wall_s=time.monotonic() - t_start,
                stop_window_s=window,
                journal=str(j.path),
                verify=report,
            )
            progress.summary(res)
            return res

        if verify is not None and rollback_on_verify_failure:
            j.append(Verifying())
            report = verify()
            if not getattr(report, "ok", True):
                progress.note("verification failed; rolling back")
                complete, stuck = _roll_back(runner, j, running_before, reason="verify")
                if not (complete and not stuck):
                    # the journal ends needs-human: never reported as a completed rollback
                    summary = getattr(report, "summary_line", lambda: "")()
                    cause = VerifyFailed(summary.removeprefix("verification failed: ") or "a check failed")
                    err = ApplyFailed("verify", cause, complete, stuck)
                    err.exit_code = NEEDS_HUMAN
                    raise err
                return _finished("rolled-back", runner.results)
            j.append(End(result="applied", verify="passed"))
        else:
            # every step is done: the apply is finished whatever the verification finds
            j.append(End(result="applied"))
            if verify is not None:
                report = verify()
    return _finished("applied", sorted(runner.results, key=lambda r: r.index))


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
        if dry_run:
            return ApplyResult(
                "dry-run",
                wall_s=time.monotonic() - t0,
                journal=str(j.path),
                would=would_recover(runner, j, rb, finish, undoing),
            )
        if j.verifying and not undoing:
            j.append(End(result="applied", verify="did not finish"))
            progress.note("every step was done; only the verification was interrupted: run 'gputopo verify'")
            return ApplyResult("applied", wall_s=time.monotonic() - t0, journal=str(j.path))
        if finish and undoing:
            # half of it is already undone: finishing forward would build on an unknown middle
            raise JournalError(
                f"{j.path}: its rollback already began; run 'gputopo recover' without --finish"
            )
        j.append(Recover(mode="finish" if finish else "rollback", pid=os.getpid()))
        if finish:
            done = {i for i, s in j.steps().items() if s.status == "done"}
            try:
                runner.forward(list(j.header.actions), skip=done)
            except BaseException as exc:
                _roll_back_and_raise(runner, j, exc, rb)
            j.append(End(result="applied"))
            return ApplyResult(
                "finished", steps=runner.results, wall_s=time.monotonic() - t0, journal=str(j.path)
            )
        complete, stuck = _roll_back(runner, j, rb, retry=True)
        nh = j.needs_human
        if nh is not None:
            raise ApplyFailed(
                "recover",
                JournalError(f"{j.path} stays open: {nh.left}"),
                complete,
                stuck,
                next_step=nh.next_step,
            )
        return ApplyResult(
            "recovered", steps=runner.results, wall_s=time.monotonic() - t0, journal=str(j.path)
        )
