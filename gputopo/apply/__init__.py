"""Apply a plan to a host and recover one that was interrupted: preflight, lock, journaled steps,
rollback on any failure. See :mod:`gputopo.apply.run`."""

from gputopo.actions import Timeouts
from gputopo.apply.progress import ApplyResult, PlainProgress, Progress, StepResult
from gputopo.apply.run import apply, read_and_plan, recover

__all__ = [
    "ApplyResult",
    "PlainProgress",
    "Progress",
    "StepResult",
    "Timeouts",
    "apply",
    "read_and_plan",
    "recover",
]
