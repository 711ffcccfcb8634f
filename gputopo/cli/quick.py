"""Command lines answered without click: ``gputopo --version``, ``gputopo --help`` (and ``gputopo``
alone) and ``gputopo discover --json``.

Importing click takes several times as long as starting Python, and discovery of a small host
takes less than either; so these command lines, the ones scripts and operators run most, are
recognised here by their exact shape and answered directly. Anything else (an option that is
not one of these, a value that looks like an option, ``--debug``, a terminal narrower than 80
columns for ``--help``, click's shell completion asking) returns False and goes to click, which
answers it, errors included, as before. tests/cli/test_cli_quick.py runs every form both ways and
compares the output.
"""

from __future__ import annotations

import os
import sys

from gputopo import __version__
from gputopo.cli.commands import COMMANDS, DESCRIPTION, SUMMARIES, report_error, version_message

# What click's shell completion sets (``_{PROG}_COMPLETE``) when it runs gputopo to ask.
COMPLETION_VAR = "_GPUTOPO_COMPLETE"

# The group's options as click lists them (gputopo.cli.group.cli, help option last).
_OPTIONS = [
    ("--version", "Show the version and exit."),
    ("--debug", "Show tracebacks for expected errors too."),
    ("-h, --help", "Show this message and exit."),
]


def answer(args: list[str]) -> bool:
    """Answer ``gputopo ARGS`` when it is one of the quick forms; False when click must.

    Raises SystemExit with the error's code for an expected error of discovery.
    """
    if COMPLETION_VAR in os.environ:
        return False  # click's shell completion asks with the command line it is completing
    if args == ["--version"]:
        sys.stdout.write(version_message() % {"prog": "gputopo", "version": __version__} + "\n")
        return True
    if args in ([], ["--help"], ["-h"]):
        text = help_text(_terminal_columns())
        if text is None:
            return False
        sys.stdout.write(text)
        return True
    if args[:1] == ["discover"]:
        options = discover_options(args[1:])
        if options is None or not options["json"]:
            return False  # the table needs rich anyway: click's cost is small next to it
        _discover_json(options)
        return True
    return False


# --- gputopo --help -----------------------------------------------------------------------------


def _terminal_columns() -> int:
    """The terminal's width as :func:`shutil.get_terminal_size` sees it (``COLUMNS`` first, else
    stdout's terminal, else 80), without importing shutil."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


def help_text(columns: int) -> str | None:
    """The group's help as click lays it out for a terminal ``columns`` wide, or None when the
    terminal is narrower than 80 columns or a line would need wrapping (click then does it)."""
    width = max(min(columns, 80) - 2, 50)  # click.formatting.HelpFormatter
    if width < 78 or any(name not in SUMMARIES for name in COMMANDS):
        return None  # the summaries are click's at 80 columns; a narrower terminal gets others
    lines = ["Usage: gputopo [OPTIONS] COMMAND [ARGS]...", ""]
    for paragraph in DESCRIPTION.split("\n\n"):
        text = " ".join(paragraph.split())
        if 2 + len(text) > width:
            return None
        lines += ["  " + text, ""]
    for title, rows in (("Options", _OPTIONS), ("Commands", [(n, SUMMARIES[n]) for n in sorted(COMMANDS)])):
        first = min(max(len(r[0]) for r in rows), 30) + 2
        if any(len(r[0]) > first - 2 or len(r[1]) > max(width - first - 2, 10) for r in rows):
            return None
        lines += [f"{title}:"] + [f"  {a}{' ' * (first - len(a))}{b}" for a, b in rows] + [""]
    return "\n".join(lines[:-1]) + "\n"


# --- gputopo discover --json --------------------------------------------------------------------


def discover_options(args: list[str]) -> dict | None:
    """``discover``'s options from ``args`` when each is one this module knows in a form click
    reads the same way (``--root DIR``, ``--root=DIR``, ``--gpu-match M`` (repeatable),
    ``--json``, ``--all``); None otherwise."""
    out: dict = {"root": None, "json": False, "all": False, "gpu_match": []}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("--json", "--all"):
            out[arg[2:]] = True
            i += 1
            continue
        name, eq, value = arg.partition("=")
        if name not in ("--root", "--gpu-match"):
            return None
        if not eq:
            if i + 1 >= len(args):
                return None
            i += 1
            value = args[i]
        if not value or value.startswith("-"):
            return None  # click's own reading of such a value (and its errors) are click's
        if name == "--root":
            out["root"] = value
        else:
            out["gpu_match"].append(value)
        i += 1
    return out


def _discover_json(options: dict) -> None:
    """What ``gputopo discover --json`` prints (gputopo.cli.discover.discover)."""
    import gc

    # Everything discovery builds lives until the process ends, a moment later, and so do the
    # modules it imports: collecting garbage would only walk those objects again and again (a
    # tenth of the run on a large host).
    gc.disable()

    from gputopo.facts.discover import discover, parse_gpu_match

    try:
        rules = [parse_gpu_match(v) for v in options["gpu_match"]] or None
        root = options["root"] or "/"
        if os.path.isdir(root):
            facts = discover(root, all_vendors=options["all"], gpu_match=rules)
        else:  # perhaps a snapshot archive
            from gputopo.facts.snapshot import opened_root

            with opened_root(root) as r:
                facts = discover(r, all_vendors=options["all"], gpu_match=rules)
    except Exception as e:
        # An expected error was raised by code that imported gputopo.errors to raise it;
        # discovery that goes well never needs it, so it is not imported here (a tenth of the run).
        errors = sys.modules.get("gputopo.errors")
        if errors is None or not isinstance(e, errors.GputopoError):
            raise
        report_error(e)
    facts.root = root
    sys.stdout.write(facts.to_json() + "\n")
    # The interpreter's exit collects garbage over every object still there, modules included,
    # ignoring gc.disable(): frozen objects it leaves alone (a twentieth of the run).
    gc.freeze()
