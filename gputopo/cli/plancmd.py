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

import dataclasses
import sys
from pathlib import Path

import click

from gputopo.cli.connect import Connection, host_root
from gputopo.cli.inputs import TEMPLATES_HELP, inputs, planned, spec_options, state_options
from gputopo.cli.output import print_refused, write_output
from gputopo.errors import GputopoError, PlanRefused
from gputopo.exitcodes import with_exit_codes


def _saving_conn(conn: Connection) -> Connection:
    """The connection ``plan -o`` reads through: the one apply will use (``--local`` by default).
    Raises ConfigError for a source apply cannot use (Proxmox's files, a snapshot)."""
    from gputopo.errors import ConfigError
    from gputopo.facts.snapshot import is_snapshot

    if conn.pve_root is not None:
        raise ConfigError(
            "-o: a saved plan is made from what apply reads (--sim, --api-url or --local), "
            "not from --pve-root"
        )
    if conn.root is not None and is_snapshot(conn.root):
        raise ConfigError(
            f"-o: {conn.root} is a snapshot; a saved plan is made on the host it will be applied to"
        )
    return conn if conn.live else dataclasses.replace(conn, local=True)


def _save(path: str, force: bool, conn: Connection, quick: dict, spec, facts, p, current, summary) -> None:
    from gputopo import __version__
    from gputopo.plan.saved import save_plan, spec_digest

    spec_file = quick.get("spec_file")
    source = f"sim {conn.sim}" if conn.sim else f"api {conn.api_url}" if conn.api_url else "local"
    saved = save_plan(
        p,
        spec,
        facts,
        current,
        version=__version__,
        spec_file=spec_file,
        spec_sha256=spec_digest(spec, spec_file),
        node=conn.node,
        source=source,
        summary=summary,
    )
    write_output(Path(path), saved.model_dump_json(indent=2) + "\n", force=force)
    click.echo(f"wrote {path}: apply it with '{_apply_line(path, conn)}'", err=True)


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
@with_exit_codes("plan")
def plan(conn: Connection, templates, as_json, svg, save_to, force, **quick):
    """Show the target state and the ordered actions ("No changes" when converged), then one
    line: how many rebinds, mapping changes and guest restarts, and the expected stop window.
    """
    from gputopo.cli.output import print_plan, refuse_existing

    if save_to:
        refuse_existing(Path(save_to), force)  # before anything is read: an answer in seconds
        conn = _saving_conn(conn)
    facts, spec, p, current = planned(conn, quick, templates)
    from gputopo.apply.estimate import plan_summary

    summary = None if p.is_empty else plan_summary(spec, p, host_root(conn)).to_data()
    if svg:
        from gputopo.cli.topoview import plan_svg

        write_output(Path(svg), plan_svg(facts, current, p))
    if save_to:
        _save(save_to, force, conn, quick, spec, facts, p, current, summary)
    print_plan(p, summary, as_json)


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
    from gputopo.plan.diff import diff as make_diff

    try:
        facts, spec, current = inputs(conn, quick)
        report = make_diff(facts, spec, current, node=conn.node, templates=templates)
    except PlanRefused as e:
        print_refused(e)
        sys.exit(1 if exit_code else e.exit_code)
    except GputopoError as e:
        if not exit_code:
            raise
        exit_with_error(e, 1)
    print_diff(report, as_json, exit_code)
