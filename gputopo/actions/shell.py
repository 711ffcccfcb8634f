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
