"""What reading a node's current state looks at: which containers (and the service inside
each), which VMs besides every VM of the node, which host files. Data only.

The planner's side says it for a spec (:func:`gputopo.plan.reads.spec_reads`); the reader
(:func:`gputopo.facts.current.read_current`) needs no spec, so reading the host does not
depend on planning."""

from __future__ import annotations

from dataclasses import dataclass

EXEC_TIMEOUT = 20.0  # seconds one read inside a container may take


@dataclass(frozen=True)
class ServiceRead:
    """A container's inference unit: its ``systemctl show`` and gputopo's drop-in (the path
    inside the container)."""

    unit: str
    dropin_path: str

    def show_argv(self) -> list[str]:
        """The unit's state, its command line and whether systemd knows it."""
        return ["systemctl", "show", "-p", "ActiveState", "-p", "ExecStart", "-p", "LoadState", self.unit]

    def dropin_argv(self) -> list[str]:
        """gputopo's drop-in of the unit, as it is now."""
        return ["cat", self.dropin_path]


@dataclass(frozen=True)
class ContainerRead:
    """A container to read, and its service when one is managed."""

    vmid: int
    service: ServiceRead | None = None


@dataclass(frozen=True)
class Reads:
    """What to read of one node. ``containers`` None: every container of the node (the
    topology view and export, which have no spec); ``vms``: VMs read even when the node does not
    list them (a VM the node lists is always read: it may use a mapping whose GPUs move);
    ``files``: host paths relative to the root."""

    containers: tuple[ContainerRead, ...] | None = None
    vms: tuple[int, ...] = ()
    files: tuple[str, ...] = ()


EVERY_GUEST = Reads()  # every container and VM of the node, no services, no host files
