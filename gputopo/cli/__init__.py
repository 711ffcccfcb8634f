"""The ``gputopo`` command line.

Each command lives in its own module under ``gputopo.cli`` and is imported only when it runs.
This module imports neither click nor a command: ``gputopo --version``, ``gputopo --help`` and
``gputopo discover --json`` are answered by :mod:`gputopo.cli.quick` in about the time Python
itself takes to start, and every other command line goes to the click group in
:mod:`gputopo.cli.group` (``cli``, ``LazyGroup``). Expected errors
(:class:`gputopo.errors.GputopoError`) print as one line on stderr and exit with their code;
``--debug`` keeps the traceback. The command table both read is :mod:`gputopo.cli.commands`.
A reader that goes away early (``gputopo plan | head -1``) ends the command quietly with 141, as
a command killed by SIGPIPE ends in a shell, whichever of the two entries was writing.
"""

from __future__ import annotations

import sys

from gputopo.cli.commands import COMMANDS, DESCRIPTION, SUMMARIES, report_error, version_message

TYPE_CHECKING = False  # typing costs start-up (gputopo --version); the annotations need it only
if TYPE_CHECKING:
    from typing import NoReturn

__all__ = ["COMMANDS", "DESCRIPTION", "SUMMARIES", "main", "report_error", "version_message"]


def main(argv: list[str] | None = None) -> None:
    """Entry point: runs the CLI, turning expected errors into one line and an exit code.

    Exits 0 on success, the error's ``exit_code`` for a GputopoError, 2 for a usage error,
    130 when interrupted (Ctrl-C), 2 when a confirmation was declined (nothing was changed); the
    table is :mod:`gputopo.exitcodes`; 141 when the reader of its output went away.
    """
    from gputopo.cli.quick import answer

    try:
        try:
            if not answer(sys.argv[1:] if argv is None else list(argv)):
                from gputopo.cli.group import run

                run(argv)
        finally:
            # what is still buffered goes now, inside the try: a pipe closed early fails here
            # rather than in the interpreter's own flush at exit ("Exception ignored", exit 120)
            sys.stdout.flush()
    except BrokenPipeError:
        _reader_gone()


def _reader_gone() -> NoReturn:
    """Stop quietly: the reader of stdout went away (``| head``). Python ignores SIGPIPE, so
    the write failed with EPIPE instead of killing the process; exit as if SIGPIPE had (141,
    what a shell reports for ``yes | head -1``), without a traceback or an error line."""
    import os

    from gputopo.exitcodes import SIGPIPE

    try:
        # the buffer still holds what could not be written: let the flush at exit go nowhere
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass  # stdout is no file (captured in a test): nothing is flushed at exit
    sys.exit(SIGPIPE)


def __getattr__(name: str):
    # The click group and its class import click: only for the code that asks for them.
    if name in ("cli", "LazyGroup"):
        from gputopo.cli import group

        return getattr(group, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
