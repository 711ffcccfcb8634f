"""Apply a plan to a host: the checked plan, then the journaled steps under the host lock.

An apply is two calls, which the use case (:func:`gputopo.usecases.apply.run`) makes with the
verification between the second's steps and its end: :func:`checked_plan` (steps 0 to b) and
:func:`transaction` (c to e, a context manager whose :class:`Transaction` the caller ends:
applied, or rolled back after a failed verification). They run, in this order:

0. the Proxmox API must act on this host (:func:`gputopo.apply.preflight.refuse_other_node`):
   sysfs and ``pct`` act on this machine whoever calls, so a library caller is refused too;
a. the request's read (:class:`ReadPlan`: discover, the current state, plan); an empty plan
   returns ``no-changes``;
b. preflight (:mod:`gputopo.apply.preflight`): every problem is one line of a
   :class:`PreflightFailed` (exit 2) and nothing is changed;
c. the host lock ``<root>/run/lock/gputopo.lock`` (a second apply gets LockHeld);
d. facts and state are read again under the lock and planned again: a different plan means the
   host changed since it was checked and confirmed (:class:`HostChanged`); preflight again;
   the NVIDIA device nodes the containers will be given are made where missing
   (:func:`gputopo.apply.preflight.make_device_nodes`), or the apply is refused, nothing stopped;
e. the steps (:mod:`gputopo.apply.runner`), each journaled with the state before it, so any
   failure, or a later :func:`recover` after a crash, can undo the completed steps in reverse
   from the journal alone, then restart what ran before (:mod:`gputopo.apply.recovery`).

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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from gputopo.actions import RunningBefore, Timeouts
from gputopo.apply import signals
from gputopo.apply.journal import End, Header, Journal, RunningBeforeRec, Verifying, find_unfinished
from gputopo.apply.lock import HostLock
from gputopo.apply.preflight import make_device_nodes, preflight, refuse_other_node
from gputopo.apply.progress import ApplyResult, Progress, Quiet
from gputopo.apply.rollback import roll_back, roll_back_and_raise
from gputopo.apply.runner import Runner, running_before_of, step_context
from gputopo.errors import ApplyCancelled, ApplyFailed, HostChanged, PreflightFailed, VerifyFailed
from gputopo.exitcodes import NEEDS_HUMAN
from gputopo.model.documents import VerifyReport
from gputopo.model.facts import Facts
from gputopo.model.state import CurrentState
from gputopo.plan.model import Plan
from gputopo.plan.saved import SavedPlan, spec_digest
from gputopo.plan.spec import Spec
from gputopo.ports import Ports


class ReadPlan(Protocol):
    """One read of the host and its plan: (facts, current state, plan). Apply calls it before
    the operator confirms and again under the lock."""

    def __call__(self) -> tuple[Facts, CurrentState, Plan]: ...


@dataclass(frozen=True)
class ApplyRequest:
    """What an apply is asked: the spec and the host (``ports``, ``root``), how to read and plan
    it (``read``), and the options of ``gputopo apply``.

    ``expected`` (a saved plan, ``gputopo apply PLANFILE``): its actions run, and only while
    the facts and state read before and again under the lock are the ones it was made from;
    otherwise SavedPlanStale (exit 2, naming what changed) and nothing changes.
    ``confirm(plan)`` is asked before anything changes (False cancels). ``expect_plan`` is the
    signature (``Plan.signature``) of the plan the operator was shown elsewhere (a cluster's
    rolling apply): any other plan is refused as HostChanged.
    """

    spec: Spec
    ports: Ports
    root: str
    read: ReadPlan
    dry_run: bool = False
    confirm: Callable[[Plan], bool] | None = None
    progress: Progress | None = None
    timeouts: Timeouts | None = None
    spec_path: str | None = None
    node: str | None = None
    expected: SavedPlan | None = None
    expect_plan: str | None = None


@dataclass
class Checked:
    """A plan read, checked and confirmed, not yet run: what :func:`transaction` starts from."""

    plan: Plan
    progress: Progress
    t_start: float


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


def _read_checked(req: ApplyRequest) -> tuple[Facts, CurrentState, Plan]:
    """(facts, current, plan) read now, refusing an earlier apply's open journal first; with a
    saved plan, its actions, refused when the host is no longer what it was made from."""
    j0 = find_unfinished(req.root)
    if j0 is not None:
        raise j0.unfinished_error()
    facts, current, p = req.read()
    if req.expected is not None:
        p = req.expected.checked(facts, current, req.spec_path or "saved plan")
    return facts, current, p


def _preflight(req: ApplyRequest, p: Plan, facts: Facts, current: CurrentState) -> None:
    """Raises PreflightFailed naming every problem preflight finds."""
    problems = preflight(p, facts, current, req.spec, req.ports, req.root, req.node)
    if problems:
        raise PreflightFailed(problems)


def checked_plan(req: ApplyRequest) -> Checked | ApplyResult:
    """Steps 0 to b: the plan read, checked and confirmed (:class:`Checked`), or the result
    when nothing is to run (``no-changes``, ``dry-run``).

    Raises PreflightError (an API whose node is not this host), UnfinishedApply (an earlier
    apply's journal is open), LockHeld, PlanRefused, HostChanged (``expect_plan``),
    PreflightFailed, ApplyCancelled: nothing changed.
    """
    refuse_other_node(req.ports, req.root)
    progress = req.progress or Progress()
    t_start = time.monotonic()
    HostLock(req.root).check()  # a running apply is named before its journal is blamed
    facts, current, p = _read_checked(req)
    if req.expect_plan is not None and p.signature() != req.expect_plan:
        raise HostChanged(f"its plan is now {p.signature()}, not the plan {req.expect_plan} that was shown")
    progress.plan(p)
    if p.is_empty or req.dry_run:
        return ApplyResult(
            "no-changes" if p.is_empty else "dry-run", plan=p, wall_s=time.monotonic() - t_start
        )
    _preflight(req, p, facts, current)
    asked = time.monotonic()
    if req.confirm is not None and not req.confirm(p):
        raise ApplyCancelled()
    # the time the operator spent at the prompt is not the apply's: its wall time leaves it out
    t_start += time.monotonic() - asked
    return Checked(p, Quiet(progress), t_start)


# what a signal after the last step says: the change stays, only the verification can be stopped
AFTER_THE_END = "{name} received after the last step: the change stays (a verification still running stops)"


@dataclass
class Transaction:
    """An apply whose every step is done, under the host lock, its journal still open: the
    caller ends it (:meth:`applied`, or :meth:`verifying` then :meth:`verified` or
    :meth:`rolled_back`) and then takes its :meth:`result`."""

    plan: Plan
    runner: Runner
    journal: Journal
    running_before: RunningBefore
    progress: Progress
    t_start: float
    window: float | None

    def verifying(self) -> None:
        """The verification begins, part of the transaction (a failure rolls back)."""
        self.journal.append(Verifying())

    def applied(self, verify: str | None = None) -> None:
        """The journal ends applied (``verify``: ``passed`` after :meth:`verifying`)."""
        self.journal.append(End(result="applied", verify=verify))

    def rolled_back(self, report: VerifyReport) -> ApplyResult:
        """Roll back after the failed verification ``report``; the result is ``rolled-back``.
        Raises ApplyFailed (exit 3) when the rollback could not complete: the journal ends
        needs-human, never reported as a completed rollback."""
        self.progress.note("verification failed; rolling back")
        complete, stuck = roll_back(self.runner, self.journal, self.running_before, reason="verify")
        if not (complete and not stuck):
            summary = report.summary_line().removeprefix("verification failed: ")
            err = ApplyFailed("verify", VerifyFailed(summary or "a check failed"), complete, stuck)
            err.exit_code = NEEDS_HUMAN
            raise err
        return self.result("rolled-back", report, self.runner.results)

    def result(
        self,
        outcome: str,
        report: VerifyReport | None,
        steps: list | None = None,
        verify_stopped: str | None = None,
    ) -> ApplyResult:
        """The apply's result, shown by the progress display (``verify_stopped``: the signal that
        stopped the verification, by name)."""
        res = ApplyResult(
            outcome,
            plan=self.plan,
            steps=sorted(self.runner.results, key=lambda r: r.index) if steps is None else steps,
            wall_s=time.monotonic() - self.t_start,
            stop_window_s=self.window,
            journal=str(self.journal.path),
            verify=report,
            verify_stopped=verify_stopped,
        )
        self.progress.summary(res)
        return res


def _journal(req: ApplyRequest, p: Plan, facts: Facts, running_before: RunningBefore) -> Journal:
    """The apply's journal, created with everything a rollback or a recover needs."""
    return Journal.create(
        req.root,
        Header(
            pid=os.getpid(),
            started=time.time(),
            argv=list(sys.argv),
            spec=os.path.abspath(req.spec_path) if req.spec_path else None,
            spec_sha256=req.expected.spec_sha256 if req.expected else spec_digest(req.spec, req.spec_path),
            node=p.node,
            actions=list(p.actions),
            facts=_facts_summary(facts),
            running_before=RunningBeforeRec(guests=running_before.guests, services=running_before.services),
        ),
    )


