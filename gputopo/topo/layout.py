"""Where each box of a topology picture goes: a layout in which boxes cannot overlap. Pure.

Each NUMA node is a column drawn as an indented tree: every node gets its own row (a box as tall
as its lines of text), children are indented under their parent and joined to it by a line in the
indent. Rows never share a vertical range within a column, and columns never share a horizontal
range, so no two boxes overlap by construction (the tests check it anyway). Columns flow left to
right and wrap when the next one would pass ``max_width``, as words do on a page.

Box sizes come from the text: a monospace font of :data:`FONT` pixels whose glyphs are
:data:`CHAR_W` wide (DejaVu Sans Mono's advance is 0.602 em; a little more leaves room for
other monospace fonts).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gputopo.topo.model import TreeNode

FONT = 12
CHAR_W = FONT * 0.62
LINE = 15
PAD_X, PAD_Y = 8, 5
INDENT = 14
ROW_GAP = 6
COL_GAP = 24
BASELINE = 11  # from a line's top to its text baseline


@dataclass(frozen=True)
class Line:
    """One line of text in a box."""

    text: str
    bold: bool = False
    colour: str | None = None


@dataclass
class Box:
    """A placed node: its rectangle, its text and what it stands for."""

    node: TreeNode
    depth: int
    lines: list[Line]
    x: float = 0
    y: float = 0
    w: float = 0
    h: float = 0


@dataclass
class Column:
    """One NUMA node's indented tree, laid out at (0, 0) until placed."""

    root: TreeNode
    boxes: list[Box] = field(default_factory=list)
    edges: list[tuple[int, int]] = field(default_factory=list)  # (parent box, child box) indices
    width: float = 0
    height: float = 0


@dataclass
class Panel:
    """Placed columns: every box and connector in absolute coordinates."""

    boxes: list[Box] = field(default_factory=list)
    segments: list[tuple[float, float, float, float]] = field(default_factory=list)
    width: float = 0
    height: float = 0


def text_width(text: str) -> float:
    """The width ``text`` takes at :data:`FONT` in the monospace font."""
    return len(text) * CHAR_W


def box_size(lines: Sequence[Line]) -> tuple[float, float]:
    """(width, height) of a box holding ``lines``, padding included."""
    w = max((text_width(ln.text) for ln in lines), default=0) + 2 * PAD_X
    return w, len(lines) * LINE + 2 * PAD_Y


def column(root: TreeNode, lines_of: Callable[[TreeNode], list[Line]]) -> Column:
    """Lay out ``root``'s tree as rows, depth-first; every box reaches the column's right edge."""
    col = Column(root=root)

    def visit(node: TreeNode, depth: int, parent: int | None) -> None:
        me = len(col.boxes)
        col.boxes.append(Box(node=node, depth=depth, lines=lines_of(node)))
        if parent is not None:
            col.edges.append((parent, me))
        for child in node.children:
            visit(child, depth + 1, me)

    visit(root, 0, None)
    y = 0.0
    for b in col.boxes:
        w, b.h = box_size(b.lines)
        b.x, b.y = b.depth * INDENT, y
        col.width = max(col.width, b.x + w)
        y += b.h + ROW_GAP
    col.height = y - ROW_GAP
    for b in col.boxes:
        b.w = col.width - b.x
    return col


def widen(columns: Sequence[Column], width: float) -> None:
    """Make ``columns`` (laid out by :func:`column`) ``width`` wide, when that is wider."""
    for col in columns:
        if width > col.width:
            col.width = width
            for b in col.boxes:
                b.w = width - b.x


def place(columns: Sequence[Column], x0: float, y0: float, max_width: float) -> Panel:
    """Put ``columns`` left to right from (x0, y0), wrapping before one would end past
    ``x0 + max_width`` (a column wider than that gets a row of its own)."""
    panel = Panel()
    x, y, row_h = x0, y0, 0.0
    for col in columns:
        if x > x0 and x + col.width > x0 + max_width:
            x, y, row_h = x0, y + row_h + COL_GAP, 0.0
        placed = []
        for b in col.boxes:
            nb = Box(node=b.node, depth=b.depth, lines=b.lines, x=x + b.x, y=y + b.y, w=b.w, h=b.h)
            placed.append(nb)
            panel.boxes.append(nb)
        for parent, child in col.edges:
            p, c = placed[parent], placed[child]
            rail = p.x + INDENT / 2
            mid = c.y + min(c.h / 2, PAD_Y + LINE / 2)
            panel.segments.append((rail, p.y + p.h, rail, mid))
            panel.segments.append((rail, mid, c.x, mid))
        panel.width = max(panel.width, x + col.width - x0)
        row_h = max(row_h, col.height)
        x += col.width + COL_GAP
    panel.height = (y + row_h - y0) if columns else 0.0
    return panel
