"""Apply a spec or a saved plan, then verify: the one place the two are composed.

:func:`run` takes the checked plan (:func:`gputopo.apply.checked_plan`), runs its steps
(:func:`gputopo.apply.transaction`) and, while the lock is still held, verifies the host
(:class:`VerifyStep`, a typed :class:`gputopo.model.documents.VerifyReport` back): with
``rollback_on_verify_failure`` the verification is part of the transaction and a failed one
rolls back, otherwise the apply is finished whatever it finds. :func:`apply` is the same for a
library caller with a spec and ports in hand; :func:`apply_command` is ``gputopo apply``'s:
the spec or saved plan loaded, the ports built and closed, boot persistence handled, the
document made.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from gputopo.actions import Timeouts
from gputopo.apply import ApplyRequest, ApplyResult, Progress, Transaction, checked_plan, signals, transaction
from gputopo.apply.boot import BootRefresh
from gputopo.errors import ConfigError, PreflightError, ProxmoxError
from gputopo.exitcodes import signal_name
from gputopo.model.documents import VerifyReport
from gputopo.plan.model import Plan
from gputopo.plan.saved import SavedPlan
from gputopo.plan.spec import Spec
from gputopo.ports import Ports
from gputopo.usecases.connect import Connection, build_ports, host_root, node_for, this_host
from gputopo.usecases.readplan import read_and_plan


class VerifyStep(Protocol):
    """The verification after an apply: a fresh report of the host."""

    def __call__(self) -> VerifyReport: ...


def _end(tx: Transaction, verify: VerifyStep | None, rollback_on_verify_failure: bool) -> ApplyResult:
    """End an apply whose steps are all done: verified inside the transaction (a failure rolls
    back), or finished first and verified after. From here a signal rolls nothing back: it stops
    the verification (the result says so, and the command names ``gputopo verify``), or, outside
    it, is only noted (:func:`gputopo.apply.transaction` settled its signals after the last step)."""
    if verify is not None and rollback_on_verify_failure:
        tx.verifying()
        report, stopped = _verified(verify)
        if report is not None and not report.ok:
            return tx.rolled_back(report)
        tx.applied(verify="passed" if report is not None else "stopped")
        return tx.result("applied", report, verify_stopped=stopped)
    # every step is done: the apply is finished whatever the verification finds
    tx.applied()
    report, stopped = _verified(verify) if verify is not None else (None, None)
    return tx.result("applied", report, verify_stopped=stopped)


def _verified(verify: VerifyStep) -> tuple[VerifyReport | None, str | None]:
    """(the report, None), or (None, the signal's name) when a signal stopped the verification."""
    try:
        with signals.stoppable():
            return verify(), None
    except signals.Signalled as e:
        return None, signal_name(e.signum)


def run(
    req: ApplyRequest, verify: VerifyStep | None = None, rollback_on_verify_failure: bool = False
) -> ApplyResult:
    """Apply ``req`` (see :mod:`gputopo.apply.run` for the order), then ``verify``.

    Returns the :class:`ApplyResult` (``no-changes``, ``dry-run``, ``applied``, ``rolled-back``),
    its ``verify`` the report when one ran. Raises what :func:`gputopo.apply.checked_plan` and
    :func:`gputopo.apply.transaction` raise (nothing changed, or ApplyFailed), and ApplyFailed
    (exit 3) when the rollback after a failed verification could not complete.
    """
    checked = checked_plan(req)
    if isinstance(checked, ApplyResult):
        return checked
    with transaction(req, checked) as tx:
        return _end(tx, verify, rollback_on_verify_failure)


def apply(
    spec: Spec,
    ports: Ports,
    *,
    root: str | os.PathLike,
    verify: VerifyStep | None = None,
    rollback_on_verify_failure: bool = False,
    ha: bool = True,
    **options: Any,
) -> ApplyResult:
    """Bring the host under ``root`` to what ``spec`` asks, through ``ports``, planned by
    :func:`gputopo.usecases.readplan.read_and_plan` (``ha`` False leaves the cluster's HA
    placement alone); ``options`` are :class:`gputopo.apply.ApplyRequest`'s other fields
    (dry_run, confirm, progress, timeouts, spec_path, node, expected, expect_plan).
    Returns and raises what :func:`run` does.
    """
    root = str(root)
    read = functools.partial(read_and_plan, spec, ports, root, options.get("node"), ha)
    return run(ApplyRequest(spec, ports, root, read, **options), verify, rollback_on_verify_failure)


@dataclass(frozen=True)
class ApplyCommand:
    """``gputopo apply``: a saved plan (``plan_file``) or ``spec_file``, the host, the options.

    ``confirm`` shows the plan and says whether to go on; ``progress`` makes the display from
    the step timeouts; ``timeouts`` are the command line's ``--timeout KIND=SECONDS``.
    """

    conn: Connection
    plan_file: str | None = None
    spec_file: str | None = None
    dry_run: bool = False
    confirm: Callable[[Plan], bool] | None = None
    progress: Callable[[Timeouts], Progress] | None = None
    timeouts: Iterable[tuple[str, float]] = ()
    rollback_on_verify_failure: bool = False
    verify: bool = True
    ha: bool = True
    refresh_boot: bool = False
    expect_plan: str | None = None


@dataclass(frozen=True)
class Applied:
    """How ``gputopo apply`` ended: the result, and what the next boot needs (None: nothing)."""

    result: ApplyResult
    boot: BootRefresh | None


def load(plan_file: str | None, spec_file: str | None) -> tuple[Spec, SavedPlan | None, str]:
    """(spec, saved plan or None, the file named) from ``apply PLANFILE`` or ``--spec FILE``.
    Raises ConfigError (both or neither), SpecError, SavedPlanEdited."""
    from gputopo.plan.spec import load_spec
    from gputopo.usecases.show import read_saved_plan

    if plan_file and spec_file:
        raise ConfigError("give a saved plan or --spec FILE, not both")
    if spec_file:
        return load_spec(spec_file), None, spec_file
    if not plan_file:
        raise ConfigError("give --spec FILE, or a plan saved with 'gputopo plan -o FILE'")
    saved = read_saved_plan(plan_file)
    return saved.spec, saved, plan_file


def preflight_ports(conn: Connection, default_node: str | None) -> Ports:
    """build_ports for apply and recover: an API that cannot be reached or refuses the login is a
    failed preflight (exit 2, nothing changed), as it is when apply's own preflight finds it."""
    try:
        return build_ports(conn, default_node=default_node)
    except ProxmoxError as e:
        raise PreflightError(f"cannot use the Proxmox API ({e}); nothing was changed") from None


@dataclass(frozen=True)
class OpenApply:
    """An apply command whose inputs are read and whose ports are built, not yet run: the
    spec, the saved plan (or None), the file named, the step timeouts, the host root, the
    connection (its node the saved plan's when none was given), the ports and the display."""

    cmd: ApplyCommand
    spec: Spec
    saved: SavedPlan | None
    source_file: str
    timeouts: Timeouts
    root: str
    conn: Connection
    ports: Ports
    progress: Progress


def open_apply(cmd: ApplyCommand) -> OpenApply:
    """Load the spec or saved plan and build the ports (close them with :func:`run_opened`).
    Raises what :func:`load` and :func:`preflight_ports` raise: nothing was changed."""
    from gputopo.apply.estimate import step_timeouts

    spec, saved, source_file = load(cmd.plan_file, cmd.spec_file)
    t = step_timeouts(spec, cmd.timeouts)
    root = host_root(cmd.conn)
    conn = cmd.conn
    if saved is not None and conn.node is None and saved.node is not None:
        conn = dataclasses.replace(conn, node=saved.node)
    ports = preflight_ports(conn, node_for(conn, spec, this_host(root)))
    progress = cmd.progress(t) if cmd.progress is not None else Progress()
    return OpenApply(cmd, spec, saved, source_file, t, root, conn, ports, progress)


def run_opened(op: OpenApply) -> Applied:
    """``gputopo apply``: apply then verify (:func:`run`), then boot persistence; the ports are
    closed whatever happens. Raises what :func:`run` raises."""
    from gputopo.usecases.verify import verify as run_verify

    cmd, spec, ports, root, node = op.cmd, op.spec, op.ports, op.root, op.conn.node
    try:
        verify = None
        if cmd.verify and not cmd.dry_run:
            verify = functools.partial(run_verify, spec, ports, root=root, node=node)
        read = functools.partial(read_and_plan, spec, ports, root, node, cmd.ha)
        req = ApplyRequest(
            spec,
            ports,
            root,
            read,
            dry_run=cmd.dry_run,
            confirm=cmd.confirm,
            progress=op.progress,
            timeouts=op.timeouts,
            spec_path=op.source_file,
            node=node,
            expected=op.saved,
            expect_plan=cmd.expect_plan,
        )
        result = run(req, verify, cmd.rollback_on_verify_failure)
        return Applied(result, boot_after(result, ports, cmd.refresh_boot, op.progress.note))
    finally:
        ports.close()


def boot_after(
    result: ApplyResult, ports: Ports, refresh: bool, note: Callable[[str], None]
) -> BootRefresh | None:
    """What the next boot needs after ``result`` (:func:`gputopo.apply.boot.after_apply`), its
    commands run when ``refresh``. The apply is over: a Ctrl-C, SIGTERM or SIGHUP while they run
    stops only them (update-initramfs writes the new image beside the old one and renames it),
    and they are listed as still to run, as without ``refresh``."""
    from gputopo.apply.boot import after_apply

    try:
        with signals.interruptible():
            return after_apply(result, ports, refresh, note)
    except signals.Signalled as e:
        note(f"{signal_name(e.signum)} stopped the boot refresh; the change is applied")
    return after_apply(result, ports, False)


def document(applied: Applied) -> dict[str, Any]:
    """The apply document (``gputopo schema apply``) of how it ended."""
    from gputopo.apply.document import result_document

    return result_document(applied.result, applied.boot)


def error_document(error: Exception, root: str, recover: bool = False) -> dict[str, Any]:
    """The apply document of an apply (or ``recover``) under ``root`` that raised ``error``."""
    from gputopo.apply.document import error_document as of_error

    return of_error(error, root, recover=recover)  # type: ignore[arg-type]


def verify_failure(result: ApplyResult) -> Exception | None:
    """The VerifyFailed an apply that ended ``result`` exits with, else None."""
    from gputopo.apply.document import verify_failure as failure

    return failure(result)


def verify_stopped_line(result: ApplyResult) -> str | None:
    """What an apply says when a signal stopped its verification after the last step, else None."""
    from gputopo.apply.document import verify_stopped_line as line

    return line(result)
