"""``gputopo fixtures list|build``: the shipped host descriptions and the tree builder."""

from __future__ import annotations

import click

from gputopo.exitcodes import with_exit_codes


@click.group()
@with_exit_codes("fixtures")
def fixtures() -> None:
    """Host fixtures: compact descriptions built into real-layout sysfs/procfs roots."""


@fixtures.command("list")
def list_() -> None:
    """List the shipped host descriptions."""
    from gputopo.sim.hostroot import list_hosts, load_host

    for name in list_hosts():
        click.echo(f"{name:14} {load_host(name).description}")


@fixtures.command()
@click.argument("name")
@click.argument("dest", type=click.Path(file_okay=False))
def build(name: str, dest: str) -> None:
    """Build host NAME (or a .yaml path) as a root under DEST (must be empty or absent)."""
    from pathlib import Path

    from gputopo.sim.hostroot import materialize

    root = materialize(name, Path(dest))
    click.echo(str(root))
