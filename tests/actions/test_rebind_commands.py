"""A rebind's commands are the sysfs writes gputopo's Binder makes, in its order: on a group with
an HDMI audio function (ESC8000A), to vfio-pci and back to nvidia, with the override kept or not,
and the undo's are :meth:`Binder.restore`'s. The Binder runs on the simulated kernel behind a port
that records each write; the commands' writes are read from the ``echo`` lines they print."""

from __future__ import annotations

import shlex

import pytest

from gputopo.actions import Rebind
from gputopo.actions.shell import CommandContext
from gputopo.adapters.sysfs import Binder
from gputopo.facts.discover import discover
from gputopo.facts.modalias import native_driver
from gputopo.model.state import CurrentState
from helpers.simkernel import ADA, ADA_AUDIO, kern, root  # noqa: F401 (fixtures)


class Recording:
    """A SysfsPort that records every write (path, value without its newline) and passes it on."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.root = kernel.root
        self.writes: list[tuple[str, str]] = []

    def write(self, path: str, value: str) -> None:
        self.writes.append((path.lstrip("/"), value.rstrip("\n")))
        self.kernel.write(path, value)


def echoed(commands: list[str]) -> list[tuple[str, str]]:
    """(path, value) of each ``echo [VALUE] > /PATH`` command (every command must be one)."""
    out = []
    for c in commands:
        words = shlex.split(c)
        assert words[0] == "echo" and words[-2] == ">" and len(words) in (3, 4), c
        out.append((words[-1].lstrip("/"), words[1] if len(words) == 4 else ""))
    return out


@pytest.mark.parametrize("keep", [True, False], ids=["override-kept", "override-cleared"])
def test_commands_are_the_binders_writes_there_and_back(kern, root, keep):
    port = Recording(kern)
    binder = Binder(port, root)
    members = [ADA, ADA_AUDIO]

    def context() -> CommandContext:
        return CommandContext(
            discover(str(root)),
            CurrentState(),
            "pve-test",
            native_driver=lambda a: native_driver(str(root), a),
            read_override=binder.override_of,
        )

    ctx = context()
    to_vfio = Rebind(
        address=ADA,
        members=members,
        from_drivers={m: binder.driver_of(m) for m in members},
        to_driver="vfio-pci",
        keep_override=keep,
    )
    assert to_vfio.from_drivers == {ADA: "nvidia", ADA_AUDIO: "snd_hda_intel"}
    # made before anything moves, as plan --commands makes them
    commands, undo = echoed(to_vfio.commands(ctx)), echoed(to_vfio.undo_commands(ctx))
    previous = binder.move_group(members, "vfio-pci", keep)
    assert commands == port.writes and port.writes
    port.writes.clear()
    binder.restore(previous)
    assert undo == port.writes and port.writes, (undo, port.writes)

    binder.move_group(members, "vfio-pci", True)
    port.writes.clear()
    ctx = context()
    back = Rebind(
        address=ADA,
        members=members,
        from_drivers={m: binder.driver_of(m) for m in members},
        to_driver="nvidia",
        keep_override=keep,
    )
    commands, undo = echoed(back.commands(ctx)), echoed(back.undo_commands(ctx))
    natives = {m: "nvidia" if m == ADA else native_driver(str(root), m) for m in members}
    previous = binder.move_group(members, None, keep, natives)
    assert {m: binder.driver_of(m) for m in members} == {ADA: "nvidia", ADA_AUDIO: "snd_hda_intel"}
    assert commands == port.writes and port.writes
    port.writes.clear()
    binder.restore(previous)
    assert undo == port.writes and port.writes, (undo, port.writes)
