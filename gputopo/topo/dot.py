"""The topology as Graphviz DOT text (``gputopo topo --format dot``). Pure; no Graphviz needed here.

One cluster per NUMA node; bridges, switches, GPUs and NVSwitches are boxes joined parent to
child; GPUs are filled with their owner's colour (:mod:`gputopo.topo.palette`) and a legend
cluster names the colours. ``dot -Tsvg`` or ``-Tpng`` draws it wherever Graphviz is installed.
"""

from __future__ import annotations

from gputopo.topo import palette
from gputopo.topo.model import TopoReport, TreeNode
from gputopo.topo.svg import gpu_lines, node_lines
from gputopo.topo.tree import gpu_views


def quote(text: str) -> str:
    """``text`` as a DOT double-quoted string (backslashes and quotes escaped, newlines \\n)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _label(lines) -> str:
    # \l ends a left-justified line in a DOT label
    body = "".join(ln.text.replace("\\", "\\\\").replace('"', '\\"') + "\\l" for ln in lines)
    return f'"{body}"'


def render_dot(report: TopoReport) -> str:
    """``report``'s tree as a DOT digraph (text)."""
    colours = palette.assign(v.owner for v in gpu_views(report.tree))
    ids: dict[int, str] = {}
    out = [
        f"digraph {quote(report.hostname or 'host')} {{",
        "  rankdir=LR;",
        '  node [shape=box, style="rounded,filled", fontname="monospace", fontsize=10, fillcolor="#ffffff"];',
        '  edge [color="#9ca3af", arrowhead=none];',
    ]

    def name(node: TreeNode) -> str:
        return ids.setdefault(id(node), f"n{len(ids)}")

    def emit(node: TreeNode, indent: str) -> None:
        if node.gpu is not None:
            c = colours[node.gpu.owner.key]
            out.append(
                f"{indent}{name(node)} [label={_label(gpu_lines(node.gpu, c))}, "
                f'fillcolor="{c.fill}", color="{c.stroke}", penwidth=1.5];'
            )
        else:
            fill, stroke = palette.NODE_COLOURS[node.kind]
            out.append(
                f'{indent}{name(node)} [label={_label(node_lines(node))}, fillcolor="{fill}", '
                f'color="{stroke}"];'
            )
        for child in node.children:
            emit(child, indent)
            out.append(f"{indent}{name(node)} -> {name(child)};")

    for i, root in enumerate(report.tree):
        fill, stroke = palette.NODE_COLOURS["numa"]
        out.append(f"  subgraph cluster_{i} {{")
        out.append(
            f"    label={quote(root.label + (f' · {root.detail}' if root.detail else ''))}; "
            f'style="rounded,filled"; fillcolor="#f9fafb"; color="{stroke}"; fontname="monospace";'
        )
        for child in root.children:
            emit(child, "    ")
        out.append("  }")
    out.append("  subgraph cluster_legend {")
    out.append('    label="owners"; style=rounded; color="#d1d5db"; fontname="monospace";')
    for i, o in enumerate(report.owners):
        c = colours[o.key]
        out.append(
            f'    legend{i} [label={quote(f"{o.label}: {o.gpus}")}, fillcolor="{c.fill}", '
            f'color="{c.stroke}"];'
        )
    out.append("  }")
    out.append("}")
    return "\n".join(out) + "\n"
