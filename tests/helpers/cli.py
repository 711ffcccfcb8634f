"""The command line run in this process through its real entry point (``gputopo.cli.main``)."""

from __future__ import annotations

from gputopo.cli import main


def run(capsys, *argv: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``gputopo ARGV``."""
    try:
        main(list(argv))
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    out, err = capsys.readouterr()
    return code, out, err


def one_line(err: str) -> str:
    """The one line of an error on stderr (a traceback or a second line fails the test)."""
    lines = err.strip("\n").splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    """:func:`run` with the arguments as one list: (exit code, stdout, stderr) of ``gputopo ARGS``."""
    return run(capsys, *args)
