"""The contexts every action kind works in: the timeouts, what a step's before/do/undo use
(:class:`StepContext`), what a plan turns the host into (:class:`World`), what ``gputopo diff``
collects (:class:`DiffContext`). The preflight's context, which names the plan's actions, is
:class:`gputopo.actions.base.PreflightContext`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from gputopo.errors import ConfigError, ExecError
from gputopo.model.facts import Facts, Holder
from gputopo.model.state import CurrentState, HaConfig
from gputopo.ports import (
    ClusterApiPort,
    ContainerSystemdPort,
    ExecResult,
    GroupBinder,
    PciMapping,
    Ports,
    ProxmoxReadPort,
)


@dataclass
class Timeouts:
    """Seconds each kind of operation may take before it counts as failed."""

    sysfs: float = 30.0  # one sysfs write (an unbind that blocks longer needs a human)
    guest: float = 300.0  # a container/VM start or shutdown task
    exec: float = 60.0  # one command in a container (systemctl stop/start)
    service: float = 900.0  # until the service reports active (model loading)
    poll: float = 0.1

    # the kinds an operator may set (CLI ``--timeout KIND=SECONDS``, the spec's policy.timeouts)
    KINDS: ClassVar[tuple[str, ...]] = ("sysfs", "guest", "exec", "service")

    def shutdown(self, shutdown_timeout: float) -> float:
        """Seconds a guest's shutdown task may run before it counts as hung: the guest timeout,
        and at least twice the shutdown's own timeout and 35 s more (an LXC shutdown that fails
        runs twice its timeout and 5 s more: pve-container LXC.pm vm_stop)."""
        return max(self.guest, 2 * shutdown_timeout + 35)

    def with_(self, seconds: dict[str, float]) -> Timeouts:
        """A copy with the kinds in ``seconds`` replaced. Raises KeyError naming an unknown kind."""
        unknown = sorted(set(seconds) - set(self.KINDS))
        if unknown:
            raise KeyError(unknown[0])
        return dataclasses.replace(self, **seconds)


@dataclass
class RunningBefore:
    """What ran before an apply and must run again after a rollback: guests (``lxc/101`` ->
    running|stopped) and services (``101/sglang.service`` -> active|inactive)."""

    guests: dict[str, str] = field(default_factory=dict)
    services: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class HaRules:
    """What the HA placement step (:class:`gputopo.actions.ha.PlaceHa`) reads and plans with
    when it runs: the reads are :mod:`gputopo.facts.ha`'s and the rules :mod:`gputopo.plan.ha`'s,
    layers above the actions, so apply hands them over with the step context."""

    # the HA configuration alone (rules or groups, resources)
    read: Callable[[ClusterApiPort], HaConfig]
    # the HA configuration with the members and their VMs with mapped devices, and every
    # mapping's map lines (id -> lines) as the Proxmox port lists them
    read_inputs: Callable[[ClusterApiPort, ProxmoxReadPort], tuple[HaConfig, dict[str, list[str]]]]
    # (node, managed mappings, map lines, configuration) -> (changes, warnings, the VMs in scope)
    plan: Callable[[str, set[str], dict[str, list[str]], HaConfig], tuple[list[Any], list[str], set[int]]]


@dataclass
class StepContext:
    """What a step's before/do/undo work with: the ports, the binder, systemd in the
    containers, the timeouts, and the bookkeeping a rollback shares between steps. Built by
    apply for one run (:func:`gputopo.apply.runner.step_context`)."""

    ports: Ports
    root: str
    timeouts: Timeouts
    binder: GroupBinder
    read_minors: Callable[[], dict[str, int | None]]  # address -> /dev/nvidia minor, read now
    device_present: Callable[[str], bool]  # the PCI device is on the bus
    native_driver: Callable[[str], str | None] = lambda address: None  # its native module's driver
    note: Callable[[str], None] = lambda text: None
    warn: Callable[[str], None] = lambda text: (
        None
    )  # something that succeeded with a warning (a task's WARNINGS)
    # journal a fact about the running step before it happens, for a later finish or undo of it
    # (a StepNote); and read back what earlier tries of the running step journaled so
    mark: Callable[[str], None] = lambda text: None
    marks: Callable[[], list[str]] = lambda: []
    # a guest's task Proxmox accepted: (UPID, seconds its step waits for it), journaled
    task_started: Callable[[str, float], None] = lambda upid, limit: None
    stuck: set[str] = field(default_factory=set)  # devices an undo must leave alone
    gone: set[str] = field(default_factory=set)  # devices a rollback found gone from the bus
    service_changed: set[int] = field(default_factory=set)  # containers whose drop-in an undo restored
    # the processes that hold device nodes open: node -> its holders (``/proc/<pid>/fd``)
    holders: Callable[[list[str]], dict[str, list[Holder]]] = lambda paths: {}
    drm_nodes: Callable[[str], list[str]] = lambda address: []  # the /dev/dri names of a PCI device
    # (container vmid, unit) of the services the plan stops, starts or starts again after a
    # rollback: an undo may stop one that holds a GPU it takes back (it started during the apply)
    services: set[tuple[int, str]] = field(default_factory=set)
    # (kind, vmid) of the guests the run's plan stops before its driver switch (set by the runner):
    # the switch checks each is really stopped before it moves a GPU
    stopped_guests: set[tuple[str, int]] = field(default_factory=set)
    # systemd in the containers (gputopo.adapters.systemctl.ExecSystemd); None where the context
    # was built without it: its steps' services cannot be started then
    systemd: ContainerSystemdPort | None = None
    # what the HA placement step reads and plans with when it runs; None: it cannot run
    ha: HaRules | None = None

    def exec(
        self, vmid: int, argv: list[str], check: bool = True, timeout: float | None = None
    ) -> ExecResult:
        """Run ``argv`` in container ``vmid`` for at most ``timeout`` seconds (the exec timeout
        when None). Raises ExecError when it fails (and ``check``) or times out."""
        res = self.ports.exec.run(vmid, argv, self.timeouts.exec if timeout is None else timeout)
        if check and res.rc != 0:
            raise ExecError(vmid, argv, res.rc, res.stderr)
        return res

    def running(self, kind: str, vmid: int) -> bool:
        return self.ports.proxmox.guest_status(kind, vmid) == "running"

    def systemctl(self) -> ContainerSystemdPort:
        """systemd in the containers. Raises ConfigError where the run was built without it."""
        if self.systemd is None:
            raise ConfigError("this run has no systemd client for the containers' services")
        return self.systemd

    def mapping(self, id: str) -> PciMapping | None:
        """The PCI mapping ``id`` as the API lists it (``map``, ``description``, ``digest``), or None."""
        for m in self.ports.proxmox.mappings():
            if m["id"] == id:
                return m
        return None

    def read_file_in(self, vmid: int, path: str) -> str | None:
        """A file's text inside container ``vmid``; None when it does not exist. Raises ExecError."""
        res = self.exec(vmid, ["cat", path], check=False)
        if res.rc == 0:
            return res.stdout
        if "No such file" in res.stderr:
            return None
        raise ExecError(vmid, ["cat", path], res.rc, res.stderr)


