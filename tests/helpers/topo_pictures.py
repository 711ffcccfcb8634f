"""The pictures the picture tests look at: every fixture host with owners, and two plans drawn
before and after. Shared by the structural tests and the headless-browser tests."""

from __future__ import annotations

from dataclasses import dataclass
from xml.etree import ElementTree as ET

from gputopo.facts.discover import discover
from gputopo.model.facts import Facts
from gputopo.model.state import ContainerState, CurrentState, MappingState
from gputopo.plan.mappings import map_entry
from gputopo.plan.planner import plan
from gputopo.plan.starter import spec_from_split
from gputopo.sim.hostroot import list_hosts
from gputopo.topo.model import OwnerView
from gputopo.topo.owners import owner_from_target, owners_now
from gputopo.topo.svg import render_svg
from gputopo.topo.tree import build_report

SVG_NS = "{http://www.w3.org/2000/svg}"


@dataclass
class Picture:
    name: str
    svg: str
    facts: Facts
    owners: dict[str, OwnerView]  # address -> owner (after the plan, for a plan picture)
    moved: set[str]
    sides: int  # 1, or 2 for before/after

    def owner_keys(self) -> dict[str, str]:
        """address -> the owner's key, as the picture's ``data-owner`` names it."""
        return {a: o.key for a, o in self.owners.items()}


def owned_state(facts: Facts) -> CurrentState:
    """Container 101 has the first half of the GPUs on nvidia; a mapping ``gpu-vm`` names every
    GPU on vfio-pci: owners of two kinds plus free ones on every host."""
    nv = [g for g in facts.gpus if g.driver == "nvidia" and g.minor is not None]
    node = (facts.host.hostname or "pve").split(".")[0]
    cfg = {f"dev{i}": f"/dev/nvidia{g.minor}" for i, g in enumerate(nv[: max(1, len(nv) // 2)])}
    maps = [map_entry(g, node) for g in facts.gpus if g.driver == "vfio-pci"]
    return CurrentState(
        containers={101: ContainerState(config=cfg)},
        mappings={"gpu-vm": MappingState(map=maps)} if maps else {},
    )


def host_picture(root, name: str, every: bool = False) -> Picture:
    """``every``: network adapters and NVMe drives drawn too (``topo --all``)."""
    facts = discover(root)
    owners = owners_now(facts, owned_state(facts))
    return Picture(name, render_svg(build_report(facts, owners, every)), facts, owners, set(), 1)


def plan_picture(root, name: str, vm_mapping: str) -> Picture:
    from gputopo.cli.topoview import plan_svg

    facts = discover(root)
    nv = [g for g in facts.gpus if g.driver == "nvidia" and g.minor is not None]
    current = CurrentState(
        containers={
            101: ContainerState(config={f"dev{i}": f"/dev/nvidia{g.minor}" for i, g in enumerate(nv)})
        }
    )
    p = plan(facts, spec_from_split(facts, container=101, vm_mapping=vm_mapping), current)
    before = owners_now(facts, current)
    after = {t.address: owner_from_target(t.owner, before[t.address]) for t in p.target}
    moved = {a for a in after if after[a].key != before[a].key}
    return Picture(name, plan_svg(facts, current, p), facts, after, moved, 2)


def all_pictures(materialized) -> list[Picture]:
    out = [host_picture(materialized(h), h) for h in list_hosts()]
    out.append(host_picture(materialized("esc8000a"), "esc8000a-all", every=True))
    out.append(plan_picture(materialized("seed"), "seed-split", "pro6000-vm"))
    out.append(plan_picture(materialized("large"), "large-split", "h100-vm"))
    return out


def parse(svg: str) -> ET.Element:
    return ET.fromstring(svg)


def boxes(root: ET.Element) -> list[tuple[ET.Element, ET.Element, tuple[float, float, float, float]]]:
    """(group, rect, (x, y, w, h)) of every box in the picture, in document order."""
    out = []
    for g in root.iter(f"{SVG_NS}g"):
        rect = g.find(f"{SVG_NS}rect")
        if rect is not None and rect.get("class") == "box":
            out.append((g, rect, tuple(float(rect.get(k)) for k in ("x", "y", "width", "height"))))
    return out


def size(root: ET.Element) -> tuple[float, float]:
    """The drawing's own size: the viewBox its boxes' coordinates are in."""
    _, _, w, h = (float(v) for v in root.get("viewBox").split())
    return w, h


def shown_size(root: ET.Element) -> tuple[float, float]:
    """The size the picture asks to be shown at (its width and height attributes)."""
    return float(root.get("width")), float(root.get("height"))
