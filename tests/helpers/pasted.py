"""Pasting ``gputopo plan --commands`` into a shell on a simulated node.

:class:`PastedShell` is :class:`gputopo.sim.hostshell.HostShell`, the session ``gputopo sim
shell`` runs (the simulated node's pct, qm and pvesh first on ``PATH``; host paths under the
simulated root; sysfs writes handed to the simulated kernel after each command), with each
pasted command required to exit 0 and a log of the last ones for the failure's message.
"""

from __future__ import annotations

from pathlib import Path

from gputopo.sim.hostshell import HostShell, commands, rewrite  # noqa: F401 (the helpers' names)

UNDO_MARK = "# ---- undo:"


def sections(text: str) -> tuple[list[str], list[str]]:
    """(the steps' commands, the undo's commands) of what ``plan --commands`` printed."""
    forward, sep, undo = text.partition(UNDO_MARK)
    assert sep, f"no undo section in:\n{text}"
    return commands(forward), commands(undo.partition("\n")[2])


class PastedShell(HostShell):
    """A bash session on the simulated host in ``sim_dir`` (its tools in ``work``/bin)."""

    def __init__(self, sim_dir: Path, work: Path):
        super().__init__(sim_dir, work, env={"LC_ALL": "C"})
        self.log: list[str] = []

    def run(self, command: str, echo=None) -> tuple[int, str]:
        rc, text = super().run(command, echo)
        self.log.append(f"$ {command}\n{text}".rstrip())
        return rc, text

    def paste(self, cmds: list[str]) -> None:
        """Run ``cmds`` in order; an AssertionError names the first that does not exit 0."""
        for c in cmds:
            rc, out = self.run(c)
            assert rc == 0, f"exit {rc}: {c}\n{out}\n--- so far:\n" + "\n".join(self.log[-5:])
