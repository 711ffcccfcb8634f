"""The ``gputopo`` command line.

Each command lives in its own module under ``gputopo.cli`` and is imported only when it runs,
so ``gputopo --version`` stays lean. Expected errors (:class:`gputopo.errors.GputopoError`)
print as one line on stderr and exit with their code; ``--debug`` keeps the traceback.
"""

from __future__ import annotations

import importlib
import os
import sys

import click

import gputopo
from gputopo import __version__

# command name -> "module:attribute" (module relative to gputopo.cli)
COMMANDS: dict[str, str] = {
    "discover": "discover:discover",
    "topo": "topocmd:topo",
    "snapshot": "discover:snapshot",
    "schema": "schema:schema",
    "init": "plancmd:init",
    "plan": "plancmd:plan",
    "render": "plancmd:render",
    "diff": "plancmd:diff",
    "apply": "applycmd:apply",
    "recover": "applycmd:recover",
    "verify": "verifycmd:verify",
    "cluster": "clustercmd:cluster",
    "demo": "democmd:demo",
    "sim": "simcmd:sim",
    "fixtures": "fixturescmd:fixtures",
}


class LazyGroup(click.Group):
    """A group whose commands are imported only when named; ``list_commands`` lists only the
    commands whose module imports, so ``gputopo --help`` never offers one that cannot run."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(name for name in COMMANDS if self._load(name) is not None)

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


def _version_message() -> str:
    """What ``gputopo --version`` prints: the version, then the Python that runs it and the
    directory gputopo is imported from, so a bug report says which install it came from (the
    node's .deb under /usr/lib/gputopo, a pipx venv, a checkout)."""
    python = ".".join(str(n) for n in sys.version_info[:3])
    where = os.path.dirname(os.path.abspath(gputopo.__file__))
    # click formats the message with %: a '%' in a path must not be read as a placeholder
    install = f"Python {python} ({sys.executable})\nrunning from {where}"
    return "%(prog)s, version %(version)s\n" + install.replace("%", "%%")


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gputopo", message=_version_message())
@click.option("--debug", is_flag=True, help="Show tracebacks for expected errors too.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Move GPUs between an LXC container and VM passthrough on a Proxmox VE host.

    discover -> plan -> render -> apply -> verify; diff at any time.
    """
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


def _usage_line(e: click.UsageError) -> str:
    """A click usage error as one line naming the command: 'gputopo plan: Missing option ...'."""
    cmd = e.ctx.command_path if e.ctx is not None else "gputopo"
    message = " ".join(e.format_message().split())  # click lays out choices over lines and tabs
    return f"{cmd}: error: {message} (see '{cmd} --help')"


def main(argv: list[str] | None = None) -> None:
    """Entry point: runs the CLI, turning expected errors into one line and an exit code.

    Exits 0 on success, the error's ``exit_code`` for a GputopoError, 2 for a usage error,
    130 when interrupted (Ctrl-C), 1 when a confirmation was declined.
    """
    from gputopo.errors import GputopoError

    debug = "--debug" in (argv if argv is not None else sys.argv[1:])
    try:
        # Outside standalone mode click hands back ctx.exit(N)'s code instead of exiting.
        code = cli.main(args=argv, prog_name="gputopo", standalone_mode=False)
        if isinstance(code, int) and not isinstance(code, bool) and code:
            sys.exit(code)
    except GputopoError as e:
        if debug:
            raise
        for line in str(e).splitlines() or [type(e).__name__]:
            click.echo(f"gputopo: error: {line}", err=True)
        sys.exit(e.exit_code)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.UsageError as e:
        if isinstance(e, click.exceptions.NoArgsIsHelpError):
            # 'gputopo' alone: the command list is what was asked for
            click.echo(e.ctx.get_help() if e.ctx is not None else e.format_message())
            sys.exit(0)
        click.echo(_usage_line(e), err=True)
        args = argv if argv is not None else sys.argv[1:]
        # 'diff --exit-code' promises 2 for "differences": any error there, a usage error too, is 1
        sys.exit(1 if e.ctx is not None and e.ctx.info_name == "diff" and "--exit-code" in args else 2)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except click.exceptions.Abort as e:
        # click turns a KeyboardInterrupt or EOFError raised anywhere in a command into Abort
        cause = e.__cause__
        if isinstance(cause, KeyboardInterrupt):
            click.echo("gputopo: interrupted", err=True)
            sys.exit(130)
        if isinstance(cause, EOFError):
            raise cause  # not a declined prompt: an unexpected error, traceback kept
        click.echo("gputopo: aborted", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        click.echo("gputopo: interrupted", err=True)
        sys.exit(130)
