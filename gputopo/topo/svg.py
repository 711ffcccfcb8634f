"""The topology as a self-contained SVG picture: one host, or a host before and after a plan. Pure.

No scripts, no external fonts, stylesheets or images: text uses the viewer's monospace font, and
every box is a ``<rect class="box">`` in absolute coordinates inside a ``<g>`` that names what it
is (``class="gpu" data-address=... data-owner=...``), so tests and tools can read the picture
back. Owners are colours (:mod:`gputopo.topo.palette`) and words, so the picture also reads in
grey. In a before/after picture a GPU that the plan moves has a dashed red outline and a line
saying where it goes (before) or where it came from (after); both sides have the same layout.

The before/after picture is at most :data:`PLAN_WIDTH` wide as shown (a README, a browser
window, a review tool). It is drawn at most :data:`SCALE_LIMIT` times as wide, its two sides
side by side, each side's columns wrapping within half of that; a side too wide for half puts
"after the plan" below "now". What is drawn wider than PLAN_WIDTH is shown smaller: the
``width`` the document asks for is PLAN_WIDTH and its ``viewBox`` the drawing's own size, so
12 px text shows at 10 px or more.
"""

from __future__ import annotations

from collections.abc import Sequence
from xml.sax.saxutils import escape, quoteattr

from gputopo.topo import palette
from gputopo.topo.layout import (
    BASELINE,
    FONT,
    LINE,
    PAD_X,
    PAD_Y,
    Box,
    Line,
    Panel,
    column,
    place,
    text_width,
    widen,
)
from gputopo.topo.model import GpuView, OwnerView, TopoReport, TreeNode
from gputopo.topo.tree import gpu_views

MAX_WIDTH = 1600
PLAN_WIDTH = 1400  # the widest a before/after picture is shown
SCALE_LIMIT = 1.2  # side by side up to this much wider than PLAN_WIDTH: shown smaller; beyond: stacked
MARGIN = 16
TITLE = 16
SWATCH = 14
PANEL_GAP = 32


def gpu_lines(v: GpuView, colour: palette.Colour, move: str | None = None) -> list[Line]:
    """The text of a GPU's box: address, model, driver/group/minor, link, owner, companions and,
    when it moves, where to or from."""
    facts = [
        v.driver or "no driver",
        f"group {'-' if v.iommu_group is None else v.iommu_group}",
        f"minor {'-' if v.minor is None else v.minor}",
    ]
    lines = [Line(f"GPU{v.index}  {v.address}", bold=True), Line(v.model or "?"), Line(" · ".join(facts))]
    link = v.link or "link unknown"
    lines.append(Line(link + (" · boot VGA" if v.boot_vga else "")))
    lines.append(Line(v.owner.label, bold=True, colour=colour.stroke))
    for c in v.companions:
        what = c.role + (f", {c.driver}" if c.driver else "")
        lines.append(Line(f"+ {c.address} {what}", colour=palette.FOREIGN if c.role == "foreign" else None))
    if move:
        lines.append(Line(move, bold=True, colour=palette.MOVE))
    return lines


def node_lines(node: TreeNode) -> list[Line]:
    """The text of a box that is not a GPU: its label, and its detail when it has one."""
    lines = [Line(node.label, bold=node.kind in ("numa", "switch", "nvswitch"))]
    if node.detail:
        lines.append(Line(node.detail))
    return lines


def _n(v: float) -> str:
    return str(int(v)) if v == int(v) else f"{v:.1f}"


def _text(x: float, y: float, line: Line, size: int = FONT) -> str:
    attrs = f'x="{_n(x)}" y="{_n(y)}"'
    if size != FONT:
        attrs += f' font-size="{size}"'
    if line.bold:
        attrs += ' font-weight="bold"'
    if line.colour:
        attrs += f' fill="{line.colour}"'
    return f"<text {attrs}>{escape(line.text)}</text>"


