"""Pasting ``gputopo plan --commands`` into a shell on a simulated node.

:class:`PastedShell` is one ``bash`` session, as an operator's terminal is: the printed commands
are sent to it one at a time, in order, and each must exit 0. ``pct``, ``qm``, ``pvesh`` and
``update-initramfs`` are the simulated node's (:func:`gputopo.sim.nodecli.install_tools`, first
on ``PATH``), with the real tools' syntax; everything else is the real shell and coreutils.

The one rewrite of the printed text (:func:`rewrite`): on a command's own line (never in its
here-document body, never in a ``pct`` line, whose paths are the container's), the host paths
``/etc/``, ``/proc/`` and ``/dev/nvidia*`` become the simulated root's, and ``/sys/`` becomes a staging tree with
the simulated sysfs's directories. A shell's ``echo VALUE > /sys/...`` only writes a file, so
after each command the bytes the shell wrote there are handed to the simulated kernel
(:meth:`gputopo.sim.kernel.SimKernel.write`, what the kernel does on that write) and the staged
file is removed: a write to an attribute that does not exist fails in the shell, as on a node.
"""

from __future__ import annotations

import os
import re
import subprocess
import uuid
from pathlib import Path

from gputopo.actions.shell import EOF
from gputopo.sim.kernel import SimKernel
from gputopo.sim.nodecli import install_tools

UNDO_MARK = "# ---- undo:"


def commands(text: str) -> list[str]:
    """The commands of ``text``: each line that is not blank or a comment, with the body of a
    here-document it opens."""
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        ln = lines[i]
        i += 1
        if not ln.strip() or ln.lstrip().startswith("#"):
            continue
        if ln.endswith(f"<<'{EOF}'"):
            body = []
            while lines[i] != EOF:
                body.append(lines[i])
                i += 1
            i += 1
            out.append("\n".join([ln, *body, EOF]))
        else:
            out.append(ln)
    return out


def sections(text: str) -> tuple[list[str], list[str]]:
    """(the steps' commands, the undo's commands) of what ``plan --commands`` printed."""
    forward, sep, undo = text.partition(UNDO_MARK)
    assert sep, f"no undo section in:\n{text}"
    return commands(forward), commands(undo.partition("\n")[2])


HOST_PATH = re.compile(r"(?<![\w/$.-])/(etc|proc|sys|dev(?=/nvidia))/")  # not /dev/stdin


def rewrite(command: str, root: Path, staging: Path) -> str:
    """``command`` with its host paths under the simulated root (see the module's docstring)."""
    head, sep, body = command.partition("\n")
    if head.startswith("pct "):
        return command

    def to(m: re.Match) -> str:
        return f"{staging if m.group(1) == 'sys' else root}/{m.group(1)}/"

    return HOST_PATH.sub(to, head) + sep + body


class PastedShell:
    """A bash session on the simulated host in ``sim_dir`` (its tools in ``work``/bin)."""

    def __init__(self, sim_dir: Path, work: Path):
        self.root = sim_dir / "root"
        self.staging = work / "staging"
        self.kernel = SimKernel(self.root)
        bin_dir = install_tools(work / "bin", sim_dir)
        pci = self.root / "sys/bus/pci"
        for d in [pci, *pci.glob("devices/*"), *pci.glob("drivers/*")]:
            (self.staging / d.relative_to(self.root)).mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, PATH=f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}", LC_ALL="C")
        self.proc = subprocess.Popen(
            ["bash", "--noprofile", "--norc"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=work,
        )
        self.log: list[str] = []

    def run(self, command: str) -> tuple[int, str]:
        """Send ``command``; (its exit status, what it printed). Its sysfs writes reach the
        simulated kernel before this returns (a write the kernel refuses raises)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        mark = uuid.uuid4().hex
        self.proc.stdin.write(
            f"{rewrite(command, self.root, self.staging)}\nprintf '\\n{mark} %s\\n' \"$?\"\n"
        )
        self.proc.stdin.flush()
        out = []
        while True:
            ln = self.proc.stdout.readline()
            assert ln, f"the shell ended during: {command}\n{''.join(out)}"
            if ln.startswith(mark):
                rc = int(ln.split()[1])
                break
            out.append(ln)
        for f in sorted(p for p in self.staging.rglob("*") if p.is_file()):
            value = f.read_text()
            f.unlink()
            self.kernel.write(str(f.relative_to(self.staging)), value)
        text = "".join(out).strip("\n")
        self.log.append(f"$ {command}\n{text}".rstrip())
        return rc, text

    def paste(self, cmds: list[str]) -> None:
        """Run ``cmds`` in order; an AssertionError names the first that does not exit 0."""
        for c in cmds:
            rc, out = self.run(c)
            assert rc == 0, f"exit {rc}: {c}\n{out}\n--- so far:\n" + "\n".join(self.log[-5:])

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)
