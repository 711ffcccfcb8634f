"""Proxmox PCI resource mappings (``/etc/pve/mapping/pci.cfg``, cluster-wide) through the API.

A mapping holds one ``map`` line per device and node, and every node of a cluster writes the
same file. A step planned for a node (``node`` set) therefore owns only that node's lines: right
before its write it reads the mapping again, keeps every other node's lines as they are now, puts
its own in, and sends the digest it just read; when Proxmox answers that the file changed in
between (another node wrote), it reads and merges again. Its own lines are compared with the
ones the plan saw (``base``): a change there (an edit by hand between plan and apply) is a
:class:`gputopo.errors.MappingConflict`, never overwritten. Undo puts back the node's journaled
lines the same way. A step without ``node`` (a journal of an older version) writes the whole
``map`` as planned, with the digest read right before.
"""

from __future__ import annotations

import re
import time
from typing import Any, Literal

from pydantic import Field

from gputopo.actions.base import (
    ActionModel,
    DiffContext,
    Phase,
    PreflightContext,
    Resource,
    StepContext,
    World,
)
from gputopo.actions.shell import CommandContext, line
from gputopo.errors import MappingConflict, ProxmoxError
from gputopo.formats.mapline import map_fields, map_node, normalize_map_entry
from gputopo.model.state import MappingState
from gputopo.model.strict import Strict

# pve-configid (pve-common JSONSchema.pm): a letter, then letters, digits, - or _
MAPPING_ID = re.compile(r"^[a-z][a-z0-9_-]+$", re.IGNORECASE)
# PVE::Tools::assert_if_modified: the digest sent is not the file's any more
MODIFIED = "detected modified configuration"
ATTEMPTS = 20


class MappingBefore(Strict):
    exists: bool
    map: list[str] = Field(default_factory=list)
    description: str | None = None


def lines_of(entries: list[str], node: str) -> list[str]:
    """The lines of ``entries`` that belong to ``node``."""
    return [e for e in entries if map_node(e) == node]


def _same(a: list[str], b: list[str]) -> bool:
    return sorted(map(normalize_map_entry, a)) == sorted(map(normalize_map_entry, b))


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


def write_own_lines(
    ctx: StepContext,
    id: str,
    node: str,
    own: list[str],
    description: str | None,
    base: list[str] | None = None,
) -> bool:
    """Make ``node``'s lines of mapping ``id`` exactly ``own``, keeping every other node's lines
    as they are at the moment of the write; returns whether anything was written.

    ``base`` (the node's lines when planned; None: not checked) guards against an edit by hand:
    lines that are neither ``base`` nor ``own`` raise MappingConflict. A write that loses the
    race to another node's (Proxmox: "detected modified configuration") is merged and sent
    again. Raises ProxmoxError for any other refusal.
    """
    px = ctx.ports.proxmox
    for attempt in range(ATTEMPTS):
        cur = ctx.mapping(id)
        now = list(cur.get("map") or []) if cur else []
        mine = lines_of(now, node)
        if base is not None and not _same(mine, base) and not _same(mine, own):
            raise MappingConflict(id, node, f"now {len(mine)} line(s), planned from {len(base)}")
        others = [e for e in now if map_node(e) != node]
        want = others + own
        desc = description if description is not None else (cur.get("description") if cur else None)
        try:
            if cur is None:
                if not want:
                    return False
                px.mapping_create(id, want, desc)
            elif not want:
                px.mapping_delete(id)
            elif _same(now, want) and (cur.get("description") or None) == (desc or None):
                return False
            else:
                px.mapping_update(id, want, desc, cur.get("digest") or "")
            return True
        except ProxmoxError as e:
            # another node wrote between our read and our write: read, merge, send again
            if MODIFIED not in str(e) and "already defined" not in str(e):
                raise
            time.sleep(0.05 * (attempt + 1))
    raise ProxmoxError(f"PUT /cluster/mapping/pci/{id}", None, f"still changing after {ATTEMPTS} merges")


def mapping_commands(
    id: str, now: MappingState | None, want: list[str], description: str | None
) -> list[str]:
    """The ``pvesh`` command that makes mapping ``id`` (``now``: as it is, None: absent) hold
    ``want`` with ``description`` (None: unchanged); [] when it does already. The map is sent
    whole, one ``--map`` per line, as the API takes it (proxmox.md, PCI mappings)."""
    path = f"/cluster/mapping/pci/{id}"
    desc = ["--description", description] if description is not None else []
    maps = [w for e in want for w in ("--map", e)]
    if now is None:
        return [line("pvesh", "create", "/cluster/mapping/pci", "--id", id, *maps, *desc)] if want else []
    if not want:
        return [line("pvesh", "delete", path)]
    if _same(now.map, want) and (description is None or description == now.description):
        return []
    return [line("pvesh", "set", path, *maps, *desc)]


