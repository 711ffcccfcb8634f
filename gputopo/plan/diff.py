"""What the host is against what the spec says it should be, for a human (pure).

The comparison is the planner's: an area shows a difference exactly when the plan has an action
in it, so ``gputopo diff`` is empty iff ``gputopo plan`` says "No changes". Files are shown as
unified diffs of the current text (rebuilt from the current state with the same renderer)
against the rendered one.
"""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gputopo.model.facts import Facts
from gputopo.model.state import CurrentState
from gputopo.plan.planner import DEV_KEY, DeleteMapping, Plan, Rebind, RemoveHostFile, SetMapping, UpdateContainer, WriteHostFile, WriteServiceDropin, current_nvidia_lxc, dev_sort, is_nvidia_dev
from gputopo.plan.planner import plan as make_plan
from gputopo.plan.render import dropin_path, render, render_devices_conf, render_pci_cfg
from gputopo.plan.spec import Container, Spec

AREAS = ("driver bindings", "container devices", "mappings", "service", "persistence files")


class DiffArea(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lines: list[str] = Field(default_factory=list, description="One line per difference")
    files: dict[str, str] = Field(default_factory=dict, description="path -> unified diff")


class DiffReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    node: str
    areas: dict[str, DiffArea] = Field(default_factory=dict)

    @property
    def is_empty(self) -> bool:
        return not any(a.lines or a.files for a in self.areas.values())

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
        a, b, fromfile=f"a/{path}" if before is not None else "/dev/null",
        tofile=f"b/{path}" if after is not None else "/dev/null",
    )
    return "".join(ln if ln.endswith("\n") else ln + "\n" for ln in lines)


def _current_devices_text(config: dict[str, Any], container: Container) -> str:
    """The container's GPU lines as they are now, in the rendered file's form: only what the
    planner manages for ``container``, so that unchanged lines diff as unchanged."""
    devices = sorted(
        ((k, str(v)) for k, v in config.items() if DEV_KEY.match(k) and is_nvidia_dev(str(v))),
        key=lambda kv: dev_sort(kv[0]),
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
    None). Raises PlanRefused when the spec cannot be planned, SpecError for a spec without a
    node for this host.
    """
    p: Plan = make_plan(facts, spec, current, node=node, templates=templates)
    rendered = rendered if rendered is not None else render(p, spec, facts, templates)
    areas = {name: DiffArea() for name in AREAS}

    for a in p.actions:
        if isinstance(a, Rebind):
            for m in a.members:
                areas["driver bindings"].lines.append(f"{m}: {a.from_drivers.get(m) or 'none'} -> {a.to_driver}")
        elif isinstance(a, UpdateContainer):
            container = next(c for c in spec.node(p.node).containers if c.vmid == a.vmid)
            path = f"pve/lxc/{a.vmid}.devices.conf"
            cfg = current.containers[a.vmid].config if a.vmid in current.containers else {}
            areas["container devices"].lines.append(a.describe())
            areas["container devices"].files[path] = unified(
                path, _current_devices_text(cfg, container), rendered.get(path, "")
            )
        elif isinstance(a, (SetMapping, DeleteMapping)):
            areas["mappings"].lines.append(a.describe())
        elif isinstance(a, WriteServiceDropin):
            ct = next(c for c in p.containers if c.vmid == a.vmid)
            svc = ct.service
            assert svc is not None
            was = current.containers[a.vmid].service if a.vmid in current.containers else None
            areas["service"].lines.append(
                f"CT {a.vmid} {a.unit}: tensor parallel {svc.current_tp if svc.current_tp is not None else '?'} -> {a.tp}"
            )
            path = f"ct/{a.vmid}{dropin_path(svc.unit, svc.dropin)}"
            areas["service"].files[path] = unified(path, was.dropin if was else None, rendered.get(path))
        elif isinstance(a, (WriteHostFile, RemoveHostFile)):
            before = current.files.get(a.path)
            after = a.content if isinstance(a, WriteHostFile) else None
            areas["persistence files"].lines.append(a.describe())
            areas["persistence files"].files[a.path] = unified(a.path, before, after)

    if areas["mappings"].lines:
        sections_now = [
            {"id": mid, "map": m.map, "description": m.description} for mid, m in current.mappings.items() if m.map
        ]
        path = "pve/mapping/pci.cfg"
        areas["mappings"].files[path] = unified(
            path, render_pci_cfg(sections_now) if sections_now else None, rendered.get(path)
        )
    return DiffReport(node=p.node, areas={k: v for k, v in areas.items() if v.lines or v.files})
