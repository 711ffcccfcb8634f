"""What planning finds against a spec, as one value: refusals (the plan is refused) and warnings
(it goes ahead, the plan prints them). Pure.

:func:`gputopo.plan.planner.plan` makes one :class:`Findings` per plan and hands it to each of its
checks, which add to it; the planner then raises its refusals (``PlanRefused``) or returns its
warnings as the plan's ``warnings``. The checks add to the one value rather than each returning
its own to be merged: the operator reads refusals and warnings in the order the checks found
them, and a check that also computes something (the GPUs it selected, the VMs it plans) keeps a
plain return value.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gputopo.errors import PlanRefused, Refusal


@dataclass
class Findings:
    """Refusals and warnings in the order the checks found them (the order they are printed)."""

    refusals: list[Refusal] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def refuse(self, address: str | None, reason: str, code: str = "refused") -> None:
        """Refuse the plan; ``address`` names the GPU when there is one."""
        self.refusals.append(Refusal(address, reason, code))

    def warn(self, text: str) -> None:
        self.warnings.append(text)

    @property
    def refused(self) -> bool:
        return bool(self.refusals)

    def raise_if_refused(self) -> None:
        """Raise PlanRefused with every refusal found so far, if any."""
        if self.refusals:
            raise PlanRefused(self.refusals)
