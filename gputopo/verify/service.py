"""Check ``service``: each container's unit is active and running with the planned
tensor-parallel size, read from its effective ``ExecStart``."""

from __future__ import annotations

from typing import Any

from gputopo.errors import GputopoError
from gputopo.formats.systemctl import parse_tp
from gputopo.verify.context import EXEC_TIMEOUT, Context, services_not_run
from gputopo.verify.report import Check, skipped, verdict

NAME = "service"


def check(ctx: Context) -> Check:
    """Each service active and running with the planned tensor-parallel size; anything else FAILs."""
    problems: list[str] = []
    parts: list[str] = []
    details: dict[str, Any] = {}
    why = services_not_run(ctx)
    if why:
        return skipped(NAME, why)
    for c, svc, t in ctx.services():
        unit, want = svc.unit, len(t.gpus)
        try:
            res = ctx.exec.run(c.vmid, ["systemctl", "is-active", unit], EXEC_TIMEOUT)
        except GputopoError as e:
            problems.append(f"CT {c.vmid}: {str(e).removeprefix(f'CT {c.vmid}: ')}")
            continue
        if not res.stdout.strip():
            # pct itself failed (container stopped or gone): its message says why
            why = res.stderr.strip().splitlines()[-1] if res.stderr.strip() else f"exit {res.rc}"
            problems.append(f"CT {c.vmid}: systemctl is-active {unit}: {why}")
            details[str(c.vmid)] = {"unit": unit, "error": why, "planned_tp": want}
            continue
        state = res.stdout.strip().splitlines()[-1]
        props, err = ctx.service_props(c.vmid, unit)
        command = ctx.service_command(c.vmid, unit)
        tp = parse_tp(command) if command else None
        details[str(c.vmid)] = {
            "unit": unit,
            "state": state,
            "exec_start": command,
            "tp": tp,
            "planned_tp": want,
        }
        if state != "active":
            problems.append(f"CT {c.vmid}: {unit} is {state}")
        elif props is None:
            problems.append(f"CT {c.vmid}: {err}")
        elif tp is None:
            problems.append(f"CT {c.vmid}: {unit} runs without a readable {svc.tp_flag} (planned {want})")
        elif tp != want:
            problems.append(f"CT {c.vmid}: {unit} runs with tp {tp}, planned tp {want}")
        else:
            parts.append(f"CT {c.vmid}: {unit} active, tp {tp} as planned")
    return verdict(NAME, details, "; ".join(parts), problems)
