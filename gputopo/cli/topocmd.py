"""``gputopo topo``: the host's PCIe tree with each GPU's owner, the distance matrix, pictures."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click


@click.command()
@click.option("--root", default="/", show_default=True, type=click.Path(),
              help="Host root holding sys/ and proc/, or a gputopo snapshot .tar.gz.")
@click.option("--pve-root", default="/etc/pve", show_default=True, type=click.Path(file_okay=False),
              help="Proxmox's config tree: who owns each GPU (containers, VM mappings).")
@click.option("--sim", default=None, type=click.Path(file_okay=False),
              help="Show the simulated host in DIR (its root and its /etc/pve).")
@click.option("--node", default=None, help="Proxmox node name (default: the host's name).")
@click.option("--matrix", is_flag=True, help="The GPU-to-GPU PCIe distance matrix instead of the tree.")
@click.option("--format", "fmt", type=click.Choice(["text", "svg", "dot"]), default="text", show_default=True,
              help="text: the tree (or --matrix); svg: a picture; dot: Graphviz text.")
@click.option("--json", "as_json", is_flag=True, help="The tree and the matrix as JSON (gputopo schema topo).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None, help="Write here (default stdout).")
def topo(root, pve_root, sim, node, matrix, fmt, as_json, output):
    """Show the PCIe tree: NUMA node, host bridge, root port, switches, and each GPU with its
    companions and owner (container, VM mapping or free); identical GPUs are never merged.

    Exit codes: 0, or 2 for a root that is empty, damaged or not a sysfs tree, or a bad option.
    """
    from gputopo.errors import ConfigError, RootError
    from gputopo.facts.discover import discover
    from gputopo.facts.guests import read_node_guests
    from gputopo.facts.snapshot import opened_root
    from gputopo.topo.owners import owners_now
    from gputopo.topo.tree import build_report, unplaced

    if as_json and fmt != "text":
        raise ConfigError(f"--json and --format {fmt} exclude each other")
    if sim:
        from click.core import ParameterSource

        from gputopo.sim.host import SimHost

        ctx = click.get_current_context()
        for name in ("root", "pve_root"):
            if ctx.get_parameter_source(name) != ParameterSource.DEFAULT:
                raise ConfigError(f"--{name.replace('_', '-')} and --sim exclude each other "
                                  "(a simulated host has its own)")
        host = SimHost.open(sim)
        root, pve_root, node = str(host.paths.root), str(host.paths.pve), node or host.node
    with opened_root(root) as r:
        facts = discover(r)
        if not os.listdir(os.path.join(r, "sys/bus/pci/devices")):
            raise RootError(root, "no PCI functions under sys/bus/pci/devices")
    lost = unplaced(facts)
    if lost:
        raise RootError(root, f"{lost[0]}: sys/bus/pci/devices entry does not lead into sys/devices")
    node = node or (facts.host.hostname or "").split(".")[0]
    report = build_report(facts, owners_now(facts, read_node_guests(pve_root, node), node))

    if as_json:
        text = report.model_dump_json(by_alias=True, indent=2) + "\n"
    elif fmt == "svg":
        from gputopo.topo.svg import render_svg

        text = render_svg(report)
    elif fmt == "dot":
        from gputopo.topo.dot import render_dot

        text = render_dot(report)
    elif matrix:
        from gputopo.cli.topoview import matrix_text

        text = matrix_text(report)
    else:
        _print_tree(report, output)
        return
    _emit(text, output)


def write_output(path: Path, text: str) -> None:
    """Write a file the operator named. Raises OutputError (one line, exit 2)."""
    from gputopo.errors import OutputError

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as e:
        raise OutputError(str(path), e) from None


def _emit(text: str, output: str | None) -> None:
    if output:
        write_output(Path(output), text)
        click.echo(f"wrote {output}", err=True)
    else:
        sys.stdout.write(text)


def _print_tree(report, output: str | None) -> None:
    from gputopo.cli.output import console
    from gputopo.cli.topoview import WIDTH, print_tree

    if output:
        from io import StringIO

        from rich.console import Console

        buf = StringIO()
        print_tree(report, Console(file=buf, width=WIDTH, color_system=None, highlight=False, soft_wrap=False))
        _emit(buf.getvalue(), output)
        return
    out = console()
    if not out.is_terminal:
        out.width = WIDTH
    print_tree(report, out)
