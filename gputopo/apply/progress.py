"""What an apply reports while it runs and when it ends: results and the progress display API."""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass, field
from typing import Any

from gputopo.model.documents import VerifyReport


@dataclass
class StepResult:
    index: int
    phase: str
    text: str
    status: str  # done | failed
    seconds: float
    started: float = 0.0  # time.monotonic() when it began
    ended: float = 0.0
    warnings: list[str] = field(default_factory=list)


@dataclass
class ApplyResult:
    """What an apply (:func:`gputopo.usecases.apply.run`) or :func:`gputopo.apply.recover` did. ``status``:
    no-changes, dry-run, applied, rolled-back (verify failed and ``rollback_on_verify_failure``),
    recovered, finished, nothing-to-recover."""

    status: str
    plan: Any = None  # gputopo.plan.model.Plan
    steps: list[StepResult] = field(default_factory=list)
    wall_s: float = 0.0
    stop_window_s: float | None = None
    journal: str | None = None
    verify: VerifyReport | None = None  # the verification that followed, when one ran
    verify_stopped: str | None = None  # the signal that stopped that verification ("Ctrl-C")
    would: list[str] = field(default_factory=list)  # recover --dry-run: what it would do, in order

    @property
    def exit_code(self) -> int:
        return 1 if self.status == "rolled-back" else 0


class Progress:
    """Receives apply's events; the default shows nothing. The CLI passes a display."""

    def plan(self, p: Any) -> None: ...

    def step_begin(self, index: int, total: int, action: Any) -> None: ...

    def step_end(self, index: int, total: int, action: Any, status: str, seconds: float) -> None: ...

    def note(self, text: str) -> None: ...

    def summary(self, result: ApplyResult) -> None: ...


class PlainProgress(Progress):
    """One line per event on ``stream`` (for logs and non-terminals)."""

    def __init__(self, stream: Any = None):
        self.stream = stream or sys.stdout
        self._lock = threading.Lock()

    def _w(self, text: str) -> None:
        with self._lock:
            print(text, file=self.stream, flush=True)

    def step_begin(self, index: int, total: int, action: Any) -> None:
        self._w(f"[{index + 1:>2}/{total}] {action.phase:<7} {action.describe()} ...")

    def step_end(self, index: int, total: int, action: Any, status: str, seconds: float) -> None:
        self._w(f"[{index + 1:>2}/{total}] {action.phase:<7} {action.describe()}: {status} ({seconds:.2f} s)")

    def note(self, text: str) -> None:
        self._w(text)

    def summary(self, result: ApplyResult) -> None:
        window = f", stop window {result.stop_window_s:.2f} s" if result.stop_window_s is not None else ""
        self._w(f"{result.status} in {result.wall_s:.2f} s{window}")


class Quiet(Progress):
    """Passes events on, but a display that cannot be written (the terminal of a dropped ssh
    session: EIO, a closed pipe) never stops an apply or its rollback half-way."""

    def __init__(self, inner: Progress):
        self.inner = inner

    def __getattribute__(self, name: str) -> Any:
        if name in ("plan", "step_begin", "step_end", "note", "summary"):
            inner = object.__getattribute__(self, "inner")

            def call(*args: Any) -> None:
                try:
                    getattr(inner, name)(*args)
                except OSError:
                    pass

            return call
        return object.__getattribute__(self, name)
