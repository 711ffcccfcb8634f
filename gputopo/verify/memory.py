"""Check ``memory``: per GPU of each service, memory used/total and headroom; the spread of memory
used across the service's GPUs ((max-min)/max) within ``verify.memory_spread_pct`` as the sign
of a balanced tensor-parallel load, and headroom per GPU at least ``verify.min_headroom_mib``
when set."""

from __future__ import annotations

from typing import Any

from gputopo.verify.context import Context, services_not_run
from gputopo.verify.parse import GpuRow, memory_spread_pct
from gputopo.verify.report import FAIL, PASS, Check, Status, skipped, verdict

NAME = "memory"


def assess_memory(
    rows: list[GpuRow], spread_limit_pct: float, min_headroom_mib: int | None = None
) -> tuple[Status, str, dict[str, Any]]:
    """The verdict on one service's GPUs: (PASS or FAIL, one line with the numbers, details).

    FAIL when a GPU reports no memory figures, when the spread of memory used
    ((max - min) / max) exceeds ``spread_limit_pct`` (an unbalanced tensor-parallel load), or when
    a GPU's headroom (total - used) is below ``min_headroom_mib``.
    """
    per_gpu = [
        {"address": r.address, "used_mib": r.used, "total_mib": r.total, "headroom_mib": r.headroom}
        for r in rows
    ]
    details: dict[str, Any] = {"gpus": per_gpu}
    unknown = [r.address for r in rows if r.headroom is None]
    if not rows:
        return FAIL, "no GPUs to measure", details
    if unknown:
        return FAIL, f"memory not reported for {', '.join(unknown)}", details
    # every row has figures from here on
    used = [int(r.used) for r in rows]  # type: ignore[arg-type]
    spread = memory_spread_pct(used)
    low = min(rows, key=lambda r: int(r.headroom))  # type: ignore[arg-type]
    details.update(
        spread_pct=round(spread, 2),
        max_used_mib=max(used),
        min_used_mib=min(used),
        min_headroom_mib=low.headroom,
    )
    totals = sorted({int(r.total) for r in rows})  # type: ignore[arg-type]
    figures = (
        f"used {'/'.join(str(u) for u in used)} of {'/'.join(str(t) for t in totals)} MiB, "
        f"spread {spread:.1f} % (limit {spread_limit_pct:g} %), headroom >= {low.headroom} MiB"
    )
    if spread > spread_limit_pct:
        busiest = max(rows, key=lambda r: int(r.used))  # type: ignore[arg-type]
        idlest = min(rows, key=lambda r: int(r.used))  # type: ignore[arg-type]
        return (
            FAIL,
            (
                f"unbalanced: {figures}; {busiest.address} {busiest.used} MiB vs "
                f"{idlest.address} {idlest.used} MiB"
            ),
            details,
        )
    if min_headroom_mib is not None and int(low.headroom) < min_headroom_mib:  # type: ignore[arg-type]
        return (
            FAIL,
            (
                f"{low.address} headroom {low.headroom} MiB < {min_headroom_mib} MiB for the KV cache; "
                f"{figures}"
            ),
            details,
        )
    return PASS, figures, details


def check(ctx: Context) -> Check:
    """Memory of each service's GPUs balanced and with headroom (see :func:`assess_memory`)."""
    v = ctx.spec.verify
    problems: list[str] = []
    parts: list[str] = []
    details: dict[str, Any] = {
        "spread_limit_pct": v.memory_spread_pct,
        "min_headroom_mib": v.min_headroom_mib,
    }
    why = services_not_run(ctx)
    if why:
        return skipped(NAME, why)
    for c, _, t in ctx.services():
        rows, err = ctx.nvidia_smi(c.vmid)
        if rows is None:
            problems.append(f"CT {c.vmid}: no memory figures ({err})")
            continue
        status, line, d = assess_memory(
            [r for r in rows if r.address in t.gpus], v.memory_spread_pct, v.min_headroom_mib
        )
        details[str(c.vmid)] = d
        (problems if status == FAIL else parts).append(f"CT {c.vmid}: {line}")
    return verdict(NAME, details, "; ".join(parts), problems)
