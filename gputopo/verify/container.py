"""Check ``container``: inside each container ``nvidia-smi --query-gpu`` lists exactly its
planned GPUs, matched by bus id (missing and extra ones named); GPU device entries whose removal
waits for the container's next restart are a WARN naming them."""

from __future__ import annotations

from typing import Any

from gputopo.errors import GputopoError
from gputopo.formats.devn import dev_entries, dev_path, dev_sort, is_nvidia_dev
from gputopo.verify.context import Context
from gputopo.verify.report import Check, skipped, verdict

NAME = "container"


def check(ctx: Context) -> Check:
    """Inside each container nvidia-smi lists exactly its planned GPUs; missing or extra ones FAIL."""
    problems: list[str] = []
    warnings: list[str] = []
    parts: list[str] = []
    details: dict[str, Any] = {}
    if not ctx.containers:
        return skipped(NAME, "no containers in the spec")
    if ctx.no_plan:  # which GPUs a container should see is the plan's to say
        return skipped(NAME, ctx.no_plan, {"refusals": ctx.plan_error})
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
        left = _pending_removals(ctx, c.vmid)
        if left:
            details[str(c.vmid)]["pending_removals"] = left
            warnings.append(
                f"CT {c.vmid}: {', '.join(f'{k} ({v})' for k, v in left.items())} stay in the "
                "container until its next restart (Proxmox applies a devN removal at start)"
            )
    return verdict(
        NAME,
        details,
        "; ".join(parts),
        problems,
        warnings + parts if warnings else (),
    )


def _pending_removals(ctx: Context, vmid: int) -> dict[str, str]:
    """The GPU device entries a running container still has although its config removed them
    (a removal that waits for the next start): devN -> path."""
    try:
        now = dev_entries(ctx.ports.proxmox.lxc_config(vmid, current=True))
        merged = dev_entries(ctx.ports.proxmox.lxc_config(vmid))
    except GputopoError:
        return {}
    return {
        k: dev_path(v)
        for k, v in sorted(now.items(), key=lambda kv: dev_sort(kv[0]))
        if is_nvidia_dev(v) and k not in merged
    }
