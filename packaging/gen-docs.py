"""Write gputopo's man pages and its bash completion script from the CLI itself.

Run at package build time by ``packaging/build-deb.sh`` with a Python that imports gputopo (with
every command's dependencies) and click-man::

    python packaging/gen-docs.py --man DIR --bash FILE

``DIR`` receives ``gputopo.1`` and one page per command (``gputopo-apply.1``,
``gputopo-sim-serve.1`` ...), rendered by click-man from the same click tree that answers
``--help``; ``FILE`` receives what ``_GPUTOPO_COMPLETE=bash_source gputopo`` prints. The pages'
date is ``SOURCE_DATE_EPOCH`` when set (reproducible builds), else today. Exits non-zero when a
command's module cannot be imported: a package must not ship pages for fewer commands than exist.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import click


def loaded_cli() -> click.Group:
    """gputopo's root group with every lazily imported command loaded into ``commands``.

    click-man walks ``Group.commands``; the root group is lazy (its ``commands`` is empty and
    ``get_command`` imports on demand), so the commands are added the way click would find them.
    Raises ImportError naming the first command whose module cannot be imported.
    """
    from gputopo.cli import COMMANDS, cli

    ctx = click.Context(cli, info_name="gputopo")
    for name in COMMANDS:
        command = cli.get_command(ctx, name)  # raises for a shipped but unimportable command
        if command is None:
            raise ImportError(f"gputopo {name}: no such command in its module")
        cli.add_command(command, name)
    _whole_summaries(cli)
    return cli


def _whole_summaries(command: click.Command) -> None:
    """Give every command without a ``short_help`` its whole first sentence as one: click-man
    cuts the summary (the NAME line, the COMMANDS list) at 45 characters, a terminal's width
    in a man page has room for the sentence."""
    if command.short_help is None and command.help:
        command.short_help = command.get_short_help_str(limit=200)
    for sub in getattr(command, "commands", {}).values():
        _whole_summaries(sub)


def write_man_pages(target: Path) -> list[Path]:
    """Write one page per command (and group) into ``target``; returns the files written."""
    from click_man.core import write_man_pages as click_man_pages

    from gputopo import __version__

    target.mkdir(parents=True, exist_ok=True)
    click_man_pages("gputopo", loaded_cli(), version=__version__, target_dir=str(target))
    pages = sorted(target.glob("gputopo*.1"))
    for page in pages:
        page.write_text(_text_lines_escaped(page.read_text()))
    return pages


def _text_lines_escaped(page: str) -> str:
    """A help text line that starts with ``'`` (``'pct start' or ...``) is a control line to
    groff, which warns of an undefined macro and drops the line (groff(7): a line beginning with
    the control character ``.`` or the no-break control character ``'``). click-man writes its
    own macros with ``.`` only, so every line starting with ``'`` is text: the zero-width
    ``\\&`` in front makes it one."""
    return "".join("\\&" + ln if ln.startswith("'") else ln for ln in page.splitlines(keepends=True))


def bash_completion() -> str:
    """The bash completion script, as ``_GPUTOPO_COMPLETE=bash_source gputopo`` prints it."""
    from click.shell_completion import get_completion_class

    from gputopo.cli import cli

    bash = get_completion_class("bash")
    return bash(cli, {}, "gputopo", "_GPUTOPO_COMPLETE").source()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--man", type=Path, required=True, help="directory for the man pages")
    parser.add_argument("--bash", type=Path, required=True, help="file for the bash completion script")
    args = parser.parse_args(argv)
    pages = write_man_pages(args.man)
    args.bash.parent.mkdir(parents=True, exist_ok=True)
    args.bash.write_text(bash_completion())
    print(f"wrote {len(pages)} man pages to {args.man} and {args.bash}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