@dataclass
class World:
    """The facts and current state a plan turns into, step by step (see ``expected_after``).

    GPUs that reach nvidia without a known minor get the lowest free one, as the driver does,
    when :meth:`settle` runs (after the switch phase, before anything reads the minors).
    """

    facts: Facts
    current: CurrentState
    drivers: dict[str, str | None] = field(default_factory=dict)
    overrides: dict[str, str | None] = field(default_factory=dict)
    # container vmid -> (ExecStart, tp) of a drop-in written but not loaded yet: systemd shows
    # the old command until a daemon-reload or the container's next boot
    reloads: dict[int, tuple[str | None, int]] = field(default_factory=dict)

    def settle(self) -> None:
        if not self.drivers:
            return
        drivers = self.drivers
        used = {
            g.minor
            for g in self.facts.gpus
            if g.minor is not None and drivers.get(g.address, g.driver) == "nvidia"
        }
        for g in self.facts.gpus:
            if g.address in drivers:
                g.driver = drivers[g.address]
                g.driver_override = self.overrides.get(g.address)
                if g.driver == "nvidia" and g.minor is None:
                    g.minor = min(set(range(256)) - used)
                    used.add(g.minor)
                elif g.driver != "nvidia":
                    g.minor = None
            for m in g.iommu_members:
                if m.address in drivers:
                    m.driver = drivers[m.address]
        self.drivers = {}
        self.overrides = {}


@dataclass
class DiffArea:
    lines: list[str] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)  # path -> unified diff


@dataclass
class DiffContext:
    """What a step's diff may look at, and the areas it adds to."""

    plan: Any  # gputopo.plan.model.Plan
    spec: Any  # gputopo.plan.spec.Spec
    current: CurrentState
    rendered: dict[str, str]
    areas: dict[str, DiffArea]
    unified: Callable[[str, str | None, str | None], str]  # (path, before, after) -> unified diff
    render_pci_cfg: Callable[[list[dict[str, Any]]], str]  # sections -> pci.cfg text
    render_devices: Callable[[dict[str, Any], int], str]  # (container config, vmid) -> its GPU lines

    def area(self, name: str) -> DiffArea:
        return self.areas.setdefault(name, DiffArea())
