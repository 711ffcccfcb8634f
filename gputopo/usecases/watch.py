"""Watch a node for drift: passes of :func:`gputopo.watch.watch_once` over the one read
:func:`gputopo.usecases.readplan.read_for_checks` makes, as text or node_exporter metrics,
once or at udev's PCI events (``--follow``)."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass

from gputopo.errors import ConfigError, GputopoError
from gputopo.ports import Ports
from gputopo.usecases.connect import Connection, build_ports, host_root, node_for, this_host
from gputopo.usecases.notes import say, warn
from gputopo.usecases.readplan import read_for_checks
from gputopo.watch.run import WatchResult

#: seconds between passes of --follow when no device event comes
FOLLOW_INTERVAL = 60.0


@dataclass(frozen=True)
class WatchRequest:
    """``gputopo watch``: the spec file, the host, the output (``fmt`` text or prometheus,
    to ``textfile_dir`` or ``output_file``), and ``follow`` with its ``interval``."""

    conn: Connection
    spec_file: str
    fmt: str = "text"
    textfile_dir: str | None = None
    output_file: str | None = None
    follow: bool = False
    interval: float | None = None


def _refuse_options(req: WatchRequest) -> None:
    """Raises ConfigError for options that exclude each other or need another."""
    if req.fmt != "prometheus" and (req.textfile_dir or req.output_file):
        raise ConfigError(
            f"{'--textfile-dir' if req.textfile_dir else '-o'} writes metrics: add --format prometheus"
        )
    if req.textfile_dir and req.output_file:
        raise ConfigError("--textfile-dir and -o exclude each other")
    if req.interval is not None and not req.follow:
        raise ConfigError("--interval applies to --follow only")


def _emitter(req: WatchRequest, root: str) -> Callable[[WatchResult], None]:
    """Where each pass goes: the metrics textfile (written in one step), or text on stdout."""
    if req.fmt == "prometheus":
        from gputopo.watch.metrics import textfile_path, write_textfile

        path = textfile_path(root, req.textfile_dir, req.output_file)
        return lambda result: write_textfile(result, path)
    from gputopo.watch.metrics import text

    def emit(result: WatchResult) -> None:
        sys.stdout.write(text(result))
        sys.stdout.flush()

    return emit


def _ports(req: WatchRequest, root: str, emit: Callable[[WatchResult], None]) -> Ports:
    """The ports of the watched host; a failure to build them is emitted as a pass that could
    not check (so the metrics say so), then raised."""
    from gputopo.watch.run import not_checked, readable_spec

    try:
        return build_ports(
            req.conn, default_node=node_for(req.conn, readable_spec(req.spec_file), this_host(root))
        )
    except GputopoError as e:
        emit(not_checked(e))
        raise


def watch(req: WatchRequest) -> WatchResult | None:
    """One pass (returned), or with ``follow`` passes until SIGTERM (None). Raises ConfigError
    for options that exclude each other, and what building the ports raises (after emitting
    a pass that says it could not check)."""
    from gputopo.watch import watch_once

    _refuse_options(req)
    root = host_root(req.conn)
    emit = _emitter(req, root)
    ports = _ports(req, root, emit)

    def one_pass(why: str = "") -> WatchResult:
        result = watch_once(req.spec_file, ports, root=root, read=read_for_checks, node=req.conn.node)
        emit(result)
        if req.follow:  # the follow service's journal says why each pass ran and what it found
            from gputopo.watch.metrics import verdict

            say(f"gputopo watch: pass after {why or 'start'}: {verdict(result)}")
        return result

    try:
        if req.follow:
            _follow(req.conn, root, one_pass, FOLLOW_INTERVAL if req.interval is None else req.interval)
            return None
        return one_pass()
    finally:
        ports.close()


def _follow(conn: Connection, root: str, one_pass: Callable[[str], object], interval: float) -> None:
    """Passes at udev's PCI events and every ``interval`` s until SIGTERM (Ctrl-C: 130)."""
    import signal

    from gputopo.watch import NoEvents, NoUdev, UdevEvents, follow

    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    try:
        if conn.sim is not None:
            raise NoUdev("a simulated host sends no udev events")
        source = UdevEvents.open(root)
    except NoUdev as e:
        warn(f"watch --follow: {e}; a pass every {interval:g} s instead")
        source = NoEvents(stopped.wait)
    follow(source, one_pass, stopped.is_set, interval=interval)
