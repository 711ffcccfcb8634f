"""What an apply or a recover reports while it runs: the progress display's base classes and
the result it ends with (:mod:`gputopo.apply.progress`), for a display to subclass."""

from gputopo.apply.progress import ApplyResult, PlainProgress, Progress, StepResult

__all__ = ["ApplyResult", "PlainProgress", "Progress", "StepResult"]
