"""What the host is against what the spec says it should be, for a human (pure).

The comparison is the planner's: an area shows a difference exactly when the plan has an action
in it, so ``gputopo diff`` is empty iff ``gputopo plan`` says "No changes". Files are shown as
unified diffs of the current text (rebuilt from the current state with the same renderer)
against the rendered one.
"""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import Field

from gputopo.actions import DiffContext
from gputopo.formats.devn import dev_entries, dev_sort, is_nvidia_dev
from gputopo.model.documents import DiffDoc
from gputopo.model.facts import Facts
from gputopo.model.state import CurrentState
from gputopo.model.strict import Strict
from gputopo.plan.devices import current_nvidia_lxc
from gputopo.plan.model import Plan
from gputopo.plan.planner import plan as make_plan
from gputopo.plan.render import render, render_devices_conf, render_pci_cfg
from gputopo.plan.spec import Container, Spec

AREAS = (
    "driver bindings",
    "container devices",
    "mappings",
    "vm config",
    "service",
    "persistence files",
    "guests and services",
    "ha placement",
)


class DiffArea(Strict):
    lines: list[str] = Field(default_factory=list, description="One line per difference")
    files: dict[str, str] = Field(default_factory=dict, description="path -> unified diff")


class FileChange(Strict):
    before: str | None = Field(description="The text now; null: the file does not exist")
    after: str | None = Field(description="The text the plan leads to; null: removed")


class DiffReport(Strict):
    node: str
    areas: dict[str, DiffArea] = Field(default_factory=dict)
    changes: dict[str, FileChange] = Field(
        default_factory=dict,
        description="path -> before and after, every file and config the unified diffs show",
    )

    @property
    def is_empty(self) -> bool:
        return not any(a.lines or a.files for a in self.areas.values())

    def to_data(self) -> dict[str, Any]:
        """The diff document (``gputopo schema diff``) without ``schema_version``; each area keyed
        by its title with spaces as underscores, the title kept in it."""
        data = {
            "node": self.node,
            "is_empty": self.is_empty,
            "areas": {
                name.replace(" ", "_"): {"title": name, **area.model_dump()}
                for name, area in self.areas.items()
            },
            "changes": {k: v.model_dump() for k, v in self.changes.items()},
        }
        DiffDoc.model_validate(data)  # what it declares, and nothing else
        return data

    def to_text(self) -> str:
        """The report for humans: each area with differences, its lines, then its file diffs."""
        if self.is_empty:
            return f"Node {self.node}: no differences\n"
        out = [f"Node {self.node}"]
        for name in AREAS:
            area = self.areas.get(name)
            if area is None or not (area.lines or area.files):
                continue
            out.append(f"== {name}")
            out += [f"  {ln}" for ln in area.lines]
            for text in area.files.values():
                out.append(text.rstrip("\n"))
        return "\n".join(out) + "\n"


def unified(path: str, before: str | None, after: str | None) -> str:
    """A unified diff of one file (``/dev/null`` for a side that does not exist); '' if equal."""
    a = (before or "").splitlines(keepends=True)
    b = (after or "").splitlines(keepends=True)
    lines = difflib.unified_diff(
        a,
        b,
        fromfile=f"a/{path}" if before is not None else "/dev/null",
        tofile=f"b/{path}" if after is not None else "/dev/null",
    )
    return "".join(ln if ln.endswith("\n") else ln + "\n" for ln in lines)


def _current_devices_text(config: dict[str, Any], container: Container) -> str:
    """The container's GPU lines as they are now, in the rendered file's form: only what the
    planner manages for ``container``, so that unchanged lines diff as unchanged."""
    devices = sorted(
        ((k, v) for k, v in dev_entries(config).items() if is_nvidia_dev(v)), key=lambda kv: dev_sort(kv[0])
    )
    lxc = [(k, v) for k, v in current_nvidia_lxc(config, container)]
    return render_devices_conf(devices, lxc)


def diff(
    facts: Facts,
    spec: Spec,
    current: CurrentState,
    rendered: dict[str, str] | None = None,
    *,
    node: str | None = None,
    templates: str | None = None,
) -> DiffReport:
    """Compare the host (``facts`` + ``current``) with ``spec``. Returns the DiffReport.

    ``rendered`` is what :func:`gputopo.plan.render.render` made for the same plan (made here when
    None). Every action of the plan adds its own lines (``ActionModel.diff``). Raises PlanRefused
    when the spec cannot be planned, SpecError for a spec without a node for this host.
    """
    p: Plan = make_plan(facts, spec, current, node=node, templates=templates)
    rendered = rendered if rendered is not None else render(p, spec, facts, templates)
    containers = {c.vmid: c for c in spec.node(p.node).containers}
    changes: dict[str, FileChange] = {}

    def recorded(path: str, before: str | None, after: str | None) -> str:
        text = unified(path, before, after)
        if text:
            changes[path] = FileChange(before=before, after=after)
        return text

    ctx = DiffContext(
        plan=p,
        spec=spec,
        current=current,
        rendered=rendered,
        areas={},
        unified=recorded,
        render_pci_cfg=render_pci_cfg,
        render_devices=lambda config, vmid: _current_devices_text(config, containers[vmid]),
    )
    for a in p.actions:
        a.diff(ctx)
    areas = {
        name: DiffArea(lines=ctx.areas[name].lines, files=ctx.areas[name].files)
        for name in AREAS
        if name in ctx.areas and (ctx.areas[name].lines or ctx.areas[name].files)
    }
    return DiffReport(node=p.node, areas=areas, changes=changes)
