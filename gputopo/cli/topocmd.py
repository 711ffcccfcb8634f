"""``gputopo topo``: the host's PCIe tree with each GPU's owner, the distance matrix, pictures."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from gputopo.cli.connect import Connection, connection_options
from gputopo.cli.output import write_output
from gputopo.exitcodes import with_exit_codes


@click.command()
@connection_options(snapshot=True, pve_root=True, sim=True, api=False)
@click.option(
    "--matrix",
    is_flag=True,
    help="The PCIe distance matrix of the GPUs and network adapters (nvidia-smi topo -m's levels) "
    "instead of the tree.",
)
@click.option(
    "--all",
    "every",
    is_flag=True,
    help="Show network adapters and NVMe drives in the tree too, under their root ports and switches.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "svg", "dot"]),
    default="text",
    show_default=True,
    help="text: the tree (or --matrix); svg: a picture; dot: Graphviz text.",
)
@click.option(
    "--json", "as_json", is_flag=True, help="The tree and the matrix as JSON (gputopo schema topo)."
)
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False), default=None, help="Write here (default stdout)."
)
@with_exit_codes("topo")
def topo(conn: Connection, matrix, every, fmt, as_json, output):
    """Show the PCIe tree: NUMA node, host bridge, root port, switches, and each GPU with its
    companions and owner (container, VM mapping or free); identical GPUs are never merged.
    With --all, the network adapters and NVMe drives too, where they sit in the same tree.
    Owners come from Proxmox's files (--pve-root, or the simulated host's with --sim).
    """
    from gputopo.errors import ConfigError
    from gputopo.usecases.topo import TopoRequest
    from gputopo.usecases.topo import topo as read_topo

    if as_json and fmt != "text":
        raise ConfigError(f"--json and --format {fmt} exclude each other")
    report = read_topo(TopoRequest(conn, every))

    if as_json:
        import json

        from gputopo.model.documents import versioned

        text = json.dumps(versioned(report.model_dump(mode="json", by_alias=True)), indent=2) + "\n"
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
        print_tree(
            report, Console(file=buf, width=WIDTH, color_system=None, highlight=False, soft_wrap=False)
        )
        _emit(buf.getvalue(), output)
        return
    out = console()
    if not out.is_terminal:
        out.width = WIDTH
    print_tree(report, out)
