"""Check ``container``: inside each container ``nvidia-smi --query-gpu`` lists exactly its
planned GPUs, matched by bus id (missing and extra ones named); GPU device entries whose removal
waits for the container's next restart are a WARN naming them; a ``devN`` whose
``/dev/nvidiaN`` no GPU on nvidia has FAILs, naming the GPUs that are off nvidia: the node
outlives its GPU's unbind (the driver never made it, so nothing removes it), so Proxmox still
starts the container with a node that reaches no GPU; and a ``devN`` whose minor a GPU on
nvidia holds that is not one of the container's planned GPUs FAILs naming both GPUs: the driver
gives a GPU the lowest free minor at each bind (open-gpu-kernel-modules
``kernel-open/nvidia/nv.c`` l.5629-5644), so a saved ``devN`` line can name another GPU's node
once GPUs came back to nvidia in another order, while the running container still shows the
GPUs it started with."""

from __future__ import annotations

import re
from typing import Any

from gputopo.actions.devnodes_by_address import node_minor
from gputopo.errors import GputopoError
from gputopo.formats.devn import dev_entries, dev_path, dev_sort, is_nvidia_dev
from gputopo.plan.gone import gone_addresses
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
        # a device node of a GPU that is gone is wrong whatever the plan would be
        stale = [line for c in ctx.containers for line in _stale_nodes(ctx, c.vmid)]
        if stale:
            return verdict(NAME, {"refusals": ctx.plan_error}, "", stale)
        return skipped(NAME, ctx.no_plan, {"refusals": ctx.plan_error})
    for c in ctx.containers:
        t = ctx.target(c.vmid)
        if t is None:
            problems.append(f"CT {c.vmid}: no plan for it")
            continue
        problems += _stale_nodes(ctx, c.vmid)
        planned = list(t.gpus)
        problems += misplaced_nodes(ctx, c.vmid, planned)
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


def _stale_nodes(ctx: Context, vmid: int) -> list[str]:
    """One line per ``devN`` of container ``vmid`` (its config with pending changes) naming a
    ``/dev/nvidiaN`` that no GPU on the nvidia driver has as its minor: with the node and the
    address of the GPU that left the bus when a PCI mapping of the node still names one."""
    try:
        devs = dev_entries(ctx.ports.proxmox.lxc_config(vmid))
    except GputopoError:
        return []
    on_nvidia = {g.minor for g in ctx.facts.gpus if g.minor is not None and g.driver == "nvidia"}
    off = [f"{g.address} on {g.driver or 'no driver'}" for g in ctx.facts.gpus if g.driver != "nvidia"]
    gone = sorted(gone_addresses(ctx.facts, ctx.current, ctx.node)) if ctx.current is not None else []
    out = []
    for k, v in sorted(devs.items(), key=lambda kv: dev_sort(kv[0])):
        m = re.fullmatch(r"/dev/nvidia(\d+)", dev_path(v))
        if not m or int(m.group(1)) in on_nvidia:
            continue
        if gone:
            out.append(
                f"CT {vmid}: {k} {dev_path(v)} on node {ctx.node} reaches no GPU: no GPU on the host "
                f"has minor {m.group(1)}, {' or '.join(gone)} left the bus; bring it back or remove {k}"
            )
            continue
        gone_by = f" while {', '.join(off)}" if off else ""
        out.append(
            f"CT {vmid}: {k} {dev_path(v)} reaches no GPU (no GPU on nvidia has minor {m.group(1)}{gone_by}), "
            f"remove {k} or bind its GPU back to nvidia"
        )
    return out


def misplaced_nodes(ctx: Context, vmid: int, planned: list[str]) -> list[str]:
    """One line per ``devN`` of container ``vmid`` (its config with pending changes) whose
    ``/dev/nvidiaN`` reaches a GPU on nvidia that is not one of ``planned`` (its GPUs): the GPU
    the node reaches, the planned GPU left without a node, and the entry to set."""
    try:
        devs = dev_entries(ctx.ports.proxmox.lxc_config(vmid))
    except GputopoError:
        return []
    minors = {g.address: g.minor for g in ctx.facts.gpus if g.driver == "nvidia" and g.minor is not None}
    by_minor = {m: a for a, m in minors.items()}
    reached, wrong = set(), []
    for k, v in sorted(devs.items(), key=lambda kv: dev_sort(kv[0])):
        m = node_minor(v)
        if m is None or m not in by_minor:
            continue
        reached.add(by_minor[m])
        if by_minor[m] not in planned:
            wrong.append((k, dev_path(v), by_minor[m]))
    unreached = [a for a in planned if a not in reached and a in minors]
    out = []
    for i, (k, path, there) in enumerate(wrong):
        own = unreached[i] if i < len(unreached) else None
        fix = f"{own} has no devN: set {k} to /dev/nvidia{minors[own]}" if own is not None else f"remove {k}"
        out.append(
            f"CT {vmid}: {k} {path} reaches {there}, not a GPU of CT {vmid} ({fix}, then restart CT {vmid})"
        )
    return out
