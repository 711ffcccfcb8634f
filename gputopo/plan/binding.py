"""Which driver each GPU is bound to after the plan: its target, the rebinds that get it there,
and the persistence files that keep a VM's GPUs on vfio-pci across a reboot. Pure."""

from __future__ import annotations

from typing import Any

from gputopo.actions import NVIDIA, VFIO, Rebind, RemoveHostFile, WriteHostFile
from gputopo.model.facts import Facts, Gpu, MemberRole
from gputopo.model.owner import HOST, Owner
from gputopo.model.state import CurrentState
from gputopo.plan.model import GpuTarget
from gputopo.plan.render import PERSISTENCE_PATHS, persistence_files


def gpu_targets(facts: Facts, owner_of: dict[str, Owner]) -> list[GpuTarget]:
    """Every GPU of ``facts`` with its owner and target driver (None: left with the host)."""
    target = []
    for g in facts.gpus:
        owner = owner_of.get(g.address, HOST)
        drv = NVIDIA if owner.is_container else VFIO if owner.is_vm else None
        target.append(
            GpuTarget(
                address=g.address,
                owner=owner,
                driver=drv,
                current_driver=g.driver,
                companions=g.companions,
                numa_node=g.numa_node,
                minor=g.minor,
                iommu_group=g.iommu_group,
            )
        )
    return target


def persistence_actions(
    vfio_addresses: list[str], current: CurrentState, templates: str | None
) -> list[WriteHostFile | RemoveHostFile]:
    """Writes of the persistence files that differ, removals of those no longer wanted."""
    want = persistence_files(vfio_addresses, templates)
    actions: list[WriteHostFile | RemoveHostFile] = []
    for path in PERSISTENCE_PATHS:
        have = current.files.get(path)
        if path in want:
            if have != want[path]:
                actions.append(WriteHostFile(path=path, content=want[path]))
        elif have is not None:
            actions.append(RemoveHostFile(path=path))
    return actions


def needed_rebinds(
    facts: Facts, target: list[GpuTarget], keep_override: bool, pin_native: bool
) -> list[Rebind]:
    """One Rebind per IOMMU group that is not yet where the target wants it. ``keep_override``
    pins VM GPUs to vfio-pci, ``pin_native`` container GPUs to nvidia (``driver_override``)."""
    out: list[Rebind] = []
    seen_groups: set[Any] = set()
    for t in target:
        if t.driver is None:
            continue
        g = facts.gpu(t.address)
        assert g is not None
        gkey = g.iommu_group if g.iommu_group is not None else g.address
        keep = keep_override if t.driver == VFIO else pin_native
        if gkey in seen_groups or not _needs_rebind(g, t.driver, keep):
            continue
        seen_groups.add(gkey)
        members = {
            g.address: g.driver,
            **{m.address: m.driver for m in g.iommu_members if m.role != MemberRole.BRIDGE},
        }
        out.append(
            Rebind(
                address=g.address,
                members=sorted(members),
                from_drivers=dict(sorted(members.items())),
                to_driver=t.driver,
                keep_override=keep,
                minor=g.minor if t.driver == VFIO and g.driver == NVIDIA else None,
            )
        )
    return out


def _needs_rebind(g: Gpu, to: str, keep_override: bool) -> bool:
    others = [m for m in g.iommu_members if m.role != MemberRole.BRIDGE]
    if to == VFIO:
        if g.driver != VFIO or any(m.driver != VFIO for m in others):
            return True
        return keep_override and g.driver_override != VFIO
    if g.driver != NVIDIA or g.driver_override != (NVIDIA if keep_override else None):
        return True
    return any(m.driver == VFIO and m.role == MemberRole.FUNCTION for m in others)
