"""Proxmox PCI resource mappings (``/etc/pve/mapping/pci.cfg``, cluster-wide) through the API.

An update always resends ``map`` (Proxmox requires it) with the digest read right before the PUT,
never the one from plan time; undo restores the journaled ``map`` and description.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from gputopo.actions.base import ActionModel, DiffContext, Phase, PreflightContext, StepContext, World
from gputopo.formats.mapline import map_fields
from gputopo.model.state import MappingState

# pve-configid (pve-common JSONSchema.pm): a letter, then letters, digits, - or _
MAPPING_ID = re.compile(r"^[a-z][a-z0-9_-]+$", re.IGNORECASE)


class MappingBefore(BaseModel):
    model_config = ConfigDict(extra="forbid")

    exists: bool
    map: list[str] = Field(default_factory=list)
    description: str | None = None


def _before(ctx: StepContext, id: str) -> MappingBefore:
    m = ctx.mapping(id)
    if m is None:
        return MappingBefore(exists=False)
    return MappingBefore(exists=True, map=list(m.get("map") or []), description=m.get("description"))


def _restore(ctx: StepContext, id: str, before: MappingBefore) -> str:
    px = ctx.ports.proxmox
    cur = ctx.mapping(id)
    if not before.exists:
        if cur is not None:
            px.mapping_delete(id)
            return f"deleted mapping {id}"
        return ""
    if cur is None:
        px.mapping_create(id, before.map, before.description)
        return f"re-created mapping {id}"
    if list(cur.get("map") or []) != before.map or cur.get("description") != before.description:
        px.mapping_update(id, before.map, before.description, cur.get("digest") or "")
        return f"restored mapping {id}"
    return ""


class _MappingStep(ActionModel):
    """What creating, updating and deleting a mapping share: its id, its state before, its undo."""

    phase: Phase = "prepare"
    id: str
    digest: str | None = None

    Before = MappingBefore
    counts_as = "mapping change"

    def preflight(self, ctx: PreflightContext) -> list[str]:
        if MAPPING_ID.match(self.id):
            return []
        return [f"mapping name {self.id!r} is not valid for Proxmox (a letter, then letters, digits, - or _)"]

    def before(self, ctx: StepContext) -> MappingBefore:
        return _before(ctx, self.id)

    def undo(self, before: MappingBefore, ctx: StepContext) -> str:
        return _restore(ctx, self.id, before)

    def diff(self, ctx: DiffContext) -> None:
        ctx.area("mappings").lines.append(self.describe())
        from_now = [{"id": mid, "map": m.map, "description": m.description}
                    for mid, m in ctx.current.mappings.items() if m.map]
        path = "pve/mapping/pci.cfg"
        ctx.area("mappings").files[path] = ctx.unified(
            path, ctx.render_pci_cfg(from_now) if from_now else None, ctx.rendered.get(path))


class SetMapping(_MappingStep):
    kind: Literal["set_mapping"] = "set_mapping"
    map: list[str]
    description: str | None = None
    create: bool

    def describe(self) -> str:
        paths = [map_fields(e).get("path", "?") for e in self.map]
        verb = "create" if self.create else "update"
        return f"{verb} PCI mapping {self.id}: {len(self.map)} device(s) {', '.join(paths)}"

    def do(self, ctx: StepContext) -> None:
        cur = ctx.mapping(self.id)
        if cur is None:
            ctx.ports.proxmox.mapping_create(self.id, self.map, self.description)
        else:  # the digest read right now, not at plan time
            ctx.ports.proxmox.mapping_update(self.id, self.map, self.description, cur.get("digest") or "")

    def expect(self, world: World) -> None:
        world.current.mappings[self.id] = MappingState(map=list(self.map), description=self.description, digest="new")


class DeleteMapping(_MappingStep):
    kind: Literal["delete_mapping"] = "delete_mapping"

    def describe(self) -> str:
        return f"delete PCI mapping {self.id}"

    def do(self, ctx: StepContext) -> None:
        if ctx.mapping(self.id) is not None:
            ctx.ports.proxmox.mapping_delete(self.id)

    def expect(self, world: World) -> None:
        world.current.mappings.pop(self.id, None)
