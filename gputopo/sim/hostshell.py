"""A shell on a simulated host, as an operator's terminal on the node: what ``gputopo plan
--commands`` prints, run there, reaches the simulated host (``gputopo sim shell DIR``, and the
tests that paste the printed commands).

:class:`HostShell` is one shell session (``bash`` by default): commands are sent to it one at a
time, in order. ``pct``, ``qm``, ``pvesh``, ``update-initramfs`` and ``nvidia-modprobe`` are the
simulated node's (:func:`gputopo.sim.nodecli.install_tools`, first on ``PATH``), with the real
tools' syntax; everything else is the real shell and coreutils.

The one rewrite of a command's text (:func:`rewrite`): on a command's own line (never in its
here-document body, never in a ``pct`` line, whose paths are the container's), the host paths
``/etc/``, ``/proc/``, ``/dev/nvidia*`` and a ``/sys/`` that is read become the simulated
root's, and a ``/sys/`` that a redirection writes (``> /sys/...``) becomes a staging tree with
the simulated sysfs's directories. A shell's ``echo VALUE > /sys/...`` only writes a file, so
after each command the bytes the shell wrote there are handed to the simulated kernel (:meth:`gputopo.sim.kernel.SimKernel.write`, what the kernel does on that write) and the
staged file is removed: a write to an attribute that does not exist fails in the shell, as on a
node.

A command that reads its standard input reads the commands that follow it: the session's input
is the command stream, as when a script is piped into a shell.
"""

from __future__ import annotations

import os
import re
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path

from gputopo.sim.kernel import SimKernel
from gputopo.sim.nodecli import install_tools

HOST_PATH = re.compile(r"(?<![\w/$.-])/(etc|proc|sys|dev(?=/nvidia))/")  # not /dev/stdin
HEREDOC = re.compile(r"<<-?\s*(['\"]?)(\w+)\1\s*$")  # a line that opens a here-document


class ShellEnded(Exception):
    """The shell exited (``exit``, or killed); ``rc`` is its exit status."""

    def __init__(self, rc: int):
        super().__init__(f"the shell exited with status {rc}")
        self.rc = rc


def commands(text: str) -> list[str]:
    """The commands of ``text``: each line that is not blank or a comment, with the body of a
    here-document it opens (up to its delimiter line) and the lines a trailing backslash
    continues it on."""
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        ln = lines[i]
        i += 1
        if not ln.strip() or ln.lstrip().startswith("#"):
            continue
        while ln.endswith("\\") and i < len(lines):
            ln = f"{ln}\n{lines[i]}"
            i += 1
        m = HEREDOC.search(ln)
        if m:
            body = []
            while i < len(lines) and lines[i] != m[2]:
                body.append(lines[i])
                i += 1
            i += 1
            out.append("\n".join([ln, *body, m[2]]))
        else:
            out.append(ln)
    return out


def incomplete(text: str) -> bool:
    """Whether ``text`` ends inside a command: a trailing backslash, or a here-document whose
    delimiter line has not come yet (an interactive shell reads on)."""
    lines = text.splitlines()
    if lines and lines[-1].endswith("\\"):
        return True
    open_delim = None
    for ln in lines:
        if open_delim is not None:
            if ln == open_delim:
                open_delim = None
            continue
        m = HEREDOC.search(ln)
        if m and not ln.lstrip().startswith("#"):
            open_delim = m[2]
    return open_delim is not None


def rewrite(command: str, root: Path, staging: Path) -> str:
    """``command`` with its host paths under the simulated root (see the module's docstring)."""
    head, sep, body = command.partition("\n")
    if head.startswith("pct "):
        return command

    def to(m: re.Match) -> str:
        written = m.string[: m.start()].rstrip(" \t'\"").endswith(">")
        return f"{staging if m.group(1) == 'sys' and written else root}/{m.group(1)}/"

    return HOST_PATH.sub(to, head) + sep + body


class HostShell:
    """A shell session on the simulated host in ``sim_dir``: its tools in ``work``/bin, its
    sysfs staging in ``work``/staging. ``shell``: the shell's path (bash by default); ``env``:
    variables over this process's; ``cwd``: where it runs (``work`` by default)."""

    def __init__(
        self,
        sim_dir: str | os.PathLike,
        work: str | os.PathLike,
        shell: str = "bash",
        env: dict[str, str] | None = None,
        cwd: str | os.PathLike | None = None,
    ):
        work = Path(work)
        self.root = Path(sim_dir) / "root"
        self.staging = work / "staging"
        self.kernel = SimKernel(self.root)
        bin_dir = install_tools(work / "bin", sim_dir)
        pci = self.root / "sys/bus/pci"
        for d in [pci, *pci.glob("devices/*"), *pci.glob("drivers/*")]:
            (self.staging / d.relative_to(self.root)).mkdir(parents=True, exist_ok=True)
        path = f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"
        argv = [shell, "--noprofile", "--norc"] if os.path.basename(shell) == "bash" else [shell]
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **(env or {}), "PATH": path},
            cwd=work if cwd is None else cwd,
        )

    def run(self, command: str, echo: Callable[[str], None] | None = None) -> tuple[int, str]:
        """Send ``command``; (its exit status, what it printed, stdout and stderr together).
        ``echo(line)``: each line as it comes. Its sysfs writes reach the simulated kernel
        before this returns (a write the kernel refuses raises). Raises ShellEnded when the
        shell exits."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        mark = uuid.uuid4().hex
        try:
            self.proc.stdin.write(
                f"{rewrite(command, self.root, self.staging)}\n"
                f"gputopo_status=$?; printf '\\n{mark} %s\\n' \"$gputopo_status\"; (exit $gputopo_status)\n"
            )
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise ShellEnded(self.proc.wait()) from None
        out: list[str] = []
        held = ""  # a bare newline: the one the mark's printf puts first, or the command's own
        while True:
            ln = self.proc.stdout.readline()
            if not ln:
                self._forward()
                raise ShellEnded(self.proc.wait())
            if ln.startswith(mark):
                rc = int(ln.split()[1])
                break
            if held:
                out.append(held)
                if echo is not None:
                    echo(held)
            held = ln if ln == "\n" else ""
            if not held:
                out.append(ln)
                if echo is not None:
                    echo(ln)
        self._forward()
        return rc, "".join(out).strip("\n")

    def _forward(self) -> None:
        """Hand what the shell wrote under the staging tree to the simulated kernel."""
        for f in sorted(p for p in self.staging.rglob("*") if p.is_file()):
            value = f.read_text()
            f.unlink()
            self.kernel.write(str(f.relative_to(self.staging)), value)

    def close(self) -> int:
        """End the session; returns the shell's exit status."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
        return self.proc.wait(timeout=30)
