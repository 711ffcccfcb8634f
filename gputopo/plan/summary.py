"""A plan's one-line summary: what it changes, and how long its stop window should be. Pure.

``4 rebinds, 1 mapping change, 1 guest restart; stop window about 18 s (the last apply's
times), at most 1250 s (the step timeouts)``.

The stop window is what the inference service is down for (``gputopo.actions.stop_window``):
from the first step that stops a container or its service to the last that starts one again
(the VMs that stop do so before it and start after it). Its expected
length adds each step's time as the last apply measured it (the same step by its description,
else the mean of its kind); steps of a parallel kind that follow each other count once, with
the slowest of them. The bound adds each waiting step's timeout the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gputopo.actions import ActionModel, Timeouts, stop_window
from gputopo.plan.model import Plan

# what an operator asks first: how many GPUs move, which mappings change, what restarts
ORDER = ("rebind", "mapping change", "guest restart", "service restart", "boot file")


@dataclass
class Measured:
    """Step times of an earlier apply: by description, and by kind (the mean)."""

    by_text: dict[str, float] = field(default_factory=dict)
    by_kind: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, steps: list[tuple[str, str, float]]) -> Measured:
        """From (kind, description, seconds) of each completed step."""
        kinds: dict[str, list[float]] = {}
        out = cls()
        for kind, text, seconds in steps:
            out.by_text[text] = seconds
            kinds.setdefault(kind, []).append(seconds)
        out.by_kind = {k: sum(v) / len(v) for k, v in kinds.items()}
        return out

    def seconds(self, a: ActionModel) -> float | None:
        text = a.describe()
        if text in self.by_text:
            return self.by_text[text]
        return self.by_kind.get(a.kind)


@dataclass
class PlanSummary:
    counts: dict[str, int]
    window_steps: int
    expected_s: float | None  # None: no earlier apply measured every step of the window
    bound_s: float | None  # None: nothing in the window waits

    def to_text(self) -> str:
        parts = [f"{n} {noun}{'' if n == 1 else 's'}" for noun, n in self.counts.items()] or ["no moves"]
        if not self.window_steps:
            return ", ".join(parts) + "; no stop window (nothing stops)"
        expected = (
            f"about {self.expected_s:.0f} s (the last apply's times)"
            if self.expected_s is not None
            else "length unknown (no apply measured yet)"
        )
        bound = f", at most {self.bound_s:.0f} s (the step timeouts)" if self.bound_s is not None else ""
        return ", ".join(parts) + f"; stop window {expected}{bound}"

    def to_data(self) -> dict[str, Any]:
        return {
            "counts": {k.replace(" ", "_"): v for k, v in self.counts.items()},
            "stop_window_steps": self.window_steps,
            "expected_stop_window_s": self.expected_s,
            "max_stop_window_s": self.bound_s,
            "text": self.to_text(),
        }


def _window(actions: list[ActionModel]) -> list[ActionModel]:
    bounds = stop_window(actions)
    return actions[bounds[0] : bounds[1] + 1] if bounds is not None else []


def _groups(actions: list[ActionModel]) -> list[list[ActionModel]]:
    """Consecutive steps of one parallel kind as one group; every other step alone."""
    out: list[list[ActionModel]] = []
    for a in actions:
        if out and a.parallel and type(out[-1][0]) is type(a):
            out[-1].append(a)
        else:
            out.append([a])
    return out


def summarize(p: Plan, timeouts: Timeouts, measured: Measured | None = None) -> PlanSummary:
    """What ``p`` changes and its stop window (see the module docstring)."""
    counts: dict[str, int] = {}
    for a in p.actions:
        if a.counts_as:
            counts[a.counts_as] = counts.get(a.counts_as, 0) + 1
    counts = dict(
        sorted(counts.items(), key=lambda kv: (ORDER.index(kv[0]) if kv[0] in ORDER else len(ORDER), kv[0]))
    )
    window = _window(list(p.actions))
    expected: float | None = 0.0
    bound: float | None = None
    for group in _groups(window):
        times = [measured.seconds(a) if measured else None for a in group]
        if expected is not None and all(t is not None for t in times):
            expected += max(t for t in times if t is not None)
        else:
            expected = None
        limits = [t for t in (a.timeout(timeouts) for a in group) if t is not None]
        if limits:
            bound = (bound or 0.0) + max(limits)
    return PlanSummary(
        counts=counts, window_steps=len(window), expected_s=expected if window else None, bound_s=bound
    )
