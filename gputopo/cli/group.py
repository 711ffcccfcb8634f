"""The click group behind ``gputopo``: its commands imported only when named, and the error
handling of every command line that :mod:`gputopo.cli.quick` does not answer.

Expected errors (:class:`gputopo.errors.GputopoError`) print as one line on stderr and exit with
their code; ``--debug`` keeps the traceback.
"""

from __future__ import annotations

import importlib
import logging
import sys

import click

from gputopo import __version__
from gputopo.cli.commands import COMMANDS, DESCRIPTION, SUMMARIES, print_error, report_error, version_message


class _ReaderGone(Exception):
    """A BrokenPipeError on its way to :func:`gputopo.cli.main` (click exits 1 on an OSError
    with EPIPE; this is no OSError)."""


class LazyGroup(click.Group):
    """A group whose commands are imported only when named. ``--help`` lists them with their
    :data:`gputopo.cli.SUMMARIES`, without importing any on a terminal 80 columns wide or more:
    a command whose module cannot be imported (a missing dependency) says so in one line when
    it is run."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        limit = formatter.width - 6 - max(map(len, COMMANDS))
        for name in self.list_commands(ctx):
            summary = SUMMARIES.get(name)
            if summary is None or formatter.width < 78:
                # no summary registered, or a terminal narrower than 80 columns: the command's
                # own docstring shortened to fit, as click does
                cmd = self._load(name)
                if cmd is None or cmd.hidden:
                    continue
                summary = cmd.get_short_help_str(limit)
            rows.append((name, summary))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except BrokenPipeError as e:
            # past click's own handler, which would exit 1: gputopo.cli.main ends it quietly
            raise _ReaderGone from e

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        """The command ``name``, or None when there is none. Raises UnavailableCommand when
        its module is shipped but cannot be imported (a missing dependency)."""
        try:
            return self._load(name, strict=True)
        except ImportError as e:
            from gputopo.errors import UnavailableCommand

            raise UnavailableCommand(name, e) from e

    @staticmethod
    def _load(name: str, strict: bool = False) -> click.Command | None:
        target = COMMANDS.get(name)
        if target is None:
            return None
        module, attr = target.split(":")
        try:
            mod = importlib.import_module(f"gputopo.cli.{module}")
        except ImportError as e:
            if strict and not (isinstance(e, ModuleNotFoundError) and e.name == f"gputopo.cli.{module}"):
                raise
            return None
        return getattr(mod, attr, None)


@click.group(cls=LazyGroup, help=DESCRIPTION, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gputopo", message=version_message())
@click.option("--debug", is_flag=True, help="Show tracebacks for expected errors too.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug
    if debug:  # what gputopo's modules say at debug level (no udev here, ...) goes to stderr
        log = logging.getLogger("gputopo")
        if not any(isinstance(h, _DebugLines) for h in log.handlers):
            log.addHandler(_DebugLines())
        log.setLevel(logging.DEBUG)


class _DebugLines(logging.Handler):
    """``--debug``: each debug line of gputopo's modules on stderr, as ``gputopo: debug: ...``."""

    def emit(self, record: logging.LogRecord) -> None:
        click.echo(f"gputopo: debug: {record.getMessage()}", err=True)


def _usage_line(e: click.UsageError) -> str:
    """A click usage error as one line naming the command, after the one error prefix:
    'gputopo: error: plan: Missing option ... (see 'gputopo plan --help')'."""
    cmd = e.ctx.command_path if e.ctx is not None else "gputopo"
    message = " ".join(e.format_message().split())  # click lays out choices over lines and tabs
    sub = cmd.split(" ", 1)[1] + ": " if " " in cmd else ""
    return f"{sub}{message} (see '{cmd} --help')"


def run(argv: list[str] | None = None) -> None:
    """Run the click group on ``argv`` (default: the process's arguments), turning expected
    errors into one line and an exit code (see :func:`gputopo.cli.main`)."""
    from gputopo.errors import GputopoError

    args = argv if argv is not None else sys.argv[1:]
    try:
        # Outside standalone mode click hands back ctx.exit(N)'s code instead of exiting.
        code = cli.main(args=argv, prog_name="gputopo", standalone_mode=False)
        if isinstance(code, int) and not isinstance(code, bool) and code:
            sys.exit(code)
    except _ReaderGone as e:
        raise e.__cause__ from None
    except GputopoError as e:
        if "--debug" in args:
            raise
        report_error(e)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.UsageError as e:
        if isinstance(e, click.exceptions.NoArgsIsHelpError):
            # 'gputopo' alone: the command list is what was asked for
            click.echo(e.ctx.get_help() if e.ctx is not None else e.format_message())
            sys.exit(0)
        print_error(_usage_line(e))
        # 'diff --exit-code' promises 2 for "differences": any error there, a usage error too, is 1
        sys.exit(1 if e.ctx is not None and e.ctx.info_name == "diff" and "--exit-code" in args else 2)
    except click.ClickException as e:
        print_error(e.format_message())  # click's own would be "Error: ..."
        sys.exit(e.exit_code)
    except click.exceptions.Abort as e:
        # click turns a KeyboardInterrupt or EOFError raised anywhere in a command into Abort;
        # at its prompts it raises Abort "from None", so a Ctrl-C there is only the context
        cause = e.__cause__
        if cause is None and isinstance(e.__context__, (KeyboardInterrupt, EOFError)):
            click.echo(err=True)  # the prompt's line is still open
        if isinstance(cause, KeyboardInterrupt) or isinstance(e.__context__, KeyboardInterrupt):
            click.echo("gputopo: interrupted", err=True)
            sys.exit(130)
        if isinstance(cause, EOFError):
            raise cause from None  # not a declined prompt: an unexpected error, traceback kept
        click.echo("gputopo: aborted", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        click.echo("gputopo: interrupted", err=True)
        sys.exit(130)