def _box(b: Box, colours: dict[str, palette.Colour], moved: set[str]) -> str:
    node = b.node
    dashed = ""
    if node.gpu is not None:
        colour = colours[node.gpu.owner.key]
        fill, stroke, width = colour.fill, colour.stroke, 1.5
        head = (
            f'<g class="gpu" data-address={quoteattr(node.gpu.address)} '
            f"data-owner={quoteattr(node.gpu.owner.key)}>"
        )
        if node.gpu.address in moved:
            stroke, width, dashed = palette.MOVE, 2.5, ' stroke-dasharray="6 3"'
    else:
        fill, stroke = palette.NODE_COLOURS[node.kind]
        width = 1.5 if node.kind in ("numa", "switch") else 1
        head = f'<g class="node" data-kind="{node.kind}" data-id={quoteattr(node.id)}>'
    parts = [
        head,
        f'<rect class="box" x="{_n(b.x)}" y="{_n(b.y)}" width="{_n(b.w)}" height="{_n(b.h)}" '
        f'rx="4" fill="{fill}" stroke="{stroke}" stroke-width="{width}"{dashed}/>',
    ]
    for i, line in enumerate(b.lines):
        parts.append(_text(b.x + PAD_X, b.y + PAD_Y + i * LINE + BASELINE, line))
    parts.append("</g>")
    return "".join(parts)


def _panel_svg(panel: Panel, colours: dict[str, palette.Colour], moved: set[str]) -> list[str]:
    out = ['<g class="edges" stroke="#9ca3af" stroke-width="1" fill="none">']
    out += [f'<path d="M{_n(a)} {_n(b)}L{_n(c)} {_n(d)}"/>' for a, b, c, d in panel.segments]
    out.append("</g>")
    out += [_box(b, colours, moved) for b in panel.boxes]
    return out


def _legend(
    items: Sequence[tuple[str, str, str, bool]], x0: float, y0: float, width: float
) -> tuple[list[str], float, float]:
    """Swatches with labels, flowing over lines of ``width``: (svg, width used, height). Items
    are (label, fill, stroke, dashed)."""
    out = ['<g class="legend">']
    x, y, used = x0, y0, 0.0
    for label, fill, stroke, dashed in items:
        w = SWATCH + 6 + text_width(label) + 18
        if x > x0 and x + w > x0 + width:
            x, y = x0, y + LINE + 6
        dash = ' stroke-dasharray="4 2"' if dashed else ""
        out.append(
            f'<rect class="swatch" x="{_n(x)}" y="{_n(y)}" width="{SWATCH}" height="{SWATCH}" rx="2" '
            f'fill="{fill}" stroke="{stroke}" stroke-width="{2 if dashed else 1.5}"{dash}/>'
        )
        out.append(_text(x + SWATCH + 6, y + BASELINE, Line(label)))
        used = max(used, x + SWATCH + 6 + text_width(label) - x0)
        x += w
    out.append("</g>")
    return out, used, (y - y0) + LINE


