"""The SVG and DOT pictures, read back as structure: every GPU once, no overlapping boxes, text
inside its box (measured with the real font), nothing fetched from outside."""

from __future__ import annotations

import os
import re
from collections import Counter

import pytest

from gputopo.topo import palette
from gputopo.topo.dot import render_dot
from gputopo.topo.tree import build_report
from helpers.topo_pictures import (
    SVG_NS,
    all_pictures,
    boxes,
    owned_state,
    parse,
    plan_picture,
    shown_size,
    size,
)

FONTS = "/usr/share/fonts/truetype/dejavu"


@pytest.fixture(scope="module")
def pictures(materialized):
    return {p.name: p for p in all_pictures(materialized)}


NAMES = [
    "dgx2",
    "esc8000a",
    "esc8000a-all",
    "iommu-off",
    "large",
    "numa-unknown",
    "seed",
    "shared-group",
    "seed-split",
    "large-split",
]


def test_every_fixture_host_is_drawn(pictures):
    from gputopo.sim.hostroot import list_hosts

    assert set(list_hosts()) <= set(pictures) and set(NAMES) == set(pictures)


@pytest.mark.parametrize("name", NAMES)
def test_every_gpu_once_per_side_with_its_owner(pictures, name):
    pic = pictures[name]
    root = parse(pic.svg)
    gpus = [g for g, _, _ in boxes(root) if g.get("class") == "gpu"]
    seen = Counter(g.get("data-address") for g in gpus)
    assert set(seen) == {g.address for g in pic.facts.gpus}
    assert set(seen.values()) == {pic.sides}
    last = {g.get("data-address"): g.get("data-owner") for g in gpus}  # the after side comes last
    assert last == pic.owner_keys()
    switches = Counter(g.get("data-id") for g, _, _ in boxes(root) if g.get("data-kind") == "nvswitch")
    assert set(switches) == {s.address for s in pic.facts.nvswitches}
    assert set(switches.values()) <= {pic.sides}
    # network adapters and NVMe drives only in a --all picture, each once
    for kind, devices in (("nic", pic.facts.nics), ("nvme", pic.facts.nvme)):
        drawn = [g.get("data-id") for g, _, _ in boxes(root) if g.get("data-kind") == kind]
        assert sorted(drawn) == (sorted(d.address for d in devices) if name.endswith("-all") else [])
    legend = [t.text for t in root.find(f"{SVG_NS}g[@class='legend']").iter(f"{SVG_NS}text")]
    assert ({"network adapter", "NVMe drive"} <= set(legend)) == name.endswith("-all")


@pytest.mark.parametrize("name", NAMES)
def test_no_two_boxes_overlap(pictures, name):
    rects = sorted((r for _, _, r in boxes(parse(pictures[name].svg))), key=lambda r: r[0])
    assert len(rects) > 3
    for i, (x, y, w, h) in enumerate(rects):
        for x2, y2, w2, h2 in rects[i + 1 :]:
            if x2 >= x + w:
                break  # sorted by x: nothing further right can overlap this one
            assert y2 >= y + h or y >= y2 + h2, f"boxes overlap: {(x, y, w, h)} and {(x2, y2, w2, h2)}"


@pytest.mark.parametrize("name", NAMES)
def test_boxes_inside_the_picture_and_readable_at_1600px(pictures, name):
    root = parse(pictures[name].svg)
    width, height = size(root)
    for _, _, (x, y, w, h) in boxes(root):
        assert 0 <= x and x + w <= width and 0 <= y and y + h <= height
    # shown as it asks, at most 1600 px wide, the 12 px text must stay at 9 px or more
    shown, shown_h = shown_size(root)
    assert shown_h / shown == pytest.approx(height / width, rel=0.01)
    assert 12 * (shown / width) * min(1.0, 1600 / shown) >= 9, f"{name}: {width} px wide"


@pytest.mark.skipif(
    not os.path.isfile(f"{FONTS}/DejaVuSansMono.ttf"), reason="DejaVu Sans Mono not installed"
)
@pytest.mark.parametrize("name", ["seed-split", "shared-group", "esc8000a", "esc8000a-all", "large"])
def test_text_fits_its_box_in_the_real_font(pictures, name):
    from PIL import ImageFont

    regular = ImageFont.truetype(f"{FONTS}/DejaVuSansMono.ttf", 12)
    bold = ImageFont.truetype(f"{FONTS}/DejaVuSansMono-Bold.ttf", 12)
    checked = 0
    for g, _, (x, y, w, h) in boxes(parse(pictures[name].svg)):
        for t in g.iter(f"{SVG_NS}text"):
            font = bold if t.get("font-weight") == "bold" else regular
            tx, ty = float(t.get("x")), float(t.get("y"))
            assert x < tx and tx + font.getlength(t.text) <= x + w - 2, (t.text, x, w)
            assert y < ty - 9 and ty + 3 <= y + h, (t.text, y, h)
            checked += 1
    assert checked > 10


@pytest.mark.parametrize("name", NAMES)
def test_self_contained(pictures, name):
    svg = pictures[name].svg
    assert svg.startswith('<svg xmlns="http://www.w3.org/2000/svg"')
    assert re.findall(r"https?://[^\"' ]+", svg) == ["http://www.w3.org/2000/svg"]
    for banned in ("<script", "href", "url(", "@import", "@font-face", "<image", "<foreignObject", "<style"):
        assert banned not in svg
    root = parse(svg)
    assert root.find(f"{SVG_NS}title").text


