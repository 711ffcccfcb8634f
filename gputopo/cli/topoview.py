"""Output of ``gputopo topo``: the tree for a terminal (rich), the matrix as text, the plan picture.

The tree fits 80 columns: every line is cut with an ellipsis rather than wrapped, a host bridge
with a single root port shares its line, and labels are short. Owners are colours in a
terminal; piped, the same text comes without escape codes.
"""

from __future__ import annotations

from gputopo.topo import palette
from gputopo.topo.model import TopoReport, TreeNode
from gputopo.topo.tree import gpu_views

WIDTH = 80


def _label(node: TreeNode, colours: dict[str, palette.Colour]):
    from rich.text import Text

    if node.gpu is None:
        text = Text(node.label, style="bold" if node.kind in ("numa", "switch", "nvswitch") else "")
        if node.detail and node.kind in ("nic", "nvme"):
            text.append(f"\n{node.detail}", style="dim")  # a model's name is long: a line of its own
        elif node.detail:
            text.append(f"  {node.detail}", style="dim" if node.kind != "numa" else "")
        return text
    v = node.gpu
    colour = colours[v.owner.key].term
    text = Text(f"GPU{v.index} {v.address}", style=f"bold {colour}")
    text.append("  ")
    text.append(v.owner.label, style=f"bold {colour} reverse" if v.owner.kind != "free" else colour)
    text.append(f"\n{v.model or '?'}")
    parts = [
        v.driver or "no driver",
        f"group {'-' if v.iommu_group is None else v.iommu_group}",
        f"minor {'-' if v.minor is None else v.minor}",
        v.link or "link unknown",
    ]
    if v.boot_vga:
        parts.append("boot VGA")
    text.append("\n" + " · ".join(parts), style="dim")
    for c in v.companions:
        what = c.role + (f", {c.driver}" if c.driver else "")
        text.append(f"\n+ {c.address} {what}", style="red" if c.role == "foreign" else "")
    return text


def _add(tree, node: TreeNode, colours: dict[str, palette.Colour]) -> None:
    from rich.text import Text

    children = node.children
    label = _label(node, colours)
    if node.kind == "host_bridge" and len(children) == 1 and children[0].kind == "root_port":
        # one root port under the host bridge: one line for both, one level less of indent
        label = Text(f"{node.label} · {children[0].label}")
        children = children[0].children
    label.no_wrap, label.overflow = True, "ellipsis"
    branch = tree.add(label)
    for c in children:
        _add(branch, c, colours)


def print_tree(report: TopoReport, console) -> None:
    """Print ``report``'s tree on ``console`` (a rich Console), owners as colours."""
    from rich.text import Text
    from rich.tree import Tree

    colours = palette.assign(v.owner for v in gpu_views(report.tree))
    n = sum(o.gpus for o in report.owners)
    head = Text(f"{report.hostname or 'host'} · {n} GPU{'s' if n != 1 else ''}:", style="bold")
    for o in report.owners:
        head.append("  ")
        head.append(f"{o.label} ({o.gpus})", style=colours[o.key].term)
    console.print(head)
    for root in report.tree:
        label = _label(root, colours)
        label.no_wrap, label.overflow = True, "ellipsis"
        tree = Tree(label, guide_style="bright_black")
        for c in root.children:
            _add(tree, c, colours)
        console.print(tree)
    for w in report.warnings:
        console.print(Text(f"warning: {w}", style="yellow"))


def matrix_text(report: TopoReport) -> str:
    """The distance matrix in ``nvidia-smi topo -m``'s layout (GPU rows and columns, then the
    network adapters'), its legend, the NIC legend and the GPU and NIC keys."""
    m = report.matrix
    if not m.gpus:
        return "no GPUs\n"
    names = [f"GPU{g.index}" for g in m.gpus]
    nics = [f"NIC{n.index}" for n in m.nics]
    cell = max(8, max(len(x) for x in names + nics) + 2)

    def cells(row: list[str]) -> str:
        return "".join((" X" if v == "X" else v).ljust(cell) for v in row)

    head = " " * cell + "".join(x.ljust(cell) for x in names + nics)
    lines = [head + "CPU Affinity".ljust(16) + "NUMA Affinity"]
    for i, (g, name, row) in enumerate(zip(m.gpus, names, m.levels)):
        numa = "N/A" if g.numa_node is None else str(g.numa_node)
        to_nics = [r[i] for r in m.nic_levels]
        lines.append(name.ljust(cell) + cells(row + to_nics) + (g.cpus or "N/A").ljust(16) + numa)
    for name, row in zip(nics, m.nic_levels):
        lines.append((name.ljust(cell) + cells(row)).rstrip())
    lines += ["", "Legend:", ""]
    lines += [f"  {k:<4} = {m.legend[k]}" for k in ("X", "SYS", "NODE", "PHB", "PXB", "PIX")]
    if m.nics:
        lines += ["", "NIC Legend:", ""]
        lines += [f"  {name}: {n.name}" for name, n in zip(nics, m.nics)]
    owners = {v.address: v.owner.label for r in report.tree for n in r.walk() if (v := n.gpu) is not None}
    lines += ["", "GPUs:", ""]
    for g, name in zip(m.gpus, names):
        minor = "-" if g.minor is None else g.minor
        lines.append(f"  {name:<{cell - 2}}{g.address}  minor {minor:<4}{owners.get(g.address, 'free')}")
    if m.nics:
        lines += ["", "NICs:", ""]
        for n, name in zip(m.nics, nics):
            numa = "N/A" if n.numa_node is None else n.numa_node
            rdma = "" if n.rdma else "  no RDMA device (nvidia-smi does not list it)"
            lines.append(f"  {name:<{cell - 2}}{n.address}  NUMA {numa}{rdma}")
    if m.notes:
        lines += ["", *[f"note: {n}" for n in m.notes]]
    return "\n".join(lines) + "\n"


def plan_svg(facts, current, plan) -> str:
    """The host now and after ``plan`` (a :class:`gputopo.plan.planner.Plan`) as one SVG."""
    from gputopo.topo.owners import mapping_users, owner_from_target, owners_now
    from gputopo.topo.svg import render_plan_svg
    from gputopo.topo.tree import build_report

    before = owners_now(facts, current, plan.node)
    after_facts = facts.model_copy(deep=True)
    users = mapping_users(current)
    after: dict[str, object] = {}
    for t in plan.target:
        after[t.address] = owner_from_target(t.owner, before[t.address], users)
        g = after_facts.gpu(t.address)
        if g is not None and t.driver and t.driver != g.driver:
            # the new minor is the driver's to choose at bind time; vfio-pci has none
            g.driver, g.minor = t.driver, None
    # the plan's placement lines ("container:101: 0000:3a:00.0, 3b: PIX under switch ..."), by owner
    groups = dict(line.split(": ", 1) for line in plan.placement if ": " in line)
    return render_plan_svg(build_report(facts, before), build_report(after_facts, after), groups=groups)
