"""Owner colours, one place for the SVG, the DOT text and the terminal. Pure.

Containers get blues and greens, VM mappings purples and pinks, free GPUs grey, so the kind of
owner reads at a glance and two owners of one kind still differ. A colour is chosen by the
owner's place among the owners shown, so one picture never gives two owners the same colour
(up to the size of a palette; then they repeat).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gputopo.topo.model import OwnerView


@dataclass(frozen=True)
class Colour:
    fill: str  # box background (SVG, DOT)
    stroke: str  # box outline and the owner's text
    term: str  # rich colour name for the terminal


CONTAINERS = (
    Colour("#dbeafe", "#1d4ed8", "bright_blue"),
    Colour("#dcfce7", "#15803d", "green"),
    Colour("#cffafe", "#0e7490", "cyan"),
    Colour("#fef9c3", "#a16207", "yellow"),
)
VMS = (
    Colour("#f3e8ff", "#7e22ce", "magenta"),
    Colour("#fce7f3", "#be185d", "bright_magenta"),
    Colour("#ffedd5", "#c2410c", "bright_red"),
    Colour("#ede9fe", "#5b21b6", "purple"),
)
FREE = Colour("#f3f4f6", "#4b5563", "bright_black")

# Boxes that are not GPUs: (fill, stroke).
NODE_COLOURS = {
    "numa": ("#e5e7eb", "#111827"),
    "host_bridge": ("#ffffff", "#6b7280"),
    "root_port": ("#ffffff", "#9ca3af"),
    "switch": ("#fafaf9", "#57534e"),
    "bridge": ("#ffffff", "#9ca3af"),
    "nvswitch": ("#e2e8f0", "#334155"),
    "nic": ("#ecfeff", "#0e7490"),
    "nvme": ("#f5f3ff", "#6d28d9"),
}
MOVE = "#dc2626"  # outline of a GPU that the plan moves
FOREIGN = "#b91c1c"  # a foreign device in a GPU's IOMMU group


def assign(owners: Iterable[OwnerView]) -> dict[str, Colour]:
    """Each owner's colour by its :attr:`~OwnerView.key`: containers and VMs in their
    :attr:`~OwnerView.sort_key` order take the next colour of their palette, free is grey."""
    unique = {o.key: o for o in owners}
    out: dict[str, Colour] = {}
    counters = {"container": 0, "vm": 0}
    for o in sorted(unique.values(), key=lambda o: o.sort_key):
        if o.kind == "free":
            out[o.key] = FREE
            continue
        palette = CONTAINERS if o.kind == "container" else VMS
        out[o.key] = palette[counters[o.kind] % len(palette)]
        counters[o.kind] += 1
    return out
