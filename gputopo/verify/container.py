"""Check ``container``: inside each container ``nvidia-smi --query-gpu`` lists exactly its
planned GPUs, matched by bus id (missing and extra ones named)."""

from __future__ import annotations

from typing import Any

from gputopo.verify.context import Context
from gputopo.verify.report import Check, verdict

NAME = "container"


def check(ctx: Context) -> Check:
    """Inside each container nvidia-smi lists exactly its planned GPUs; missing or extra ones FAIL."""
    problems: list[str] = []
    parts: list[str] = []
    details: dict[str, Any] = {}
    for c in ctx.containers:
        t = ctx.target(c.vmid)
        if t is None:
            problems.append(f"CT {c.vmid}: no plan for it")
            continue
        planned = list(t.gpus)
        if not planned:
            parts.append(f"CT {c.vmid}: no GPUs planned")
            details[str(c.vmid)] = {"planned": [], "seen": []}
            continue
        rows, err = ctx.nvidia_smi(c.vmid)
        if rows is None:
            problems.append(f"CT {c.vmid}: {err}")
            details[str(c.vmid)] = {"planned": planned, "error": err}
            continue
        seen = [r.address for r in rows]
        missing = [a for a in planned if a not in seen]
        extra = [a for a in seen if a not in planned]
        details[str(c.vmid)] = {"planned": planned, "seen": seen, "missing": missing, "extra": extra}
        if missing:
            problems.append(f"CT {c.vmid}: missing {', '.join(missing)} ({len(seen)} of {len(planned)} seen)")
        if extra:
            problems.append(f"CT {c.vmid}: extra {', '.join(extra)} (not planned)")
        if not missing and not extra:
            parts.append(f"CT {c.vmid}: nvidia-smi lists exactly the {len(planned)} planned GPU(s)")
    return verdict(NAME, details, "; ".join(parts) or "no containers in the spec", problems)
