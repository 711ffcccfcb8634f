"""``gputopo apply`` and ``gputopo recover``: build the ports, make one library call, print.

``apply`` shows the plan, asks for confirmation (``--yes`` skips it), then runs
:func:`gputopo.apply.apply`; progress is styled lines (rich) with the open stop window on a
terminal, and plain lines otherwise (logs, pipes). A step that succeeded with warnings (a
Proxmox task ending ``WARNINGS: N``, a guest stopped by force) shows them after its line; with
``--json`` the result, every step's warnings included, is one JSON object on stdout and the
progress goes to stderr.
It ends with ``gputopo verify`` when that is installed. ``recover`` settles the journal of an
apply that was interrupted (rollback by default, ``--finish`` to complete it).

Both write sysfs and run ``pct`` on this machine: with ``--api-url`` they refuse (exit 2, nothing
changed) an API whose node is not this host.
"""

from __future__ import annotations

import sys
import time

import click

from gputopo.cli.connect import Connection, build_ports, connection_options, host_root, node_for, this_host
from gputopo.cli.params import Finite


def _progress(stream=None):
    from gputopo.apply import PlainProgress

    if stream is not None or not sys.stdout.isatty():
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


def _preflight_ports(conn: Connection, default_node: str | None, root: str):
    """build_ports for apply and recover: an API that cannot be reached or refuses the login is
    a failed preflight (exit 2, nothing changed), as it is when apply's own preflight finds it,
    and so is an API whose node is not this host (:func:`_refuse_other_node`)."""
    from gputopo.errors import PreflightError, ProxmoxError

    try:
        ports = build_ports(conn, default_node=default_node)
    except ProxmoxError as e:
        raise PreflightError(f"cannot use the Proxmox API ({e}); nothing was changed") from None
    try:
        _refuse_other_node(conn, ports, root)
    except BaseException:
        ports.close()
        raise
    return ports


def _refuse_other_node(conn: Connection, ports, root: str) -> None:
    """With ``--api-url``: raises PreflightError unless the node the API calls name is this
    host and the API serves it. sysfs writes, host files and ``pct`` always act on this machine;
    a node elsewhere would get its guests stopped and configured for GPUs this host moves."""
    from gputopo.errors import PreflightError, ProxmoxError

    if conn.api_url is None:
        return
    host = this_host(root)
    node = ports.proxmox.node
    try:
        served = ports.proxmox.nodes()
    except ProxmoxError as e:
        raise PreflightError(f"cannot use the Proxmox API ({e}); nothing was changed") from None
    if node != host or host not in served:
        raise PreflightError(
            f"--api-url {conn.api_url} serves node(s) {', '.join(served) or 'none'}, and gputopo would act on node "
            f"{node}, but this host is {host}: sysfs and pct act on this machine only; run it on the node "
            "itself (nothing was changed)")


@click.command()
@click.option("--spec", "spec_file", required=True, type=click.Path(dir_okay=False), help="Spec file.")
@connection_options()
@click.option("--dry-run", is_flag=True, help="Show the plan; change nothing.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask before changing the host.")
@click.option("--timeout", "sysfs_timeout", type=Finite(), default=30.0, show_default=True,
              help="Seconds one sysfs write may take; a write that takes longer leaves its device to a human.")
@click.option("--rollback-on-verify-failure", is_flag=True, help="Roll back when verification finds a FAIL.")
@click.option("--no-verify", is_flag=True, help="Do not run verify after applying.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the result (status, steps and their warnings, verify) as JSON; progress goes to stderr.")
def apply(spec_file: str, conn: Connection, dry_run: bool, yes: bool, sysfs_timeout: float,
          rollback_on_verify_failure: bool, no_verify: bool, as_json: bool) -> None:
    """Apply the spec: preflight, lock, journaled steps, rollback on any failure, then verify.

    Exit codes: 0 applied (or no changes), 1 failed and rolled back, 2 refused before anything
    changed, 3 a device needs a human, 4 another apply holds the lock.
    """
    from gputopo.apply import Timeouts, apply as run_apply
    from gputopo.plan.spec import load_spec

    spec = load_spec(spec_file)
    root = host_root(conn)
    ports = _preflight_ports(conn, node_for(conn, spec, this_host(root)), root)
    progress = _progress(sys.stderr if as_json else None)

    def confirm(p) -> bool:
        click.echo(p.to_text(), nl=False, err=as_json)
        if yes:
            return True
        if not sys.stdin.isatty():
            from gputopo.errors import ConfigError

            raise ConfigError("refusing to change the host without confirmation: pass --yes (stdin is not a terminal)")
        return click.confirm("Apply these changes?", default=False, err=as_json)

    try:
        verifier = None if (no_verify or dry_run) else _verifier(spec, ports, root, conn.node)
        result = run_apply(spec, ports, root=root, dry_run=dry_run, confirm=confirm, progress=progress,
                           timeouts=Timeouts(sysfs=sysfs_timeout), verify=verifier,
                           rollback_on_verify_failure=rollback_on_verify_failure, spec_path=spec_file,
                           node=conn.node)
    finally:
        ports.close()
    if as_json:
        from gputopo.cli.output import print_json

        print_json(result_json(result))
    elif result.status in ("no-changes", "dry-run"):
        click.echo(result.plan.to_text() if result.plan else "No changes", nl=False)
        return
    if result.status in ("no-changes", "dry-run"):
        return
    if result.verify is not None and not as_json:
        from gputopo.cli.verifycmd import print_report

        print_report(result.verify)
    if result.status == "rolled-back":
        from gputopo.errors import VerifyFailed

        raise VerifyFailed("verification failed after apply; the host was rolled back")
    if result.verify is not None and not getattr(result.verify, "ok", True):
        from gputopo.errors import VerifyFailed

        raise VerifyFailed("applied, but verification failed (see above); 'gputopo recover' cannot undo a finished apply")


def result_json(result) -> dict:
    """An apply's result as the JSON ``apply --json`` prints: status, journal, times, each step
    with its warnings, every warning once more as ``step N: text``, and the verify report."""
    import json

    steps = [{"step": r.index + 1, "phase": r.phase, "description": r.text, "status": r.status,
              "seconds": round(r.seconds, 3), "warnings": list(r.warnings)}
             for r in sorted(result.steps, key=lambda r: r.index)]
    return {
        "status": result.status,
        "journal": result.journal,
        "wall_s": round(result.wall_s, 3),
        "stop_window_s": None if result.stop_window_s is None else round(result.stop_window_s, 3),
        "steps": steps,
        "warnings": [f"step {s['step']}: {w}" for s in steps for w in s["warnings"]],
        "plan": [a.describe() for a in result.plan.actions] if result.plan is not None else [],
        "verify": json.loads(result.verify.to_json()) if result.verify is not None else None,
    }


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
    ports = _preflight_ports(conn, unfinished.header.node if unfinished else node_for(conn, None, this_host(root)),
                             root)
    try:
        result = run_recover(ports, root=root, finish=finish, progress=_progress(), timeouts=Timeouts(sysfs=sysfs_timeout))
    finally:
        ports.close()
    if result.status == "nothing-to-recover":
        click.echo("No unfinished apply: nothing to recover")
    else:
        click.echo(f"{result.status}: {result.journal}")
