"""What a plan will take on this host: the step timeouts the spec and the command line set, and
the plan's one-line summary with the times the last apply here measured (``gputopo plan``)."""

from __future__ import annotations

import os
from collections.abc import Iterable

from gputopo.actions import Timeouts
from gputopo.apply.history import last_measured
from gputopo.plan.model import Plan
from gputopo.plan.spec import Spec
from gputopo.plan.summary import Measured, PlanSummary, summarize


def step_timeouts(spec: Spec | None, given: Iterable[tuple[str, float]] = ()) -> Timeouts:
    """The steps' timeouts: the defaults, the spec's ``policy.timeouts``, then ``given`` (the
    command line's ``--timeout KIND=SECONDS``), each overriding the one before."""
    seconds = dict(spec.policy.timeouts.given()) if spec is not None else {}
    seconds.update(dict(given))
    return Timeouts().with_(seconds)


def plan_summary(spec: Spec, p: Plan, root: str | os.PathLike) -> PlanSummary:
    """``p``'s summary: its counts and stop window, the window expected from the newest apply
    journaled under ``root`` and bounded by the spec's step timeouts."""
    return summarize(p, step_timeouts(spec), Measured.of(last_measured(root)))