def test_legend_names_every_owner_and_colours_match(pictures):
    pic = pictures["shared-group"]
    root = parse(pic.svg)
    legend = root.find(f"{SVG_NS}g[@class='legend']")
    labels = [t.text for t in legend.iter(f"{SVG_NS}text")]
    assert labels == ["container 101: 1 GPU", "VM mapping gpu-vm: 1 GPU", "free: 1 GPU"]
    fills = {g.get("data-owner"): r.get("fill") for g, r, _ in boxes(root) if g.get("class") == "gpu"}
    colours = palette.assign(pic.owners.values())
    assert fills == {k: c.fill for k, c in colours.items()}
    assert len(set(fills.values())) == 3


def test_plan_picture_marks_what_moves(pictures):
    pic = pictures["seed-split"]
    root = parse(pic.svg)
    assert pic.moved == {"0000:81:00.0", "0000:91:00.0", "0000:e1:00.0", "0000:f1:00.0"}
    sides = root.findall(f"{SVG_NS}g[@class='panel']")
    assert [s.get("data-side") for s in sides] == ["before", "after"]
    for side, arrow in zip(sides, ("→ VM mapping pro6000-vm", "← from container 101")):
        for g in side.iter(f"{SVG_NS}g"):
            if g.get("class") != "gpu":
                continue
            rect = g.find(f"{SVG_NS}rect")
            texts = [t.text for t in g.iter(f"{SVG_NS}text")]
            moving = g.get("data-address") in pic.moved
            assert (rect.get("stroke") == palette.MOVE) == moving
            assert (rect.get("stroke-dasharray") is not None) == moving
            assert (arrow in texts) == moving, texts
    # the two sides have the same layout, side by side
    before = [r for g, _, r in boxes(sides[0])]
    after = [r for g, _, r in boxes(sides[1])]
    shift = after[0][0] - before[0][0]
    assert len(after) == len(before) and shift > 0
    for a, b in zip(after, before):
        assert a[0] - b[0] == pytest.approx(shift, abs=0.2) and a[1:] == pytest.approx(b[1:], abs=0.2)


@pytest.mark.parametrize("name", ["seed-split", "large-split"])
def test_a_plan_picture_is_shown_at_most_1400_px_wide_with_text_of_10_px(pictures, name):
    root = parse(pictures[name].svg)
    width, _ = size(root)
    shown, _ = shown_size(root)
    assert width > 1400  # these hosts are drawn wider: the picture asks to be shown smaller
    assert shown == 1400 and 12 * shown / width >= 10


def test_sides_too_wide_for_half_go_one_below_the_other(materialized):
    """A picture shown 500 px wide cannot hold the seed host's two sides side by side: "after
    the plan" goes below "now", with the same layout, and the picture still fits."""
    from gputopo.model.state import ContainerState, CurrentState
    from gputopo.topo.owners import owners_now
    from gputopo.topo.svg import render_plan_svg

    pic = plan_picture(materialized("seed"), "seed-split", "pro6000-vm")
    facts = pic.facts
    current = CurrentState(
        containers={
            101: ContainerState(
                config={
                    f"dev{i}": f"/dev/nvidia{g.minor}"
                    for i, g in enumerate(facts.gpus)
                    if g.minor is not None
                }
            )
        }
    )
    before = build_report(facts, owners_now(facts, current))
    after = build_report(facts, pic.owners)
    root = parse(render_plan_svg(before, after, max_width=500))
    assert shown_size(root)[0] <= 500
    sides = root.findall(f"{SVG_NS}g[@class='panel']")
    first = [r for _, _, r in boxes(sides[0])]
    second = [r for _, _, r in boxes(sides[1])]
    assert len(first) == len(second) > 8
    assert min(y for _, y, _, _ in second) > max(y + h for _, y, _, h in first)
    drop = second[0][1] - first[0][1]
    for a, b in zip(second, first):
        assert (a[0], a[2], a[3]) == pytest.approx((b[0], b[2], b[3]), abs=0.2)
        assert a[1] - b[1] == pytest.approx(drop, abs=0.2)


def test_dot_text(materialized):
    from gputopo.facts.discover import discover
    from gputopo.topo.owners import owners_now

    facts = discover(materialized("large"))
    dot = render_dot(build_report(facts, owners_now(facts, owned_state(facts))))
    assert dot.startswith('digraph "pve-large" {') and dot.rstrip().endswith("}")
    assert dot.count("{") == dot.count("}")
    for g in facts.gpus:
        assert dot.count(f"  {g.address}\\l") == 1, g.address
    assert dot.count("subgraph cluster_") == 5  # four NUMA nodes and the legend
    held = len([g for g in facts.gpus if g.minor is not None]) // 2  # owned_state gives half to 101
    assert f'label="container 101: {held}"' in dot and f'label="free: {len(facts.gpus) - held}"' in dot
    assert "NVSwitch 0000:" in dot
    nodes = set(re.findall(r"^\s+(n\d+) \[", dot, re.M))
    edges = re.findall(r"^\s+(n\d+) -> (n\d+);", dot, re.M)
    assert edges and all(a in nodes and b in nodes for a, b in edges)
    assert len({b for _, b in edges}) == len(edges)  # a tree: one parent each
