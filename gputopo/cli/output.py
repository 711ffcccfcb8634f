"""Output helpers shared by the commands: one place for the console, JSON documents and files."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

# how a verdict is shown: verify's table, a cluster's, apply's ending
STYLE = {"PASS": "bold green", "WARN": "bold yellow", "FAIL": "bold red", "SKIP": "dim"}


def console(stderr: bool = False):
    """A rich Console (imported lazily: rich is heavy to import). A reader gone early is left to
    :func:`gputopo.cli.main` (rich's own handling exits 1)."""
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError

    return _Console(stderr=stderr, highlight=False, soft_wrap=False)


def print_json(data: Any) -> None:
    """Print ``data`` (a pydantic model or plain data) as an indented JSON document on stdout,
    ``schema_version`` first (see :mod:`gputopo.model.documents`)."""
    from gputopo.model.documents import versioned

    if hasattr(data, "model_dump"):
        data = data.model_dump(mode="json", by_alias=True)
    sys.stdout.write(json.dumps(versioned(data), indent=2, default=str) + "\n")


def print_plan(p, summary: dict[str, Any] | None, as_json: bool) -> None:
    """A plan as ``plan`` prints it (``show`` prints a saved one the same way): the plan's text
    and its ``Summary:`` line, or with ``as_json`` the plan document (``gputopo schema plan``).
    ``summary``: :meth:`gputopo.plan.summary.PlanSummary.to_data` (None: no changes)."""
    if as_json:
        print_json(p.to_data(summary))
        return
    sys.stdout.write(p.to_text())
    if summary is not None:
        sys.stdout.write(f"Summary: {summary['text']}\n")


def refuse_existing(path: Path, force: bool) -> None:
    """Raises OutputExists (exit 2) when ``path`` exists and ``force`` is not given."""
    from gputopo.errors import OutputExists

    if not force and (path.exists() or path.is_symlink()):
        raise OutputExists(str(path))


def write_output(path: Path, text: str, force: bool = True) -> None:
    """Write a file the operator named. Raises OutputExists when it exists and not ``force``,
    OutputError (one line, exit 2) when it cannot be written."""
    from gputopo.errors import OutputError

    refuse_existing(path, force)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as e:
        raise OutputError(str(path), e) from None


def warn(text: str) -> None:
    """One ``gputopo: warning:`` line on stderr."""
    import click

    click.echo(f"gputopo: warning: {text}", err=True)


def print_refused(e) -> None:
    """A refused plan's refusals (a PlanRefused), one ``gputopo: error: refused:`` line each on
    stderr (as an apply refused by them prints them)."""
    from gputopo.cli.commands import print_error

    print_error(str(e))


def print_report(report) -> None:
    """The verify report as a PASS/WARN/FAIL table, then its summary line."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"gputopo verify: node {report.node}", title_justify="left", show_lines=False)
    table.add_column("CHECK", no_wrap=True)
    table.add_column("STATUS", no_wrap=True)
    table.add_column("RESULT", overflow="fold")
    for c in report.checks:
        table.add_row(c.name, Text(c.status, style=STYLE[c.status]), c.summary)
    out = console()
    out.print(table)
    line = report.summary_line()
    out.print(Text(line, style="bold green" if report.ok else "bold red"))


def exit_with_error(e: BaseException, code: int) -> None:
    """Print ``e`` as ``gputopo: error: <line>`` lines on stderr and exit with ``code``: a diff's
    ``--exit-code`` keeps 2 for "differences", so any error there, bad input included, is 1."""
    from gputopo.cli.commands import print_error

    print_error(str(e) or type(e).__name__)
    sys.exit(code)


def print_diff(report, as_json: bool, exit_code: bool) -> None:
    """A diff report (``diff``, ``cluster diff``) as text or as its JSON document; with
    ``--exit-code`` the exit says whether anything differs (0 nothing, 2 differences)."""
    if as_json:
        print_json(report.to_data())
    else:
        sys.stdout.write(report.to_text())
    if exit_code:
        sys.exit(0 if report.is_empty else 2)
