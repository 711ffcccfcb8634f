"""The lines a use case says on stderr while it works: a warning, or what it found."""

from __future__ import annotations

import sys


def warn(text: str) -> None:
    """One ``gputopo: warning:`` line on stderr."""
    print(f"gputopo: warning: {text}", file=sys.stderr, flush=True)


def say(text: str) -> None:
    """One line on stderr: what a use case found (the unit inside a container, a file written)."""
    print(text, file=sys.stderr, flush=True)


def warn_unfinished(root: str) -> None:
    """Warn when an apply's journal under ``root`` is still open or cannot be read
    (:func:`gputopo.apply.history.unfinished_warning`)."""
    from gputopo.apply.history import unfinished_warning

    text = unfinished_warning(root)
    if text is not None:
        warn(text)