class _MappingStep(ActionModel):
    """What creating, updating and deleting a mapping share: its id, its state before, its undo,
    and (``node`` set) the lines of that node only."""

    phase: Phase = "prepare"
    id: str
    digest: str | None = None
    node: str | None = Field(
        None, description="The node whose map lines this step owns (None: the whole map)"
    )
    base: list[str] | None = Field(None, description="That node's lines when the plan was made")

    Before = MappingBefore
    counts_as = "mapping change"

    def preflight(self, ctx: PreflightContext) -> list[str]:
        if MAPPING_ID.match(self.id):
            return []
        return [f"mapping name {self.id!r} is not valid for Proxmox (a letter, then letters, digits, - or _)"]

    def before(self, ctx: StepContext) -> MappingBefore:
        return _before(ctx, self.id)

    def undo(self, before: MappingBefore, ctx: StepContext) -> str:
        if self.node is None:
            return _restore(ctx, self.id, before)
        wrote = write_own_lines(
            ctx,
            self.id,
            self.node,
            lines_of(before.map, self.node),
            before.description if before.exists else None,
        )
        return f"restored node {self.node}'s lines of mapping {self.id}" if wrote else ""

    def undo_restores(self) -> set[Resource]:
        return {Resource("mapping", self.id)}

    def own(self) -> list[str]:
        return []

    def wanted(self, ctx: CommandContext) -> list[str]:
        """The whole map once this step is done, from the state the plan was made from."""
        raise NotImplementedError

    def undo_commands(self, ctx: CommandContext) -> list[str]:
        before = ctx.current.mappings.get(self.id)
        want = self.wanted(ctx)
        after = MappingState(map=want) if want else None
        if before is None:
            return [line("pvesh", "delete", f"/cluster/mapping/pci/{self.id}")] if after else []
        return mapping_commands(self.id, after, list(before.map), before.description)

    def signature(self) -> dict[str, Any]:
        if self.node is None:
            return super().signature()
        # other nodes' lines, and whether the write creates, updates or deletes the mapping, are
        # settled at write time, not by the plan: a node's lines emptied are the same step whether
        # other nodes still had lines when the plan was made (update) or not any more (delete),
        # as in a rollout where the nodes before it gave their lines up
        return {
            "kind": "node_mapping_lines",
            "id": self.id,
            "node": self.node,
            "own": sorted(map(normalize_map_entry, self.own())),
            "base": sorted(map(normalize_map_entry, self.base or [])),
        }

    def diff(self, ctx: DiffContext) -> None:
        ctx.area("mappings").lines.append(self.describe())
        from_now = [
            {"id": mid, "map": m.map, "description": m.description}
            for mid, m in ctx.current.mappings.items()
            if m.map
        ]
        path = "pve/mapping/pci.cfg"
        ctx.area("mappings").files[path] = ctx.unified(
            path, ctx.render_pci_cfg(from_now) if from_now else None, ctx.rendered.get(path)
        )


class SetMapping(_MappingStep):
    kind: Literal["set_mapping"] = "set_mapping"
    map: list[str]
    description: str | None = None
    create: bool

    def describe(self) -> str:
        paths = [map_fields(e).get("path", "?") for e in (self.own() if self.node else self.map)]
        verb = "create" if self.create else "update"
        return f"{verb} PCI mapping {self.id}: {len(paths)} device(s) {', '.join(paths)}".rstrip()

    def own(self) -> list[str]:
        return lines_of(self.map, self.node) if self.node else list(self.map)

    def wanted(self, ctx: CommandContext) -> list[str]:
        if self.node is None:
            return list(self.map)
        now = ctx.current.mappings.get(self.id)
        return [e for e in (now.map if now else []) if map_node(e) != self.node] + self.own()

    def commands(self, ctx: CommandContext) -> list[str]:
        return mapping_commands(
            self.id, ctx.current.mappings.get(self.id), self.wanted(ctx), self.description
        )

    def do(self, ctx: StepContext) -> None:
        if self.node is not None:
            write_own_lines(ctx, self.id, self.node, self.own(), self.description, self.base)
            return
        cur = ctx.mapping(self.id)
        if cur is None:
            ctx.ports.proxmox.mapping_create(self.id, self.map, self.description)
        else:  # the digest read right now, not at plan time
            ctx.ports.proxmox.mapping_update(self.id, self.map, self.description, cur.get("digest") or "")

    def expect(self, world: World) -> None:
        world.current.mappings[self.id] = MappingState(
            map=list(self.map), description=self.description, digest="new"
        )


class DeleteMapping(_MappingStep):
    kind: Literal["delete_mapping"] = "delete_mapping"

    def describe(self) -> str:
        return f"delete PCI mapping {self.id}"

    def wanted(self, ctx: CommandContext) -> list[str]:
        if self.node is None:
            return []
        now = ctx.current.mappings.get(self.id)
        return [e for e in (now.map if now else []) if map_node(e) != self.node]

    def commands(self, ctx: CommandContext) -> list[str]:
        return mapping_commands(self.id, ctx.current.mappings.get(self.id), self.wanted(ctx), None)

    def do(self, ctx: StepContext) -> None:
        if self.node is not None:
            # another node may have added lines since the plan: only this node's go
            write_own_lines(ctx, self.id, self.node, [], None, self.base)
            return
        if ctx.mapping(self.id) is not None:
            ctx.ports.proxmox.mapping_delete(self.id)

    def expect(self, world: World) -> None:
        world.current.mappings.pop(self.id, None)