def _wrap(text: str, width: float) -> list[str]:
    """``text`` broken at spaces into lines no wider than ``width`` (a longer word stays whole)."""
    lines: list[str] = []
    for word in text.split(" "):
        if lines and text_width(lines[-1] + " " + word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines


def _groups(
    groups: dict[str, str], colours: dict[str, palette.Colour], x0: float, y0: float, width: float
) -> tuple[list[str], float, float]:
    """One entry per owner saying why it gets its GPUs, a swatch and the text (wrapped to
    ``width``) in its colours: (svg, width used, height); nothing for no groups."""
    if not groups:
        return [], 0.0, 0.0
    out = ['<g class="groups">']
    y, used = y0, 0.0
    for key, text in groups.items():
        colour = colours.get(key, palette.FREE)
        out.append(f'<g class="group" data-owner={quoteattr(key)}>')
        out.append(
            f'<rect class="swatch" x="{_n(x0)}" y="{_n(y)}" width="{SWATCH}" height="{SWATCH}" rx="2" '
            f'fill="{colour.fill}" stroke="{colour.stroke}" stroke-width="1.5"/>'
        )
        for line in _wrap(f"{key}: {text}", width - SWATCH - 6):
            out.append(_text(x0 + SWATCH + 6, y + BASELINE, Line(line, colour=colour.stroke)))
            used = max(used, SWATCH + 6 + text_width(line))
            y += LINE
        out.append("</g>")
        y += 4
    out.append("</g>")
    return out, used, y - y0 - 4


def _document(body: list[str], width: float, height: float, title: str, shown: float | None = None) -> str:
    """The SVG document of ``body`` drawn ``width`` x ``height``; shown at most ``shown`` wide
    (its width and height attributes scaled down, its viewBox the drawing's own size)."""
    w, h = int(width + 0.999), int(height + 0.999)
    sw, sh = w, h
    if shown is not None and w > shown:
        sw, sh = int(shown), int(h * shown / w + 0.999)
    return (
        "\n".join(
            [
                f'<svg xmlns="http://www.w3.org/2000/svg" width="{sw}" height="{sh}" viewBox="0 0 {w} {h}" '
                f'font-family="DejaVu Sans Mono, Menlo, Consolas, monospace" font-size="{FONT}">',
                f"<title>{escape(title)}</title>",
                f'<rect class="background" x="0" y="0" width="{w}" height="{h}" fill="#ffffff"/>',
                *body,
                "</svg>",
            ]
        )
        + "\n"
    )


def _owner_items(counts: dict[str, tuple[OwnerView, list[int]]], colours: dict[str, palette.Colour]) -> list:
    """The legend's owners in their sort order: owner key -> (owner, GPUs on each side)."""
    items = []
    for owner, ns in sorted(counts.values(), key=lambda c: c[0].sort_key):
        n = " → ".join(str(c) for c in ns)
        c = colours[owner.key]
        items.append((f"{owner.label}: {n} GPU{'s' if ns[-1] != 1 else ''}", c.fill, c.stroke, False))
    return items


def _counts(sides: list[list[GpuView]]) -> dict[str, tuple[OwnerView, list[int]]]:
    """owner key -> (owner, how many GPUs it has on each side)."""
    counts: dict[str, tuple[OwnerView, list[int]]] = {}
    for side, views in enumerate(sides):
        for v in views:
            _, ns = counts.setdefault(v.owner.key, (v.owner, [0] * len(sides)))
            ns[side] += 1
    return counts


def render_svg(report: TopoReport, title: str | None = None, max_width: float = MAX_WIDTH) -> str:
    """One host's tree as an SVG document (text)."""
    views = gpu_views(report.tree)
    colours = palette.assign(v.owner for v in views)
    title = title or f"{report.hostname or 'host'} · PCIe topology · {len(views)} GPUs"
    inner = max_width - 2 * MARGIN
    cols = [
        column(r, lambda n: gpu_lines(n.gpu, colours[n.gpu.owner.key]) if n.gpu else node_lines(n))
        for r in report.tree
    ]
    items = _owner_items(_counts([views]), colours)
    kinds = {n.kind for r in report.tree for n in r.walk()}
    for kind, label in (("nvswitch", "NVSwitch"), ("nic", "network adapter"), ("nvme", "NVMe drive")):
        if kind in kinds:
            items.append((label, *palette.NODE_COLOURS[kind], False))
    legend, lw, lh = _legend(items, MARGIN, MARGIN + TITLE + 10, inner)
    top = MARGIN + TITLE + 10 + lh + 14
    panel = place(cols, MARGIN, top, inner)
    body = [
        _text(MARGIN, MARGIN + TITLE - 3, Line(title, bold=True), size=TITLE),
        *legend,
        *_panel_svg(panel, colours, set()),
    ]
    width = max(panel.width, text_width(title) * TITLE / FONT, lw) + 2 * MARGIN
    return _document(body, width, top + panel.height + MARGIN, title)


def moves(before: TopoReport, after: TopoReport) -> dict[str, tuple[str, str]]:
    """address -> (line under the GPU before, line after) for every GPU whose owner or driver
    the plan changes."""
    old = {v.address: v for v in gpu_views(before.tree)}
    out: dict[str, tuple[str, str]] = {}
    for v in gpu_views(after.tree):
        b = old.get(v.address)
        if b is None:
            continue
        if b.owner.key != v.owner.key:
            out[v.address] = (f"→ {v.owner.label}", f"← from {b.owner.label}")
        elif b.driver != v.driver:
            out[v.address] = (f"→ driver {v.driver}", f"← driver was {b.driver or 'none'}")
    return out


def render_plan_svg(
    before: TopoReport,
    after: TopoReport,
    title: str | None = None,
    max_width: float = PLAN_WIDTH,
    groups: dict[str, str] | None = None,
) -> str:
    """The host now (left) and after the plan (right), side by side with one legend; what moves
    is outlined in dashed red on both sides and says where it goes. ``groups``: owner key -> why
    it gets its GPUs (the plan's placement lines), each shown under the legend in the owner's
    colours. Shown at most ``max_width`` wide (drawn at most :data:`SCALE_LIMIT` times as wide,
    "after the plan" below "now" when the sides do not fit side by side)."""
    moved = moves(before, after)
    views_b, views_a = gpu_views(before.tree), gpu_views(after.tree)
    colours = palette.assign(v.owner for v in [*views_b, *views_a])
    title = title or (
        f"{before.hostname or 'host'} · PCIe topology · {len(views_b)} GPUs · "
        f"{len(moved)} change{'s' if len(moved) != 1 else ''}"
    )

    def lines(n: TreeNode, side: int) -> list[Line]:
        if n.gpu is None:
            return node_lines(n)
        move = moved.get(n.gpu.address)
        return gpu_lines(n.gpu, colours[n.gpu.owner.key], move[side] if move else None)

    cols_b = [column(r, lambda n: lines(n, 0)) for r in before.tree]
    cols_a = [column(r, lambda n: lines(n, 1)) for r in after.tree]
    for cb, ca in zip(cols_b, cols_a):
        widen([cb, ca], max(cb.width, ca.width))
    items = _owner_items(_counts([views_b, views_a]), colours)
    items.append(("moves (dashed)", "#ffffff", palette.MOVE, True))
    if any(n.kind == "nvswitch" for r in before.tree for n in r.walk()):
        items.append(("NVSwitch", *palette.NODE_COLOURS["nvswitch"], False))
    # drawn up to SCALE_LIMIT times as wide as it is shown: 12 px text shows at 10 px or more
    drawn = max_width * SCALE_LIMIT
    inner = drawn - 2 * MARGIN
    legend, lw, lh = _legend(items, MARGIN, MARGIN + TITLE + 10, inner)
    why, ww, wh = _groups(groups or {}, colours, MARGIN, MARGIN + TITLE + 10 + lh + 8, inner)
    lw, lh = max(lw, ww), lh + (wh + 8 if wh else 0)
    heads = MARGIN + TITLE + 10 + lh + 14
    head = [_text(MARGIN, MARGIN + TITLE - 3, Line(title, bold=True), size=TITLE), *legend, *why]
    least = max(text_width(title) * TITLE / FONT, lw) + 2 * MARGIN
    body, width, height = _sides(cols_b, cols_a, colours, set(moved), heads, inner, stacked=False)
    if width > drawn:
        body, width, height = _sides(cols_b, cols_a, colours, set(moved), heads, inner, stacked=True)
    return _document([*head, *body], max(width, least), height + MARGIN, title, shown=max_width)


def _sides(
    cols_b: list, cols_a: list, colours, moved: set[str], heads: float, inner: float, stacked: bool
) -> tuple[list[str], float, float]:
    """The two sides from ``heads`` down: (SVG elements, width, height). Side by side, each
    side's columns wrap within half of ``inner``; ``stacked``, "after the plan" is below "now"
    and each wraps within all of it."""
    top = heads + LINE + 8
    if not stacked:
        half = (inner - PANEL_GAP) / 2
        left = place(cols_b, MARGIN, top, half)
        after_x, after_head = MARGIN + left.width + PANEL_GAP, heads
        right = place(cols_a, after_x, top, half)
        sep = after_x - PANEL_GAP / 2
        height = top + max(left.height, right.height)
        rule = f"M{_n(sep)} {_n(heads)}L{_n(sep)} {_n(height)}"
    else:
        left = place(cols_b, MARGIN, top, inner)
        after_x, after_head = MARGIN, top + left.height + PANEL_GAP
        right = place(cols_a, MARGIN, after_head + LINE + 8, inner)
        sep = after_head - PANEL_GAP / 2
        height = after_head + LINE + 8 + right.height
        rule = f"M{_n(MARGIN)} {_n(sep)}L{_n(MARGIN + max(left.width, right.width))} {_n(sep)}"
    body = [
        _text(MARGIN, heads + BASELINE, Line("now", bold=True), size=FONT + 2),
        _text(after_x, after_head + BASELINE, Line("after the plan", bold=True), size=FONT + 2),
        f'<path class="separator" d="{rule}" stroke="#d1d5db" stroke-width="1"/>',
        '<g class="panel" data-side="before">',
        *_panel_svg(left, colours, moved),
        "</g>",
        '<g class="panel" data-side="after">',
        *_panel_svg(right, colours, moved),
        "</g>",
    ]
    width = (right.width if not stacked else max(left.width, right.width)) + after_x + MARGIN
    return body, width, height
