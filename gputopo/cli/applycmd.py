"""``gputopo apply`` and ``gputopo recover``: build the ports, make one library call, print.

``apply`` shows the plan, asks for confirmation (``--yes`` skips it), then runs
:func:`gputopo.apply.apply`; progress is styled lines (rich) with the open stop window on a
terminal, and plain lines otherwise (logs, pipes).
It ends with ``gputopo verify`` when that is installed. ``recover`` settles the journal of an
apply that was interrupted (rollback by default, ``--finish`` to complete it).
"""

from __future__ import annotations

import sys
import time

import click

from gputopo.cli.connect import Connection, build_ports, connection_options, host_root
from gputopo.cli.params import Finite


def _progress(stream=None):
    from gputopo.apply import PlainProgress

    if not sys.stdout.isatty():
        return PlainProgress(stream)
    return _RichProgress()


class _RichProgress:
    """Each step as a line with its time; the stop window while it is open."""

    def __init__(self):
        from gputopo.cli.output import console

        self.out = console()
        self.t_stop: float | None = None

    def plan(self, p) -> None: ...

    def step_begin(self, index, total, action) -> None:
        if action.phase == "stop" and self.t_stop is None:
            self.t_stop = time.monotonic()
        self.out.print(f"[dim][{index + 1:>2}/{total}][/] {action.phase:<7} {action.describe()} ...", markup=True)

    def step_end(self, index, total, action, status, seconds) -> None:
        style = "green" if status == "done" else "bold red"
        window = ""
        if self.t_stop is not None:
            window = f"  [dim](stop window {time.monotonic() - self.t_stop:.1f} s)[/]"
        self.out.print(f"[dim][{index + 1:>2}/{total}][/] {action.phase:<7} {action.describe()}: "
                       f"[{style}]{status}[/] {seconds:.2f} s{window}", markup=True, highlight=False)

    def note(self, text) -> None:
        self.out.print(text, markup=False)

    def summary(self, result) -> None:
        window = f", stop window {result.stop_window_s:.1f} s" if result.stop_window_s is not None else ""
        self.out.print(f"[bold]{result.status}[/] in {result.wall_s:.1f} s{window}", markup=True)


def _verifier(spec, ports, root, node):
    try:
        from gputopo.verify import verify as run_verify
    except ImportError:
        return None
    return lambda: run_verify(spec, ports, root=root, node=node)


def _preflight_ports(conn: Connection, default_node: str | None):
    """build_ports for apply: an API that cannot be reached or refuses the login is a failed
    preflight (exit 2, nothing changed), as it is when apply's own preflight finds it."""
    from gputopo.errors import PreflightError, ProxmoxError

    try:
        return build_ports(conn, default_node=default_node)
    except ProxmoxError as e:
        raise PreflightError(f"cannot use the Proxmox API ({e}); nothing was changed") from None


@click.command()
@click.option("--spec", "spec_file", required=True, type=click.Path(dir_okay=False), help="Spec file.")
@connection_options()
@click.option("--dry-run", is_flag=True, help="Show the plan; change nothing.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask before changing the host.")
@click.option("--timeout", "sysfs_timeout", type=Finite(), default=30.0, show_default=True,
              help="Seconds one sysfs write may take; a write that takes longer leaves its device to a human.")
@click.option("--rollback-on-verify-failure", is_flag=True, help="Roll back when verification finds a FAIL.")
@click.option("--no-verify", is_flag=True, help="Do not run verify after applying.")
@click.option("--expect-plan", default=None, metavar="SIGNATURE",
              help="Refuse (exit 2, nothing changed) unless the plan has this signature (gputopo cluster plan "
                   "shows it per node).")
@click.option("--json", "as_json", is_flag=True,
              help="The result as JSON on stdout; the plan and progress go to stderr (needs --yes or --dry-run).")
