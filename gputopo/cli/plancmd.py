"""``gputopo plan | diff``: the desired state and the difference (``render`` is in
:mod:`gputopo.cli.rendercmd`, ``init`` and ``export`` in :mod:`gputopo.cli.initcmd`).

Where the current state comes from:

* by default, Proxmox's files (``--pve-root``, default ``/etc/pve``; a missing one means nothing
  is configured yet) and the host files under ``--root``. Guests read from files count as
  running, and the inference service inside the container is not read (its drop-in always
  shows as to be written);
* with ``--sim DIR``, ``--api-url URL`` or ``--local``: the Proxmox API (guest status, configs,
  mappings) and ``pct exec`` into the container for the service, exactly as apply reads it.
  Quick mode (``--split``) then also finds the container's inference unit inside it, as
  ``init`` does.

``plan -o FILE`` saves the plan with the state it was made from for ``gputopo apply FILE``; it
reads the state as apply will (``--local`` when no source is named).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from gputopo.cli.connect import Connection
from gputopo.cli.inputs import TEMPLATES_HELP, source_of, spec_options, state_options
from gputopo.cli.output import print_refused, write_output
from gputopo.errors import GputopoError, PlanRefused
from gputopo.exitcodes import with_exit_codes


def _apply_line(path: str, conn: Connection) -> str:
    """The command that applies the plan saved in ``path`` where it was made: the simulated host
    or the API named (its credentials are the operator's to give again); --local is apply's
    default."""
    from shlex import join

    where = ["--sim", str(conn.sim)] if conn.sim else ["--api-url", conn.api_url] if conn.api_url else []
    return join(["gputopo", "apply", path, *where])


@click.command()
@spec_options
@state_options
@click.option("--templates", type=click.Path(file_okay=False, exists=True), default=None, help=TEMPLATES_HELP)
@click.option("--json", "as_json", is_flag=True, help="The plan as JSON (gputopo schema plan).")
@click.option(
    "--svg",
    "svg",
    type=click.Path(dir_okay=False),
    default=None,
    help="Also draw the host now and after the plan side by side into this SVG file.",
)
@click.option(
    "-o",
    "--out",
    "save_to",
    type=click.Path(dir_okay=False),
    default=None,
    help="Save the plan and the state it was made from for 'gputopo apply FILE' (gputopo schema "
    "saved-plan); the state is read as apply reads it (--local unless --sim or --api-url).",
)
@click.option("--force", is_flag=True, help="With -o: replace an existing file.")
@click.option(
    "--commands",
    "as_commands",
    is_flag=True,
    help="Instead of the plan, the shell commands of each step (pct, qm, pvesh, sysfs writes, "
    "files) in apply's order, then those of its undo in a rollback's order: to paste on the node.",
)
@click.option(
    "--no-ha",
    is_flag=True,
    help="The plan of 'gputopo apply --no-ha': the HA placement (rules on PVE 9, groups on PVE 8) "
    "left alone, no step for it.",
)
@with_exit_codes("plan")
def plan(conn: Connection, templates, as_json, svg, save_to, force, as_commands, no_ha, **quick):
    """Show the target state and the ordered actions ("No changes" when converged), then one
    line: how many rebinds, mapping changes and guest restarts, and the expected stop window.
    """
    from gputopo.cli.output import print_plan, refuse_existing
    from gputopo.errors import ConfigError
    from gputopo.usecases.plan import PlanRequest
    from gputopo.usecases.plan import plan as run_plan

    if as_commands and as_json:
        raise ConfigError("--commands and --json: choose one")
    if save_to:
        refuse_existing(Path(save_to), force)  # before anything is read: an answer in seconds
    try:
        res = run_plan(
            PlanRequest(conn, source_of(quick), templates, bool(save_to), as_commands, ha=not no_ha)
        )
    except PlanRefused as e:
        print_refused(e)
        sys.exit(e.exit_code)
    got = res.planned
    if svg:
        from gputopo.cli.topoview import plan_svg

        write_output(Path(svg), plan_svg(got.facts, got.current, got.plan))
    if save_to and res.saved is not None:
        write_output(Path(save_to), res.saved, force=force)
        click.echo(f"wrote {save_to}: apply it with '{_apply_line(save_to, res.conn)}'", err=True)
    if res.commands is not None:
        sys.stdout.write(res.commands)
        return
    print_plan(got.plan, res.summary, as_json)


@click.command()
@spec_options
@state_options
@click.option("--templates", type=click.Path(file_okay=False, exists=True), default=None, help=TEMPLATES_HELP)
@click.option(
    "--exit-code", "exit_code", is_flag=True, help="Exit 0: no difference, 2: differences, 1: error."
)
@click.option("--json", "as_json", is_flag=True, help="The difference as JSON (gputopo schema diff).")
@with_exit_codes("diff")
def diff(conn: Connection, templates, exit_code, as_json, **quick):
    """Show how the host differs from the spec, by area, files as unified diffs."""
    from gputopo.cli.output import exit_with_error, print_diff
    from gputopo.usecases.diff import DiffRequest
    from gputopo.usecases.diff import diff as make_diff

    try:
        report = make_diff(DiffRequest(conn, source_of(quick), templates))
    except PlanRefused as e:
        print_refused(e)
        sys.exit(1 if exit_code else e.exit_code)
    except GputopoError as e:
        if not exit_code:
            raise
        exit_with_error(e, 1)
    print_diff(report, as_json, exit_code)
