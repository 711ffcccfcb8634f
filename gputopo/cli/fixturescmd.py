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
    from gputopo.usecases.fixtures import fixtures as shipped

    for name, description in shipped():
        click.echo(f"{name:14} {description}")


@fixtures.command()
@click.argument("name")
@click.argument("dest", type=click.Path(file_okay=False))
def build(name: str, dest: str) -> None:
    """Build host NAME (or a .yaml path) as a root under DEST (must be empty or absent)."""
    from gputopo.usecases.fixtures import build as materialize

    root = materialize(name, dest)
    click.echo(str(root))
