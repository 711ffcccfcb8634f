"""``gputopo apply`` and ``gputopo recover``: parse the options, make one use-case call, print.

``apply`` takes a spec (``--spec FILE``) or a saved plan (``gputopo apply plan.json``, written by
``plan -o``: exactly those steps, refused when the host moved since). It shows the plan, asks for
confirmation (``--yes`` skips it), then applies and verifies (:mod:`gputopo.usecases.apply`);
progress is plain lines off a terminal and styled ones on it (:mod:`gputopo.cli.progress`). It ends with ``gputopo
verify``, and, when boot persistence changed, says what must run before a reboot (or runs it
with ``--refresh-boot``). ``recover`` settles the journal of an apply that was interrupted.
A step that succeeded with warnings (a Proxmox task ending ``WARNINGS: N``, a guest stopped by
force) shows them after its line. With ``--json`` the steps go to stderr and one document
(``gputopo schema apply``, every step's warnings included) to stdout.

Both write sysfs and run ``pct`` on this machine: the library refuses (exit 2, nothing changed)
an API whose node is not this host (:func:`gputopo.apply.preflight.refuse_other_node`, recover's
:func:`gputopo.apply.preflight.check_recover_node`). The JSON document and which node a recover
acts on (the open journal's) are the library's too (:mod:`gputopo.usecases.apply`,
:mod:`gputopo.usecases.recover`).
"""

from __future__ import annotations

import sys

import click

from gputopo.cli.connect import Connection, connection_options
from gputopo.cli.params import timeout_option
from gputopo.exitcodes import with_exit_codes


def _progress(stream=None, timeouts=None):
    """The progress display: plain lines off a terminal, styled ones on it."""
    from gputopo.cli.progress import display

    return display(timeouts, stream)


def _confirmer(yes: bool, as_json: bool):
    """What asks before the host changes: the plan shown, then yes (``--yes``) or the
    operator's answer. Raises ConfigError when stdin is not a terminal and ``--yes`` is not given."""

    def confirm(p) -> bool:
        click.echo(p.to_text(), nl=False, err=as_json)
        if yes:
            return True
        if not sys.stdin.isatty():
            from gputopo.errors import ConfigError

            raise ConfigError(
                "refusing to change the host without confirmation: pass --yes (stdin is not a terminal)"
            )
        return click.confirm("Apply these changes?", default=False, err=as_json)

    return confirm


@click.command()
@click.argument("plan_file", metavar="[PLANFILE]", required=False, type=click.Path(dir_okay=False))
@click.option(
    "--spec", "spec_file", type=click.Path(dir_okay=False), help="Spec file (instead of a saved plan)."
)
@connection_options()
@click.option("--dry-run", is_flag=True, help="Show the plan; change nothing.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask before changing the host.")
@timeout_option("apply")
@click.option("--rollback-on-verify-failure", is_flag=True, help="Roll back when verification finds a FAIL.")
@click.option("--no-verify", is_flag=True, help="Do not run verify after applying.")
@click.option(
    "--no-ha",
    is_flag=True,
    help="Leave the cluster's HA placement (rules on PVE 9, groups on PVE 8) alone: not read, not written.",
)
@click.option(
    "--refresh-boot",
    is_flag=True,
    help="When boot persistence changed, run update-initramfs -u -k all (and proxmox-boot-tool "
    "refresh where the host uses it) instead of only saying so.",
)
@click.option(
    "--expect-plan",
    default=None,
    metavar="SIGNATURE",
    help="Refuse (exit 2, nothing changed) unless the plan has this signature (gputopo plan --json "
    "and gputopo cluster plan show it).",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="One JSON document on stdout (gputopo schema apply): each step's result and time; "
    "the plan and progress go to stderr.",
)
@with_exit_codes("apply")
def apply(
    plan_file: str | None,
    spec_file: str | None,
    conn: Connection,
    dry_run: bool,
    yes: bool,
    timeouts,
    rollback_on_verify_failure: bool,
    no_verify: bool,
    no_ha: bool,
    refresh_boot: bool,
    expect_plan: str | None,
    as_json: bool,
) -> None:
    """Apply the spec, or a plan saved with 'gputopo plan -o PLANFILE': preflight, lock,
    journaled steps, rollback on any failure, then verify.

    A saved plan is applied exactly, and only while the host is what it was made from; when
    anything moved since, apply names it and changes nothing (exit 2).
    """
    from gputopo.errors import GputopoError
    from gputopo.usecases.apply import ApplyCommand, error_document, open_apply, run_opened

    cmd = ApplyCommand(
        conn,
        plan_file,
        spec_file,
        dry_run,
        _confirmer(yes, as_json),
        lambda t: _progress(sys.stderr if as_json else None, t),
        timeouts,
        rollback_on_verify_failure,
        not no_verify,
        not no_ha,
        refresh_boot,
        expect_plan,
    )
    opened = open_apply(cmd)
    try:
        applied = run_opened(opened)
    except GputopoError as e:
        if as_json:
            from gputopo.cli.output import print_json

            print_json(error_document(e, root=opened.root))
        raise
    if applied.boot is not None and not applied.boot.ran:
        click.echo(
            f"boot persistence changed: before the next reboot run: {applied.boot.text()} "
            "(or apply with --refresh-boot)",
            err=True,
        )
    _finish(applied, as_json)


