"""The ``gputopo`` command line.

Each command lives in its own module under ``gputopo.cli`` and is imported only when it runs,
so ``gputopo --version`` stays lean. Expected errors (:class:`gputopo.errors.GputopoError`)
print as one line on stderr and exit with their code; ``--debug`` keeps the traceback.
"""

from __future__ import annotations

import importlib
import sys

import click

from gputopo import __version__

# command name -> "module:attribute" (module relative to gputopo.cli)
COMMANDS: dict[str, str] = {
    "discover": "discover:discover",
    "snapshot": "discover:snapshot",
    "schema": "schema:schema",
    "init": "plancmd:init",
    "plan": "plancmd:plan",
    "render": "plancmd:render",
    "diff": "plancmd:diff",
    "apply": "applycmd:apply",
    "recover": "applycmd:recover",
    "verify": "verifycmd:verify",
    "demo": "democmd:demo",
    "sim": "simcmd:sim",
    "fixtures": "fixturescmd:fixtures",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        target = COMMANDS.get(name)
        if target is None:
            return None
        module, attr = target.split(":")
        try:
            mod = importlib.import_module(f"gputopo.cli.{module}")
        except ModuleNotFoundError as e:
            if e.name == f"gputopo.cli.{module}":
                return None
            raise
        return getattr(mod, attr)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gputopo")
@click.option("--debug", is_flag=True, help="Show tracebacks for expected errors too.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Move GPUs between an LXC container and VM passthrough on a Proxmox VE host.

    discover -> plan -> render -> apply -> verify; diff at any time.
    """
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


def main(argv: list[str] | None = None) -> None:
    """Entry point: runs the CLI, turning expected errors into one line and an exit code."""
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
    except click.ClickException as e:
        e.show()
        sys.exit(2 if e.exit_code == 2 else e.exit_code)
    except click.exceptions.Abort:
        click.echo("gputopo: aborted", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        click.echo("gputopo: interrupted", err=True)
        sys.exit(130)
