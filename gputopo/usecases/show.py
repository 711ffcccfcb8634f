"""Read a plan saved with ``gputopo plan -o`` (``gputopo show``, ``gputopo apply PLANFILE``)."""

from __future__ import annotations

from pathlib import Path

from gputopo.errors import SpecError
from gputopo.plan.saved import SavedPlan, parse_saved_plan


def read_saved_plan(path: str) -> SavedPlan:
    """The saved plan in file ``path``. Raises SpecError (exit 2) naming the file when it cannot
    be read or is not one, SavedPlanEdited (exit 2) when it was edited since ``plan -o`` wrote it."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(path, "", f"cannot read: {getattr(e, 'strerror', None) or e}") from None
    return parse_saved_plan(text, path)


def show(path: str) -> tuple[object, dict | None]:
    """``gputopo show``: the saved plan's plan and its summary as ``plan`` printed it (None
    when it changes nothing). Raises what :func:`read_saved_plan` raises."""
    saved = read_saved_plan(path)
    return saved.plan, None if saved.summary is None else saved.summary.model_dump(mode="json")
