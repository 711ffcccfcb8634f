"""A plan as shell commands an operator can paste on the node (``gputopo plan --commands``).

Each action kind says what it runs as the node's own tools would run it
(:meth:`gputopo.actions.ActionModel.commands` and ``undo_commands``): ``pct``, ``qm`` and
``pvesh`` call the same API methods apply calls (pve-container ``src/PVE/CLI/pct.pm`` and
qemu-server ``PVE/CLI/qm.pm`` ``$cmddef``: ``set`` is the config's ``update_vm``, ``start`` and
``shutdown`` the status endpoints; ``pvesh`` any path), the sysfs writes are the ones
:class:`gputopo.adapters.sysfs.Binder` makes, in its order, and files are written whole with
their mode (``install -D -m``). A command is one entry of the list: one line, or a line ending
in a here-document and its body. :mod:`gputopo.actions.script` puts a plan's together.

What a command cannot know at plan time it computes on the node (a GPU's ``/dev/nvidia`` minor
once nvidia has bound it). Digests are left out: a pasted change is not guarded against one made
in between, as apply's is.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field

from gputopo.model.facts import Facts
from gputopo.model.state import CurrentState

EOF = "GPUTOPO_EOF"


def q(word: object) -> str:
    """One shell word."""
    return shlex.quote(str(word))


def line(*argv: object) -> str:
    """A command line of ``argv``, each word quoted as the shell needs it."""
    return " ".join(q(a) for a in argv)


def sysfs_write(path: str, value: str | None) -> str:
    """``echo VALUE > /sys/PATH``: the write the Binder makes (echo's newline is what the
    kernel strips from a driver name or an address; ``echo > driver_override``, a lone
    newline, clears it, fs/sysfs/file.c and drivers/pci/pci-sysfs.c driver_override_store)."""
    target = "/" + path.lstrip("/")
    return f"echo > {q(target)}" if value is None else f"echo {q(value)} > {q(target)}"


def with_text(command: str, text: str) -> str:
    """``command`` reading ``text`` on its stdin: a quoted here-document when ``text`` ends in a
    newline and no line of it is the delimiter, else ``printf``."""
    if text.endswith("\n") and EOF not in text.splitlines():
        return f"{command} <<'{EOF}'\n{text}{EOF}"
    return f"printf %s {q(text)} | {command}"


@dataclass
class CommandContext:
    """What the commands of a plan are made from: the facts and the state the plan was made
    from (an undo puts back what they show), the node's name, and readers the CLI fills in."""

    facts: Facts
    current: CurrentState
    node: str
    native_driver: Callable[[str], str | None] = lambda address: None  # the driver its modalias resolves to
    file_mode: Callable[[str], int | None] = lambda path: None  # a host file's mode now (None: unknown)
    # the parent directories of a host file that do not exist now, deepest first
    absent_dirs: Callable[[str], list[str]] = lambda path: []
    # a PCI function's driver_override now, for one the facts do not hold (a GPU's companion)
    read_override: Callable[[str], str | None] = lambda address: None
    notes: list[str] = field(default_factory=list)

    def override_of(self, address: str) -> str | None:
        """The driver_override of ``address`` (a GPU's from the facts)."""
        g = self.facts.gpu(address)
        return g.driver_override if g is not None else self.read_override(address)


# drivers that bind only what they are told to (gputopo.adapters.sysfs.OVERRIDE_DRIVERS)
OVERRIDE_DRIVERS = frozenset({"vfio-pci", "pci-stub"})
NATIVE = "(native)"  # a member on whichever native driver probed it, not known at plan time


class _Writes:
    """The sysfs writes of a move as ``echo`` commands, with each member's driver and override
    as they are after the writes so far (a write the Binder would skip is left out)."""

    def __init__(self, drivers: dict[str, str | None], overrides: dict[str, str | None]):
        self.drivers = dict(drivers)
        self.overrides = dict(overrides)
        self.out: list[str] = []

    def override(self, m: str, driver: str | None) -> None:
        if self.overrides[m] != driver:
            self.out.append(sysfs_write(f"sys/bus/pci/devices/{m}/driver_override", driver))
            self.overrides[m] = driver

    def unbind(self, m: str) -> None:
        drv = self.drivers[m]
        if drv == NATIVE:  # whichever driver it is on: through the device's own driver link
            self.out.append(sysfs_write(f"sys/bus/pci/devices/{m}/driver/unbind", m))
        elif drv is not None:
            self.out.append(sysfs_write(f"sys/bus/pci/drivers/{drv}/unbind", m))
        self.drivers[m] = None

    def probe(self, m: str, becomes: str | None) -> None:
        self.out.append(sysfs_write("sys/bus/pci/drivers_probe", m))
        self.drivers[m] = becomes


def move_group_writes(
    members: list[str],
    drivers: dict[str, str | None],
    overrides: dict[str, str | None],
    want: dict[str, str | None],
    keep_override: bool,
) -> list[str]:
    """The writes of :meth:`gputopo.adapters.sysfs.Binder.move_group` in its order, from each
    member's driver and override now to ``want`` (None: whichever native driver probes it):
    overrides set, every member unbound, then probed, then the overrides cleared unless kept; a
    member already there only gets its override right."""
    w = _Writes(drivers, overrides)
    todo = []
    for m in members:
        drv = w.drivers.get(m)
        if want[m] is None:
            if drv is not None and w.overrides[m] is None and drv not in OVERRIDE_DRIVERS:
                continue
        elif drv == want[m]:
            w.override(m, want[m] if keep_override else None)
            continue
        todo.append(m)
    for m in todo:
        w.override(m, want[m])
    for m in todo:
        if w.drivers.get(m) != want[m] or want[m] is None:
            w.unbind(m)
    for m in todo:
        if w.drivers.get(m) is None:
            w.probe(m, want[m])
    if not keep_override:
        for m in todo:
            w.override(m, None)
    return w.out


def restore_writes(
    members: list[str],
    drivers: dict[str, str | None],
    overrides: dict[str, str | None],
    want: dict[str, str | None],
    keep_override: bool,
) -> list[str]:
    """The writes of :meth:`gputopo.adapters.sysfs.Binder.restore` after
    :func:`move_group_writes`, back to ``drivers`` and ``overrides``: what had no driver is
    unbound, the rest unbound and probed by name (the driver as override), then every override
    as it was."""
    after = {m: want[m] if keep_override and want[m] is not None else None for m in members}
    w = _Writes({m: NATIVE if d is None else d for m, d in want.items()}, after)
    prev = {m: drivers.get(m) for m in members}
    for m, drv in prev.items():
        if drv is None:
            w.unbind(m)
    moving = [m for m, drv in prev.items() if drv is not None and w.drivers[m] != drv]
    for m in moving:
        w.override(m, prev[m])
        w.unbind(m)
    for m in moving:
        w.probe(m, prev[m])
    for m in members:
        w.override(m, overrides[m])
    return w.out
