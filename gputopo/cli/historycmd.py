"""``gputopo history``: past applies from their journals; ``history show ID``: one with its steps."""

from __future__ import annotations

import click

from gputopo.cli.connect import Connection, connection_options
from gputopo.exitcodes import with_exit_codes
from gputopo.usecases.connect import host_root


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def _outcome(r) -> str:
    if r.outcome == "applied" and r.rolled_back:
        return "applied (after a rollback)"
    return r.outcome


@click.group(invoke_without_command=True)
@connection_options(api=False, node=False)
@click.option("--json", "as_json", is_flag=True, help="The list as JSON (gputopo schema history).")
@with_exit_codes("history")
@click.pass_context
def history(ctx: click.Context, conn: Connection, as_json: bool) -> None:
    """List past applies from their journals, oldest first: when, the spec's hash, the outcome,
    the stop window and whether it was rolled back. 'gputopo history show ID' prints one with
    its steps and their timings (ID: the first column, a unique prefix of it, or 'last')."""
    ctx.obj = dict(ctx.obj or {}, root=host_root(conn))
    if ctx.invoked_subcommand is not None:
        return
    from gputopo.usecases.history import history as read_history

    listed = read_history(ctx.obj["root"])
    records = listed.applies
    if as_json:
        from gputopo.cli.output import print_json

        print_json(listed)
        return
    if not records:
        click.echo(f"no apply recorded under {ctx.obj['root']}")
        return
    rows = [("ID", "STARTED", "SPEC", "OUTCOME", "STEPS", "STOP WINDOW")]
    for r in records:
        rows.append(
            (
                r.id,
                r.started_utc or "-",
                (r.spec_sha256 or "-")[:12],
                _outcome(r),
                f"{r.steps_done}/{r.steps_total}",
                _seconds(r.stop_window_s),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())


@history.command("show")
@click.argument(
    "ident", metavar="ID", shell_complete=lambda ctx, param, incomplete: _complete_ids(ctx, incomplete)
)
@connection_options(api=False, node=False)
@click.option("--json", "as_json", is_flag=True, help="The apply as JSON (gputopo schema history-entry).")
@click.pass_context
def show(ctx: click.Context, ident: str, conn: Connection, as_json: bool) -> None:
    """Print one apply: its header, then every step with its status, time and warnings, and
    what each undo did (ID: from 'gputopo history', a unique prefix, or 'last')."""
    from gputopo.usecases.history import entry

    root = host_root(conn) if (conn.root or conn.sim) else ctx.obj["root"]
    rec = entry(root, ident)
    if as_json:
        from gputopo.cli.output import print_json

        print_json(rec)
        return
    click.echo(f"apply {rec.id}  node {rec.node or '?'}  started {rec.started_utc}  pid {rec.pid}")
    click.echo(f"spec {rec.spec or '-'}  sha256 {rec.spec_sha256 or '-'}")
    verify = f", verify {rec.verify}" if rec.verify else ""
    reason = f" ({rec.reason})" if rec.reason else ""
    click.echo(
        f"outcome {_outcome(rec)}{reason}{verify}; {rec.steps_done} of {rec.steps_total} step(s) done; "
        f"stop window {_seconds(rec.stop_window_s)}; {_seconds(rec.wall_s)} in all"
    )
    for s in rec.steps or []:
        took = f" {s.seconds:.2f} s" if s.seconds is not None else ""
        click.echo(f"  {s.step:>2}. [{s.phase}] {s.description}: {s.status}{took}")
        for w in s.warnings:
            click.echo(f"      warning: {w}")
        if s.error:
            click.echo(f"      error: {s.error}")
        if s.undo:
            click.echo(f"      undo: {s.undo}")


def _complete_ids(ctx: click.Context, incomplete: str):
    from gputopo.cli.complete import complete_journal_ids

    return complete_journal_ids(ctx, incomplete)
