"""Check ``capacity``: the plan's capacity estimate (:mod:`gputopo.capacity.estimate`, made from
the served model's files before anything moved) beside what runs: nvidia-smi's memory used per
GPU against the engine's predicted static memory (its budget: the weights and the KV pool), and
the KV-cache tokens the service reported to the ``inference`` check against the predicted ones,
each difference in percent.

PASS when both are within :data:`TOLERANCE_PCT`; WARN beyond it (the estimate is a forecast:
activations, CUDA graphs and the engine's own rounding are outside it), naming which; left out
of the report when no service runs or no footprint was read (the plan says why). The KV tokens are compared only
when the inference check ran before (``verify``; the watch runs no prompt).
"""

from __future__ import annotations

from typing import Any

from gputopo.capacity.estimate import Capacity
from gputopo.verify.context import Context, services_not_run
from gputopo.verify.report import Check, verdict

NAME = "capacity"
TOLERANCE_PCT = 20.0


def diff_pct(reported: float, predicted: float) -> float | None:
    """(reported - predicted) / predicted in percent; None when nothing was predicted."""
    return round((reported - predicted) / predicted * 100, 1) if predicted else None


def compare(cap: Capacity, used_mib: list[int], kv_reported: int | None) -> tuple[dict[str, Any], list[str]]:
    """(the figures side by side, the lines of what differs beyond the tolerance)."""
    d: dict[str, Any] = {
        "model": cap.model,
        "tp": cap.tp,
        "predicted_weights_gib": cap.weights_gib,
        "predicted_kv_tokens": cap.kv_tokens,
        "reported_kv_tokens": kv_reported,
        "kv_diff_pct": None,
        "predicted_used_mib": round(cap.budget_gib * 1024) if cap.budget_gib is not None else None,
        "reported_used_mib": max(used_mib) if used_mib else None,
        "used_diff_pct": None,
    }
    off: list[str] = []
    if d["predicted_used_mib"] and d["reported_used_mib"] is not None:
        d["used_diff_pct"] = diff_pct(d["reported_used_mib"], d["predicted_used_mib"])
        if abs(d["used_diff_pct"]) > TOLERANCE_PCT:
            off.append(f"memory used {d['reported_used_mib']} MiB vs {d['predicted_used_mib']} predicted")
    if cap.kv_tokens and kv_reported is not None:
        d["kv_diff_pct"] = diff_pct(kv_reported, cap.kv_tokens)
        if abs(d["kv_diff_pct"]) > TOLERANCE_PCT:
            off.append(f"KV cache {kv_reported:,} tokens vs {cap.kv_tokens:,} predicted")
    return d, off


def _line(vmid: int, d: dict[str, Any]) -> str:
    parts = [f"CT {vmid}: {d['model']} at tp {d['tp']}, weights {d['predicted_weights_gib']:.1f} GiB per GPU"]
    if d["used_diff_pct"] is not None:
        parts.append(
            f"used {d['reported_used_mib']} MiB vs {d['predicted_used_mib']} predicted ({d['used_diff_pct']:+.1f} %)"
        )
    if d["kv_diff_pct"] is not None:
        parts.append(
            f"KV {d['reported_kv_tokens']:,} tokens vs {d['predicted_kv_tokens']:,} predicted ({d['kv_diff_pct']:+.1f} %)"
        )
    return ", ".join(parts)


def check(ctx: Context) -> Check | None:
    """The estimate beside the service's and nvidia-smi's figures (see the module); None (left
    out of the report) when the plan has no estimate to compare: no service runs, or no served
    model's footprint was read (the plan says why)."""
    details: dict[str, Any] = {"tolerance_pct": TOLERANCE_PCT}
    if services_not_run(ctx):
        return None
    caps = {c.vmid: c for c in (ctx.plan.capacity if ctx.plan is not None else [])}
    lines, warnings = [], []
    for c, _, t in ctx.services():
        cap = caps.get(c.vmid)
        if cap is None:
            continue
        rows, _err = ctx.nvidia_smi(c.vmid)
        used = [int(r.used) for r in rows or [] if r.address in t.gpus and r.used is not None]
        d, off = compare(cap, used, ctx.kv_reported.get(c.vmid))
        details[str(c.vmid)] = d
        line = _line(c.vmid, d)
        lines.append(line)
        if off:
            warnings.append(f"{line}: off by more than {TOLERANCE_PCT:g} % ({'; '.join(off)})")
    if not lines:
        return None
    return verdict(NAME, details, "; ".join(lines), (), warnings)
