"""Check ``converged``: a fresh plan of the spec against what the host is now is empty (drivers,
container devices, mappings, persistence files, service drop-in); a FAIL lists the pending
actions, an unreadable current state or the plan's refusals."""

from __future__ import annotations

from gputopo.actions import VFIO
from gputopo.verify.context import Context
from gputopo.verify.report import FAIL, PASS, Check

NAME = "converged"


def check(ctx: Context) -> Check:
    """A fresh plan is empty: PASS; pending actions, an unreadable current state or a refused plan: FAIL."""
    if ctx.current_error:
        return Check(
            name=NAME,
            status=FAIL,
            summary=f"cannot read the current state: {ctx.current_error}",
            details={"error": ctx.current_error},
        )
    if ctx.plan is None:
        return Check(
            name=NAME,
            status=FAIL,
            summary=ctx.refusal or "no plan",
            details={"refusals": ctx.plan_error},
        )
    actions = [a.describe() for a in ctx.plan.actions]
    placed = {"nvidia": 0, VFIO: 0}
    for t in ctx.plan.target:
        if t.driver in placed:
            placed[t.driver] += 1
    details = {"pending": actions, "gpus_nvidia": placed["nvidia"], "gpus_vfio": placed[VFIO]}
    if actions:
        return Check(
            name=NAME,
            status=FAIL,
            summary=f"{len(actions)} pending action(s): "
            + "; ".join(actions[:3])
            + (" ..." if len(actions) > 3 else ""),
            details=details,
        )
    return Check(
        name=NAME,
        status=PASS,
        summary=f"fresh plan is empty ({placed['nvidia']} GPU(s) on nvidia, {placed[VFIO]} on vfio-pci)",
        details=details,
    )
