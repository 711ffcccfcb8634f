"""The ``gputopo`` command line.

Each command lives in its own module under ``gputopo.cli`` and is imported only when it runs.
This module imports neither click nor a command: ``gputopo --version``, ``gputopo --help`` and
``gputopo discover --json`` are answered by :mod:`gputopo.cli.quick` in about the time Python
itself takes to start, and every other command line goes to the click group in
:mod:`gputopo.cli.group` (``cli``, ``LazyGroup``). Expected errors
(:class:`gputopo.errors.GputopoError`) print as one line on stderr and exit with their code;
``--debug`` keeps the traceback. The command table both read is :mod:`gputopo.cli.commands`.
"""

from __future__ import annotations

import sys

from gputopo.cli.commands import COMMANDS, DESCRIPTION, SUMMARIES, report_error, version_message

__all__ = ["COMMANDS", "DESCRIPTION", "SUMMARIES", "main", "report_error", "version_message"]


def main(argv: list[str] | None = None) -> None:
    """Entry point: runs the CLI, turning expected errors into one line and an exit code.

    Exits 0 on success, the error's ``exit_code`` for a GputopoError, 2 for a usage error,
    130 when interrupted (Ctrl-C), 2 when a confirmation was declined (nothing was changed); the
    table is :mod:`gputopo.exitcodes`.
    """
    from gputopo.cli.quick import answer

    if not answer(sys.argv[1:] if argv is None else list(argv)):
        from gputopo.cli.group import run

        run(argv)


def __getattr__(name: str):
    # The click group and its class import click: only for the code that asks for them.
    if name in ("cli", "LazyGroup"):
        from gputopo.cli import group

        return getattr(group, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
