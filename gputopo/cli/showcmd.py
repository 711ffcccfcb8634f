"""``gputopo show PLANFILE``: a plan saved with ``plan -o`` printed as ``plan`` printed it
(terraform's ``show``), its summary line included, or with ``--json`` as ``plan --json`` did.

Reads the file only, never the host: what the plan was made from is in it. A file edited since
it was written is refused as ``apply PLANFILE`` refuses it (exit 2, naming what was edited)."""

from __future__ import annotations

import click

from gputopo.exitcodes import with_exit_codes


@click.command()
@click.argument("plan_file", metavar="PLANFILE", type=click.Path(dir_okay=False))
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="The plan as JSON, as plan --json prints it (gputopo schema plan).",
)
@with_exit_codes("show")
def show(plan_file: str, as_json: bool) -> None:
    """Print a plan saved with 'gputopo plan -o PLANFILE' as plan printed it; a file edited since
    is refused."""
    from gputopo.cli.output import print_plan
    from gputopo.usecases.show import show as read_shown

    plan, summary = read_shown(plan_file)
    print_plan(plan, summary, as_json)