def _read_again(req: ApplyRequest, checked: Checked, t: Timeouts) -> tuple[Facts, CurrentState, Plan]:
    """Under the lock: the host read and planned again (a different plan is HostChanged),
    preflight again, the NVIDIA device nodes the containers will be given made."""
    facts, current, p2 = _read_checked(req)
    if p2.signature() != checked.plan.signature():  # without the digests re-read before each write
        raise HostChanged(_diff_text(checked.plan, p2))
    # again under the lock: the operator may have read the plan for minutes, long enough
    # for a job to open a GPU that is about to move (its unbind would then hang)
    _preflight(req, p2, facts, current)
    # the NVIDIA device nodes the containers will be given, made before anything stops
    made, problems = make_device_nodes(p2, facts, current, req.ports, req.root, t.exec)
    for line in made:
        checked.progress.note(line)
    if problems:
        raise PreflightFailed(problems)
    return facts, current, p2


@contextmanager
def transaction(req: ApplyRequest, checked: Checked) -> Iterator[Transaction]:
    """Steps c to e under the host lock: read and check again, journal, run every step (any
    failure rolls back and raises ApplyFailed), then hand the :class:`Transaction` to the
    caller, who ends it before the lock is released.

    Raises LockHeld, UnfinishedApply, HostChanged, PreflightFailed (nothing changed),
    ApplyFailed (rolled back, or exit 3 naming the device that needs a human).
    """
    t = req.timeouts or Timeouts()
    with HostLock(req.root), signals.interruptible():
        facts, current, p = _read_again(req, checked, t)
        running_before = running_before_of(list(p.actions), current)
        runner: Runner | None = None
        try:
            # a signal while the journal is made waits until the runner that can roll it back exists
            with signals.held():
                j = _journal(req, p, facts, running_before)
                runner = Runner(step_context(req.ports, req.root, t, checked.progress), j, checked.progress)
            runner.forward(list(p.actions))
            # every step is done: a signal from here to the handlers' removal rolls nothing back
            signals.settle(checked.progress.note, AFTER_THE_END)
        except BaseException as exc:
            if runner is None:  # no journal yet: nothing was changed
                raise
            roll_back_and_raise(runner, j, exc, running_before)
        window = runner.stop_window()
        yield Transaction(p, runner, j, running_before, checked.progress, checked.t_start, window)
