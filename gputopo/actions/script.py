"""A plan's commands and its rollback's, as ``gputopo plan --commands`` prints them (each kind's
own come from its ``commands`` and ``undo_commands``, :mod:`gputopo.actions.shell`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from gputopo.actions.base import ActionModel, RunningBefore, World, undo_order
from gputopo.actions.shell import CommandContext, line


@dataclass
class Step:
    """One action's commands: its number in the plan, its line, what it runs."""

    number: int
    describe: str
    commands: list[str]


@dataclass
class Script:
    """A plan as commands: the steps in apply's order, then the rollback: each begun step's
    undo in :func:`gputopo.actions.undo_order`'s order, then what ran before started again."""

    steps: list[Step]
    after: list[str]
    undo: list[Step]
    restart: list[str]

    def text(self, node: str) -> str:
        out = [
            f"# gputopo plan --commands: node {node}; run as root on that node, one command at a time,",
            "# in this order. A command that fails: stop there and run the undo of the steps begun.",
        ]
        if not self.steps:
            return "\n".join([*out, "# No changes", ""])
        for s in self.steps:
            out.append(f"\n# step {s.number}: {s.describe}")
            out.extend(s.commands or ["# (nothing to run)"])
        if self.after:
            out.append("\n# after the last step: the next boot reads the files above from the initramfs")
            out.extend(self.after)
        out.append(
            "\n# ---- undo: what a rollback runs, newest step first where nothing forces another"
            "\n# order; leave out the steps that were not begun"
        )
        for s in self.undo:
            out.append(f"\n# undo of step {s.number}: {s.describe}")
            out.extend(s.commands or ["# (nothing to undo)"])
        if self.restart:
            out.append("\n# then start again what ran before")
            out.extend(self.restart)
        return "\n".join(out) + "\n"


def script(actions: Sequence[ActionModel], ctx: CommandContext) -> Script:
    """The commands of ``actions`` and of their rollback. Raises ValueError when the undo
    needs of the actions form a cycle (as :func:`gputopo.actions.undo_order`)."""
    # each step's commands from the state right before it, as apply reads it in ``before``:
    # the plan's state changed by the earlier steps' ``expect``
    world = World(ctx.facts.model_copy(deep=True), ctx.current.model_copy(deep=True))
    steps, undos = [], []
    for i, a in enumerate(actions):
        now = dataclasses.replace(
            ctx, facts=world.facts.model_copy(deep=True), current=world.current.model_copy(deep=True)
        )
        steps.append(Step(i + 1, a.describe(), a.commands(now)))
        undos.append(a.undo_commands(now))
        a.expect(world)
    after = ["update-initramfs -u -k all"] if any(a.changes_boot for a in actions) else []
    if after:
        after.append("# on a node that boots through proxmox-boot-tool, then: proxmox-boot-tool refresh")
    order = undo_order([(i, actions[i]) for i in reversed(range(len(actions)))])
    undo = [Step(n + 1, actions[n].describe(), undos[n]) for n in order]
    before = RunningBefore()
    for a in actions:
        a.was_running(ctx.current, before)
    started = {
        f"{g[0]}/{g[1]}" for g in (a.stopped_guest() for a in actions) if g is not None
    }  # their undo starts them
    restart = []
    for key, status in before.guests.items():
        if status == "running" and key not in started:
            kind, vmid = key.split("/")
            restart.append(line("pct" if kind == "lxc" else "qm", "start", vmid))
    for key, status in before.services.items():
        if status == "active":
            vmid, unit = key.split("/", 1)
            # restarted: a drop-in put back is read only at a (re)start
            restart.append(line("pct", "exec", vmid, "--", "systemctl", "daemon-reload"))
            restart.append(line("pct", "exec", vmid, "--", "systemctl", "restart", unit))
    return Script(steps, after, undo, restart)
