"""Check ``vm``: every VM GPU and its IOMMU group companions on vfio-pci (sysfs ``driver``
links), ``/dev/vfio/<group>`` present, and Proxmox's own mapping check
(``GET /cluster/mapping/pci?check-node=<node>``) clean: an ``error`` on a mapping the spec
manages fails, one on another mapping or a ``warning`` warns."""

from __future__ import annotations

from typing import Any

from gputopo.errors import GputopoError
from gputopo.actions import VFIO
from gputopo.verify.context import Context
from gputopo.verify.parse import mapping_checks
from gputopo.verify.report import FAIL, Check, verdict

NAME = "vm"


def check(ctx: Context) -> Check:
    """VM GPUs and their companions on vfio-pci with /dev/vfio/<group>, and Proxmox's mapping check clean."""
    if ctx.plan is None:
        return Check(name=NAME, status=FAIL, summary="no plan: cannot tell which GPUs belong to VMs",
                     details={"refusals": ctx.plan_error})
    vm_targets = [t for t in ctx.plan.target if t.driver == VFIO]
    problems: list[str] = []
    warnings: list[str] = []
    gpus: list[dict[str, Any]] = []
    for t in vm_targets:
        g = ctx.facts.gpu(t.address)
        if g is None:
            problems.append(f"{t.address} is gone from the bus")
            continue
        members = {m.address: m.driver for m in g.iommu_members if m.address in g.companions}
        vfio_dev = g.iommu_group is not None and g.iommu_group in ctx.facts.host.vfio_groups
        gpus.append({"address": g.address, "driver": g.driver, "group": g.iommu_group,
                     "companions": members, "dev_vfio": vfio_dev})
        if g.driver != VFIO:
            problems.append(f"{g.address} on {g.driver or 'no driver'}, not vfio-pci")
        for a, drv in members.items():
            if drv != VFIO:
                problems.append(f"{a} (group {g.iommu_group} of {g.address}) on {drv or 'no driver'}, not vfio-pci")
        if not vfio_dev:
            problems.append(f"/dev/vfio/{g.iommu_group if g.iommu_group is not None else '?'} missing for {g.address}")
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
    for mid, items in sorted(checks.items()):
        for c in items:
            line = f"mapping {mid}: {c['severity']}: {c['message']}"
            if c["severity"] == "error" and mid in managed:
                problems.append(line)
            elif c["severity"] in ("error", "warning"):
                # a broken mapping the spec does not manage is not gputopo's to fix
                warnings.append(line + ("" if mid in managed else " (not managed by the spec)"))
    details["problems"], details["warnings"] = problems, warnings
    n = len(vm_targets)
    groups = len({t.iommu_group for t in vm_targets})
    passed = (f"{n} GPU(s) in {groups} group(s) on vfio-pci with their companions, /dev/vfio present, "
              f"mapping check clean ({', '.join(sorted(managed)) or 'none'})" if n
              else "no VM GPUs in the spec; mappings check clean")
    return verdict(NAME, details, passed, problems, warnings)