def _finish(applied, as_json: bool) -> None:
    """Print how the apply ended (the document with ``--json``); raise VerifyFailed when its
    verification failed."""
    from gputopo.usecases.apply import document, verify_failure

    result = applied.result
    if as_json:
        from gputopo.cli.output import print_json

        if result.status in ("no-changes", "dry-run"):  # the plan for the human reading stderr
            click.echo(result.plan.to_text() if result.plan else "No changes", nl=False, err=True)
        print_json(document(applied))
    elif result.status in ("no-changes", "dry-run"):
        click.echo(result.plan.to_text() if result.plan else "No changes", nl=False)
    elif result.verify is not None:
        from gputopo.cli.output import print_report

        print_report(result.verify)
    if not as_json and result.verify_stopped is not None:
        from gputopo.usecases.apply import verify_stopped_line

        click.echo(f"gputopo: {verify_stopped_line(result)}", err=True)
    failed = verify_failure(result)
    if failed is not None:
        raise failed


@click.command()
@connection_options()
@click.option("--finish", is_flag=True, help="Complete the interrupted apply instead of rolling it back.")
@click.option(
    "--dry-run",
    is_flag=True,
    help="Show what recover would do (the undo steps in order, the guests and services it would "
    "start); change nothing.",
)
@timeout_option("recover")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="One JSON document on stdout (gputopo schema apply); progress goes to stderr.",
)
@with_exit_codes("recover")
def recover(conn: Connection, finish: bool, dry_run: bool, timeouts, as_json: bool) -> None:
    """Settle an apply that was interrupted (crash, kill, power loss) from its journal.

    By default every step it began is undone from the journal and what ran before is started
    again: the journal's before-state is a host that was known to work. --finish completes the
    remaining steps instead (and rolls back if one fails).

    An apply whose rollback needed a human (a write hung, a GPU fell off the bus) leaves its
    journal open; once the device is fixed, recover retries the undo steps that did not
    complete and closes it, or keeps it open and names what is still stuck (exit 3).

    With no open journal it changes nothing and says so, whether or not the Proxmox API
    answers. An API that does not answer after a crash is warned about when the journal names
    this host: the sysfs and host-file steps are undone, the steps that need the API are named
    and the journal stays open for a recover once it answers (over --api-url the login itself
    needs the API: use --local on the node).
    """
    from gputopo.errors import GputopoError
    from gputopo.usecases.apply import error_document
    from gputopo.usecases.recover import RecoverCommand, document, open_recover, run_opened

    progress = lambda t: _progress(sys.stderr if as_json else None, t)  # noqa: E731
    opened = open_recover(RecoverCommand(conn, finish, dry_run, timeouts, progress))
    try:
        result = run_opened(opened)
    except GputopoError as e:
        if as_json:
            from gputopo.cli.output import print_json

            print_json(error_document(e, opened.root, recover=True))
        raise
    if as_json:
        from gputopo.cli.output import print_json

        print_json(document(result))
    elif result.status == "nothing-to-recover":
        click.echo("No unfinished apply: nothing to recover")
    elif result.status == "dry-run":
        click.echo(f"recover would settle {result.journal}:")
        for i, line in enumerate(result.would, 1):
            click.echo(f"  {i:>2}. {line}")
        click.echo("Nothing was changed (dry run).")
    else:
        click.echo(f"{result.status}: {result.journal}")
