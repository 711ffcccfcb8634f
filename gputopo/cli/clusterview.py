"""What the cluster commands print: the cluster verify table, a cluster apply's ending."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gputopo.model.documents import ClusterReport
    from gputopo.usecases.cluster_apply import ClusterApplyResult


def print_cluster_report(report: ClusterReport) -> None:
    """The cluster verify report as a table, one row per node's check and per cluster check,
    then its summary line."""
    from rich.table import Table
    from rich.text import Text

    from gputopo.cli.output import STYLE, console

    table = Table(title="gputopo cluster verify", title_justify="left")
    for col in ("NODE", "CHECK", "STATUS", "RESULT"):
        table.add_column(col, no_wrap=col != "RESULT", overflow="fold")
    for n in report.nodes:
        for ch in n.checks:
            table.add_row(n.node, ch.name, Text(ch.status, style=STYLE[ch.status]), ch.summary)
    for ch in report.checks:
        table.add_row("cluster", ch.name, Text(ch.status, style=STYLE[ch.status]), ch.summary)
    out = console()
    out.print(table)
    out.print(Text(report.summary_line(), style="bold green" if report.ok else "bold red"))


def print_applied(result: ClusterApplyResult, as_json: bool) -> None:
    """How a cluster apply ended: its document (``as_json``) or the rollout's account (when a
    node's apply ran) on stdout."""
    import click

    from gputopo.cli.output import print_json

    if as_json:
        print_json(result.doc)
    elif result.account is not None:
        click.echo(result.account, nl=False)
