"""Check ``vm``: every VM GPU and its IOMMU group companions on vfio-pci (sysfs ``driver``
links), ``/dev/vfio/<group>`` present, and Proxmox's own mapping check
(``GET /cluster/mapping/pci?check-node=<node>``) clean: an ``error`` on a mapping the spec
manages or a VM uses fails (at VM start Proxmox checks every entry of the mapping and the first
bad one fails every VM using it), one on another mapping or a ``warning`` warns.

Mapping safety: Proxmox picks among a mapping's entries at VM start knowing only its own
reservations, not the containers'. A mapping that lists a container's GPU fails when any VM
uses it, and warns when none does (a mapping the spec names as a container's own lists its
GPUs by design)."""

from __future__ import annotations

from typing import Any

from gputopo.actions import VFIO
from gputopo.errors import GputopoError
from gputopo.formats.devn import dev_path, is_devn_key
from gputopo.formats.mapline import map_fields, map_paths
from gputopo.plan.vm.safety import mapping_lines
from gputopo.verify.context import Context
from gputopo.verify.parse import mapping_checks
from gputopo.verify.report import Check, skipped, verdict

NAME = "vm"


def check(ctx: Context) -> Check:
    """VM GPUs and their companions on vfio-pci with /dev/vfio/<group>, and Proxmox's mapping check clean."""
    if ctx.no_plan:  # which GPUs belong to VMs is the plan's to say
        return skipped(NAME, ctx.no_plan, {"refusals": ctx.plan_error})
    vm_targets = [t for t in ctx.plan.target if t.driver == VFIO]
    problems: list[str] = []
    warnings: list[str] = []
    gpus: list[dict[str, Any]] = []
    for t in vm_targets:
        _one_gpu(ctx, t.address, gpus, problems)
    managed = set(ctx.plan.mappings)
    details: dict[str, Any] = {"gpus": gpus, "mappings": {}}
    try:
        checks = mapping_checks(ctx.ports.proxmox.mappings(check_node=ctx.node))
    except GputopoError as e:
        problems.append(f"mapping check failed: {e}")
        checks = {}
    details["mappings"] = checks
    for mid in sorted(managed):
        if mid not in checks and ctx.plan.mappings[mid].map:
            problems.append(f"mapping {mid} does not exist")
    used = _used_by(ctx)
    details["used_by"] = {mid: sorted(v) for mid, v in used.items()}
    _safety(ctx, used, problems, warnings)
    for mid, items in sorted(checks.items()):
        for c in items:
            line = f"mapping {mid}: {c['severity']}: {c['message']}"
            if c["severity"] == "error" and mid.lower() in used:
                problems.append(
                    line + f" (used by VM {', '.join(map(str, sorted(used[mid.lower()])))}: its start fails)"
                )
            elif c["severity"] == "error" and mid in managed:
                problems.append(line)
            elif c["severity"] in ("error", "warning"):
                # a broken mapping the spec does not manage is not gputopo's to fix
                warnings.append(line + ("" if mid in managed else " (not managed by the spec)"))
    details["problems"], details["warnings"] = problems, warnings
    n = len(vm_targets)
    groups = len({t.iommu_group for t in vm_targets})
    passed = (
        f"{n} GPU(s) in {groups} group(s) on vfio-pci with their companions, /dev/vfio present, "
        f"mapping check clean ({', '.join(sorted(managed)) or 'none'})"
        if n
        else "no VM GPUs in the spec; mappings check clean"
    )
    return verdict(NAME, details, passed, problems, warnings)


def _used_by(ctx: Context) -> dict[str, set[int]]:
    """Lower-case mapping id -> the VMs of the node with a ``hostpciN`` line naming it."""
    out: dict[str, set[int]] = {}
    for vmid, g in ctx.current.guests.items() if ctx.current else []:
        for _, name in mapping_lines(g.config):
            out.setdefault(name.lower(), set()).add(vmid)
    return out


def _container_gpus(ctx: Context) -> dict[str, int]:
    """address -> container of every GPU a container has: planned for it, or in its devN now."""
    out: dict[str, int] = {}
    for t in ctx.plan.target if ctx.plan else []:
        if t.owner.is_container:
            out[t.address] = t.owner.vmid
    by_minor = {f"/dev/nvidia{g.minor}": g.address for g in ctx.facts.gpus if g.minor is not None}
    for vmid, ct in ctx.current.containers.items() if ctx.current else []:
        for k, v in ct.config.items():
            if is_devn_key(k) and dev_path(str(v)) in by_minor:
                out.setdefault(by_minor[dev_path(str(v))], vmid)
    return out


def _safety(ctx: Context, used: dict[str, set[int]], problems: list[str], warnings: list[str]) -> None:
    if ctx.current is None:
        return
    ct_gpus = _container_gpus(ctx)
    own = {c.mapping.lower() for c in ctx.containers if c.mapping}
    for mid, m in sorted(ctx.current.mappings.items()):
        listed = sorted(
            p for e in m.map if map_fields(e).get("node") == ctx.node for p in map_paths(e) if p in ct_gpus
        )
        if not listed:
            continue
        gpus = ", ".join(f"{a} (CT {ct_gpus[a]})" for a in listed)
        if mid.lower() in used:
            vms = ", ".join(map(str, sorted(used[mid.lower()])))
            problems.append(
                f"mapping {mid} lists container GPU(s) {gpus} and VM {vms} uses it: Proxmox can give "
                "one of them to the VM at its start"
            )
        elif mid.lower() not in own:
            warnings.append(f"mapping {mid} lists container GPU(s) {gpus} (no VM uses it now)")


def _one_gpu(ctx: Context, address: str, gpus: list[dict[str, Any]], problems: list[str]) -> None:
    """A VM GPU and its companions on vfio-pci with /dev/vfio/<group>: its details in ``gpus``,
    what is wrong in ``problems``."""
    g = ctx.facts.gpu(address)
    if g is None:
        problems.append(f"{address} is gone from the bus")
        return
    members = {m.address: m.driver for m in g.iommu_members if m.address in g.companions}
    vfio_dev = g.iommu_group is not None and g.iommu_group in ctx.facts.host.vfio_groups
    gpus.append(
        {
            "address": g.address,
            "driver": g.driver,
            "group": g.iommu_group,
            "companions": members,
            "dev_vfio": vfio_dev,
        }
    )
    if g.driver != VFIO:
        problems.append(f"{g.address} on {g.driver or 'no driver'}, not vfio-pci")
    for a, drv in members.items():
        if drv != VFIO:
            problems.append(
                f"{a} (group {g.iommu_group} of {g.address}) on {drv or 'no driver'}, not vfio-pci"
            )
    if not vfio_dev:
        problems.append(
            f"/dev/vfio/{g.iommu_group if g.iommu_group is not None else '?'} missing for {g.address}"
        )
