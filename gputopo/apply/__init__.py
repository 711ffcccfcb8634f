"""Apply a plan to a host and recover one that was interrupted: preflight, lock, journaled steps,
rollback on any failure. See :mod:`gputopo.apply.run` (an apply, in two calls that
:func:`gputopo.usecases.apply.run` composes with verify) and :mod:`gputopo.apply.recovery`."""

from gputopo.actions import Timeouts
from gputopo.apply.progress import ApplyResult, PlainProgress, Progress, StepResult
from gputopo.apply.recovery import recover
from gputopo.apply.run import ApplyRequest, Checked, ReadPlan, Transaction, checked_plan, transaction

__all__ = [
    "ApplyRequest",
    "ApplyResult",
    "Checked",
    "PlainProgress",
    "Progress",
    "ReadPlan",
    "StepResult",
    "Timeouts",
    "Transaction",
    "checked_plan",
    "recover",
    "transaction",
]
