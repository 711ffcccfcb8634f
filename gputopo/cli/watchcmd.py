"""``gputopo watch``: the drift watch, one pass (the timer's) or ``--follow`` (udev's events).

The pass, the metrics and the follow loop are :mod:`gputopo.watch`'s, run by
:mod:`gputopo.usecases.watch`; this module parses the options and exits with the pass's code.
"""

from __future__ import annotations

import click

from gputopo.cli.connect import Connection, connection_options
from gputopo.cli.params import Finite
from gputopo.exitcodes import with_exit_codes


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
    from gputopo.errors import GputopoError
    from gputopo.usecases.watch import WatchRequest
    from gputopo.usecases.watch import watch as run_watch

    result = run_watch(WatchRequest(conn, spec_file, fmt, textfile_dir, output_file, follow, interval))
    if result is not None and not result.up:
        from gputopo.cli.output import exit_with_error

        exit_with_error(GputopoError(result.error or "not checked"), result.error_code or 2)
