"""``gputopo sim shell``: a shell on a simulated host, where what ``gputopo plan --commands``
prints can be pasted (the session: :class:`gputopo.sim.hostshell.HostShell`)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import click


@click.command("shell")
@click.argument("dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "-c",
    "command",
    default=None,
    metavar="COMMANDS",
    help="Run COMMANDS (lines, as 'gputopo plan --commands' prints them) one at a time and exit; "
    "the first that fails stops them, its exit status the shell's.",
)
def shell(dir: Path, command: str | None) -> None:
    """A shell on the simulated host in DIR (a cluster's node: DIR/nodes/NODE), as a terminal on
    the node: $SHELL (or bash) with the node's pct, qm, pvesh, update-initramfs and
    nvidia-modprobe first on PATH, /etc, /proc and /dev/nvidia* of its commands under the
    simulated root, and each write to /sys handed to the simulated kernel once the command
    ends. Paste 'gputopo plan --sim DIR --commands' into it; 'exit' or Ctrl-D leaves it. A
    command that reads its standard input reads the lines that follow it."""
    from gputopo.errors import ConfigError
    from gputopo.sim.host import SimHost
    from gputopo.sim.hostshell import HostShell, commands

    host = SimHost.open(dir)  # a directory that holds no simulated host is refused here
    if command is not None and not commands(command):
        raise ConfigError("-c: no command in COMMANDS")
    work = Path(tempfile.mkdtemp(prefix="shell-", dir=host.paths.run))
    session = HostShell(host.dir, work, shell=os.environ.get("SHELL") or "bash", cwd=Path.cwd())
    try:
        rc = _run_all(session, commands(command)) if command is not None else _interactive(session, host.node)
    finally:
        ended = session.close()
        shutil.rmtree(work, ignore_errors=True)
    sys.exit(ended if rc is None else rc)


def _echo(line: str) -> None:
    sys.stdout.write(line)
    sys.stdout.flush()


def _run_all(session, cmds: list[str]) -> int | None:
    """Run ``cmds`` in order, their output as it comes; the exit status of the first that
    fails (the rest are not run), 0 when none does, None when the shell exited."""
    from gputopo.sim.hostshell import ShellEnded

    for c in cmds:
        try:
            rc, _ = session.run(c, echo=_echo)
        except ShellEnded:
            return None
        if rc != 0:
            click.echo(
                f"gputopo sim shell: exit {rc}: {c.splitlines()[0]}; the commands after it not run", err=True
            )
            return rc
    return 0


def _interactive(session, node: str) -> int | None:
    """Read commands from the terminal (or standard input) until 'exit' or end of input; the
    last command's exit status, None when the shell exited."""
    from gputopo.sim.hostshell import ShellEnded, commands, incomplete

    tty = sys.stdin.isatty()
    if tty:
        import readline  # noqa: F401 (line editing and history for input())

        click.echo(
            f"simulated node {node}: pct, qm and pvesh are its; /sys writes reach its kernel", err=True
        )
    rc = 0
    while True:
        lines: list[str] = []
        try:
            while True:
                prompt = ("> " if lines else f"{node}(sim)# ") if tty else ""
                lines.append(input(prompt) if tty else _read_line())
                if not incomplete("\n".join(lines)):
                    break
        except EOFError:
            if tty:
                click.echo(err=True)
            return rc
        text = "\n".join(lines)
        for c in commands(text):
            try:
                rc, _ = session.run(c, echo=_echo)
            except ShellEnded:
                return None


def _read_line() -> str:
    line = sys.stdin.readline()
    if not line:
        raise EOFError
    return line.rstrip("\n")