def apply(spec_file: str, conn: Connection, dry_run: bool, yes: bool, sysfs_timeout: float,
          rollback_on_verify_failure: bool, no_verify: bool, expect_plan: str | None, as_json: bool) -> None:
    """Apply the spec: preflight, lock, journaled steps, rollback on any failure, then verify.

    Exit codes: 0 applied (or no changes), 1 failed and rolled back, 2 refused before anything
    changed, 3 a device needs a human, 4 another apply holds the lock.
    """
    from gputopo.apply import Timeouts, apply as run_apply
    from gputopo.plan.spec import load_spec

    spec = load_spec(spec_file)
    root = host_root(conn)
    default_node = spec.nodes[0].name if len(spec.nodes) == 1 else None
    ports = _preflight_ports(conn, default_node)
    if as_json:
        from gputopo.apply import PlainProgress

        progress = PlainProgress(sys.stderr)
    else:
        progress = _progress()

    def confirm(p) -> bool:
        click.echo(p.to_text(), nl=False, err=as_json)
        if yes:
            return True
        if not sys.stdin.isatty():
            from gputopo.errors import ConfigError

            raise ConfigError("refusing to change the host without confirmation: pass --yes (stdin is not a terminal)")
        return click.confirm("Apply these changes?", default=False)

    try:
        verifier = None if (no_verify or dry_run) else _verifier(spec, ports, root, conn.node)
        result = run_apply(spec, ports, root=root, dry_run=dry_run, confirm=confirm, progress=progress,
                           timeouts=Timeouts(sysfs=sysfs_timeout), verify=verifier,
                           rollback_on_verify_failure=rollback_on_verify_failure, spec_path=spec_file,
                           node=conn.node, expect_plan=expect_plan)
    finally:
        ports.close()
    if as_json:
        _print_result_json(result, conn.node)
        if result.status == "rolled-back" or (result.verify is not None and not getattr(result.verify, "ok", True)):
            sys.exit(1)
        return
    if result.status in ("no-changes", "dry-run"):
        click.echo(result.plan.to_text() if result.plan else "No changes", nl=False)
        return
    if result.verify is not None:
        from gputopo.cli.verifycmd import print_report

        print_report(result.verify)
    if result.status == "rolled-back":
        from gputopo.errors import VerifyFailed

        raise VerifyFailed("verification failed after apply; the host was rolled back")
    if result.verify is not None and not getattr(result.verify, "ok", True):
        from gputopo.errors import VerifyFailed

        raise VerifyFailed("applied, but verification failed (see above); 'gputopo recover' cannot undo a finished apply")


def _print_result_json(result, node) -> None:
    """What ``apply --json`` prints: the status, the plan's actions and signature, each step."""
    from gputopo.cli.output import print_json

    p = result.plan
    verify = result.verify
    print_json({
        "node": p.node if p is not None else node,
        "status": result.status,
        "changed": result.status in ("applied", "rolled-back"),
        "signature": p.signature() if p is not None else None,
        "actions": [a.describe() for a in p.actions] if p is not None else [],
        "steps": [{"index": s.index, "phase": s.phase, "text": s.text, "status": s.status,
                   "seconds": round(s.seconds, 3), "warnings": s.warnings} for s in result.steps],
        "wall_s": round(result.wall_s, 3),
        "stop_window_s": result.stop_window_s,
        "journal": result.journal,
        "verify": None if verify is None else {"ok": bool(getattr(verify, "ok", True)),
                                               "summary": verify.summary_line() if hasattr(verify, "summary_line") else ""},
    })


@click.command()
@connection_options()
@click.option("--finish", is_flag=True, help="Complete the interrupted apply instead of rolling it back.")
@click.option("--timeout", "sysfs_timeout", type=Finite(), default=30.0, show_default=True,
              help="Seconds one sysfs write may take.")
def recover(conn: Connection, finish: bool, sysfs_timeout: float) -> None:
    """Settle an apply that was interrupted (crash, kill, power loss) from its journal.

    By default every step it began is undone from the journal and what ran before is started
    again: the journal's before-state is a host that was known to work. --finish completes the
    remaining steps instead (and rolls back if one fails).

    An apply whose rollback needed a human (a write hung, a GPU fell off the bus) leaves its
    journal open; once the device is fixed, recover retries the undo steps that did not
    complete and closes it, or keeps it open and names what is still stuck (exit 3).

    Exit codes: 0 settled (or nothing to recover), 1 a step failed (rolled back where it could),
    2 bad input, 3 a device needs a human, 4 an apply holds the lock.
    """
    from gputopo.apply import Timeouts, recover as run_recover

    from gputopo.apply.journal import find_unfinished

    root = host_root(conn)
    unfinished = find_unfinished(root)
    ports = build_ports(conn, default_node=unfinished.header.node if unfinished else None)
    try:
        result = run_recover(ports, root=root, finish=finish, progress=_progress(), timeouts=Timeouts(sysfs=sysfs_timeout))
    finally:
        ports.close()
    if result.status == "nothing-to-recover":
        click.echo("No unfinished apply: nothing to recover")
    else:
        click.echo(f"{result.status}: {result.journal}")
