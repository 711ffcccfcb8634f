"""``gputopo watch``: the drift watch, one pass (the timer's) or ``--follow`` (udev's events).

The pass, the metrics and the follow loop are :mod:`gputopo.watch`'s; this module picks the
output, builds the ports and stops ``--follow`` on SIGTERM.
"""

from __future__ import annotations

import sys

import click

from gputopo.cli.connect import Connection, build_ports, connection_options, host_root, node_for, this_host
from gputopo.cli.params import Finite
from gputopo.exitcodes import with_exit_codes

FOLLOW_INTERVAL = 60.0  # seconds between --follow's passes when no device event comes


@click.command()
@click.option(
    "--spec",
    "spec_file",
    default="/etc/gputopo/spec.yaml",
    show_default=True,
    type=click.Path(dir_okay=False),
    help="The node's spec, read again at every pass.",
)
@connection_options()
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "prometheus"]),
    default="text",
    show_default=True,
    help="text: a summary on stdout; prometheus: node_exporter's textfile metrics, written atomically.",
)
@click.option(
    "--textfile-dir",
    default=None,
    type=click.Path(file_okay=False),
    help="node_exporter's textfile directory to write gputopo.prom into (default: "
    "/var/lib/prometheus/node-exporter under the host root).",
)
@click.option(
    "-o",
    "--output",
    "output_file",
    default=None,
    type=click.Path(dir_okay=False),
    help="Write the metrics to this file instead (replaced in one step).",
)
@click.option(
    "--follow",
    is_flag=True,
    help="Keep running: a pass within a second of a PCI device's bind, unbind or removal "
    "(udev's events), and every --interval seconds; stops on SIGTERM.",
)
@click.option(
    "--interval",
    type=Finite(),
    default=None,
    help="With --follow: seconds between passes when no device event comes (default: 60).",
)
@with_exit_codes("watch")
def watch(spec_file, conn: Connection, fmt, textfile_dir, output_file, follow, interval) -> None:
    """Check the node against its spec without changing anything: diff and the quick checks of
    verify, as text or as node_exporter textfile metrics (--format prometheus).
    """
    from gputopo.errors import ConfigError, GputopoError
    from gputopo.watch import watch_once
    from gputopo.watch.run import not_checked, readable_spec

    if fmt != "prometheus" and (textfile_dir or output_file):
        raise ConfigError(
            f"{'--textfile-dir' if textfile_dir else '-o'} writes metrics: add --format prometheus"
        )
    if textfile_dir and output_file:
        raise ConfigError("--textfile-dir and -o exclude each other")
    if interval is not None and not follow:
        raise ConfigError("--interval applies to --follow only")
    root = host_root(conn)
    if fmt == "prometheus":
        from gputopo.watch.metrics import textfile_path, write_textfile

        path = textfile_path(root, textfile_dir, output_file)

        def emit(result) -> None:
            write_textfile(result, path)
    else:
        from gputopo.watch.metrics import text

        def emit(result) -> None:
            sys.stdout.write(text(result))
            sys.stdout.flush()

    try:
        ports = build_ports(conn, default_node=node_for(conn, readable_spec(spec_file), this_host(root)))
    except GputopoError as e:
        emit(not_checked(e))
        raise

    def one_pass(why: str = "") -> object:
        result = watch_once(spec_file, ports, root=root, node=conn.node)
        emit(result)
        if follow:  # the follow service's journal says why each pass ran and what it found
            from gputopo.watch.metrics import verdict

            click.echo(f"gputopo watch: pass after {why or 'start'}: {verdict(result)}", err=True)
        return result

    try:
        if follow:
            _follow(conn, root, one_pass, FOLLOW_INTERVAL if interval is None else interval)
            return
        result = one_pass()
    finally:
        ports.close()
    if not result.up:
        from gputopo.cli.output import exit_with_error

        exit_with_error(GputopoError(result.error or "not checked"), result.error_code or 2)


def _follow(conn: Connection, root: str, one_pass, interval: float) -> None:
    """Passes at udev's PCI events and every ``interval`` s until SIGTERM (Ctrl-C: 130)."""
    import signal
    import threading

    from gputopo.watch import NoEvents, NoUdev, UdevEvents, follow

    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    try:
        if conn.sim is not None:
            raise NoUdev("a simulated host sends no udev events")
        source = UdevEvents.open(root)
    except NoUdev as e:
        from gputopo.cli.output import warn

        warn(f"watch --follow: {e}; a pass every {interval:g} s instead")
        source = NoEvents(stopped.wait)
    follow(source, one_pass, stopped.is_set, interval=interval)
