"""Recover: settle the journal an interrupted apply left (:func:`gputopo.apply.recover`), on the
node that apply changed, through ports built for it."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from gputopo.actions import Timeouts
from gputopo.apply import ApplyResult, Progress
from gputopo.ports import Ports
from gputopo.usecases.apply import preflight_ports
from gputopo.usecases.connect import Connection, host_root, node_for, this_host


@dataclass(frozen=True)
class RecoverCommand:
    """``gputopo recover``: the host, ``finish`` (forward instead of back), ``dry_run``, the
    command line's timeouts and the progress display made from them."""

    conn: Connection
    finish: bool = False
    dry_run: bool = False
    timeouts: Iterable[tuple[str, float]] = ()
    progress: Callable[[Timeouts], Progress] | None = None


@dataclass(frozen=True)
class OpenRecover:
    """A recover whose ports are built for the node the open journal's apply changed."""

    cmd: RecoverCommand
    root: str
    timeouts: Timeouts
    ports: Ports


def open_recover(cmd: RecoverCommand) -> OpenRecover:
    """Build the ports for the node the open journal names (else this host's). Raises
    ConfigError, JournalError (an open journal that cannot be read), PreflightError."""
    from gputopo.apply.estimate import step_timeouts
    from gputopo.apply.history import recover_node

    root = host_root(cmd.conn)
    t = step_timeouts(None, cmd.timeouts)
    # the node the open journal's apply changed: the API acts on it
    ports = preflight_ports(cmd.conn, recover_node(root, node_for(cmd.conn, None, this_host(root))))
    return OpenRecover(cmd, root, t, ports)


def run_opened(op: OpenRecover) -> ApplyResult:
    """Settle the journal; the ports are closed whatever happens. Raises what
    :func:`gputopo.apply.recover` raises."""
    from gputopo.apply import recover

    cmd = op.cmd
    try:
        return recover(
            op.ports,
            root=op.root,
            finish=cmd.finish,
            progress=cmd.progress(op.timeouts) if cmd.progress is not None else None,
            timeouts=op.timeouts,
            dry_run=cmd.dry_run,
        )
    finally:
        op.ports.close()


def document(result: ApplyResult) -> dict[str, Any]:
    """The apply document (``gputopo schema apply``) of how the recover ended."""
    from gputopo.apply.document import result_document

    return result_document(result)
