"""What every action kind shares: the base model, the registry, the undo order, and the
preflight's context (the other contexts are :mod:`gputopo.actions.context`'s, importable from here).

An action is one typed step of a plan (pyinfra's operations, terraform's resources): a pydantic
model whose class holds the kind's whole meaning, in one place:

* ``describe()`` -- one line for humans;
* ``preflight(ctx)`` -- problems to report before anything stops (``[]`` = go);
* ``before(ctx)`` -- the state it changes, as its ``Before`` model, enough to undo it later from the
  journal alone (a later process, after a crash);
* ``do(ctx)`` / ``undo(before, ctx)`` -- carry it out / put back what it changed; both idempotent
  (they check the state first), so finishing or rolling back a journal whose last step may or may
  not have happened is safe;
* ``expect(world)`` -- what the host looks like after it (rehearsing a plan, ``expected_after``);
* ``diff(ctx)`` -- its lines (and file diffs) in ``gputopo diff``;
* ``was_running(current, out)`` -- what ran before it that a rollback must start again;
* ``undo_restores()`` / ``undo_needs()`` -- the resources its undo puts back and those that must
  be back before it can run (see *Undo order* below);
* ``container_view(before)`` -- the GPU nodes a container it changes live saw before it (a
  rollback restarts one that sees others);
* ``signature()`` -- what must not change between the plan an operator confirmed and the one made
  under the lock (digests, read again before each write, are left out);
* ``commands(ctx)`` / ``undo_commands(ctx)`` -- the shell commands an operator could paste on the
  node instead (``pct``, ``qm``, ``pvesh``, sysfs writes, files), and those that undo it, made
  from the facts and state the plan was made from (:mod:`gputopo.actions.shell`).

Every kind registers itself by subclassing :class:`ActionModel` with a ``kind`` literal; apply,
recover, dry-run, ``expected_after`` and diff only ever call these methods, and
:func:`action_class` turns a journaled ``kind`` back into its class. Nothing else switches on
action types.

Undo order
----------
A rollback (and ``gputopo recover``, which runs the same one) undoes every begun step whose
undo has not completed, in the order :func:`undo_order` computes from what each kind declares:

* ``undo_restores()`` -- what its undo puts back as it was before the apply, each a
  :class:`Resource`: ``driver:<address>`` (a PCI function on its driver, with its
  driver_override), ``mapping:<id>``, ``config:lxc/<vmid>`` or ``config:qemu/<vmid>`` (a guest's
  config), ``file:<path>`` (a host file), ``dropin:<vmid>/<unit>``, ``running:<guest>`` (a guest
  that ran before runs again: the undo of a stop) and ``stopped:<guest or vmid/unit>`` (a guest
  or service the apply started is stopped again: the undo of a start), ``ha:placement`` (the
  cluster's HA rules or groups of the node's VMs);
* ``undo_needs()`` -- what must be back before its undo can run; a need named ``*`` (``mapping:*``)
  is every resource of that kind, for a step that cannot know which one (a VM's start needs the
  mappings its restored config names). A guest's start (the undo of its stop) needs its config,
  every GPU on its driver (a container's devN nodes exist only on nvidia, a VM's devices must be
  on vfio-pci) and, for a VM, every mapping; a container's devN entries need their /dev nodes
  (every GPU on its driver); a rebind needs the guests and services the apply started stopped
  again (they hold its GPUs); a drop-in needs its container running (``pct push``).

An undo runs after every other pending undo that restores something it needs, and two undos
that restore the same resource run newest first (each puts back what it found). Among the undos
free to run, the newest runs first, except that one that starts a guest waits while anything
else can run: a guest that ran before starts last, once everything it needs is back. A need
nobody pending restores is met already (undone by an earlier process, or never changed).
"""

from __future__ import annotations

import graphlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from pydantic import BaseModel

from gputopo.actions.context import (
    DiffArea,
    DiffContext,
    HaRules,
    RunningBefore,
    StepContext,
    Timeouts,
    World,
)
from gputopo.actions.shell import CommandContext
from gputopo.errors import GputopoError
from gputopo.model.facts import Facts, Holder
from gputopo.model.state import CurrentState
from gputopo.model.strict import Strict
from gputopo.ports import Ports

# the contexts, where every kind's module has always found them
__all__ = [
    "PHASES",
    "ActionModel",
    "DiffArea",
    "DiffContext",
    "HaRules",
    "Holder",
    "NoBefore",
    "Phase",
    "PreflightContext",
    "Resource",
    "RunningBefore",
    "StepContext",
    "Timeouts",
    "World",
    "action_class",
    "action_kinds",
    "stop_window",
    "undo_order",
]

Phase = Literal["prepare", "stop", "switch", "config", "start"]
PHASES: tuple[str, ...] = ("prepare", "stop", "switch", "config", "start")

ResourceKind = Literal["driver", "mapping", "config", "file", "dropin", "running", "stopped", "ha"]
EVERY = "*"


@dataclass(frozen=True, order=True)
class Resource:
    """Something an undo puts back as it was before the apply (see *Undo order* above):
    ``kind`` and ``name``; in a need, ``name`` ``*`` stands for every resource of the kind."""

    kind: ResourceKind
    name: str = EVERY

    def covers(self, other: Resource) -> bool:
        """Whether this need is met only once ``other`` is back."""
        return self.kind == other.kind and self.name in (EVERY, other.name)

    def __str__(self) -> str:
        return f"{self.kind}:{self.name}"


_KINDS: dict[str, type[ActionModel]] = {}


class NoBefore(Strict):
    """The before-state of a kind whose undo needs none."""


class ActionModel(Strict):
    """Base of every action kind. Subclasses set ``kind`` (a Literal) and ``phase``."""

    kind: str
    phase: Phase

    Before: ClassVar[type[BaseModel]] = NoBefore
    # consecutive steps of a parallel kind run at once, one worker each (IOMMU groups)
    parallel: ClassVar[bool] = False
    # the Timeouts field that bounds this kind's wait (None: it does not wait), shown with its progress
    waits: ClassVar[str | None] = None
    # what one step of this kind counts as in a plan's summary line ("rebind", "mapping change")
    counts_as: ClassVar[str | None] = None
    # it changes what the host reads at boot: the initramfs must be rebuilt after it
    changes_boot: ClassVar[bool] = False
    # part of the plan's signature (False: derived data the step plans again when it runs)
    in_signature: ClassVar[bool] = True

    @classmethod
    def __pydantic_init_subclass__(cls, **kw: Any) -> None:
        super().__pydantic_init_subclass__(**kw)
        field_ = cls.model_fields.get("kind")
        default = field_.default if field_ is not None else None
        if isinstance(default, str) and default:
            if default in _KINDS and _KINDS[default] is not cls:
                raise TypeError(f"action kind {default!r} registered twice")
            _KINDS[default] = cls

    # -- what every kind answers --------------------------------------------------------------

    def describe(self) -> str:
        raise NotImplementedError

    def preflight(self, ctx: PreflightContext) -> list[str]:
        """Problems that would make this step fail or harm a workload; [] when there are none."""
        return []

    def before(self, ctx: StepContext) -> BaseModel:
        return NoBefore()

    def do(self, ctx: StepContext) -> None:
        raise NotImplementedError

    def undo(self, before: Any, ctx: StepContext) -> str:
        """Put back what :meth:`do` changed; returns what was done (one line, '' for nothing)."""
        return ""

    def expect(self, world: World) -> None:
        """Change ``world`` the way this step changes the host."""

    def diff(self, ctx: DiffContext) -> None:
        """Add this step's lines (and file diffs) to ``ctx``."""

    def was_running(self, current: CurrentState, out: RunningBefore) -> None:
        """Record in ``out`` what ran before this step and must run again after a rollback."""

    def undo_restores(self) -> set[Resource]:
        """What :meth:`undo` puts back as it was before the apply (see *Undo order*)."""
        return set()

    def undo_needs(self) -> set[Resource]:
        """What must be back before :meth:`undo` can run (see *Undo order*)."""
        return set()

    def undo_rank(self) -> int | None:
        """Where this undo goes among consecutive undos that also rank (lowest first); None:
        it keeps its place. A GPU's return to nvidia ranks by the minor it had."""
        return None

    def devices(self) -> list[str]:
        """PCI addresses this step writes to (a step whose device hung is left alone)."""
        return []

    def stopped_guest(self) -> tuple[str, int] | None:
        """(``lxc``|``qemu``, vmid) of the guest this step stops, if it stops one."""
        return None

    def stopped_service(self) -> tuple[int, str] | None:
        """(container vmid, unit) of the service this step stops, if it stops one."""
        return None

    def container_view(self, before: Any) -> tuple[int, list[str]] | None:
        """(vmid, the GPU device nodes the running container saw before this step) for a step
        that changes a running container's devices (``before`` is its journaled before-state);
        None otherwise. A rollback restarts a container that sees other GPU nodes afterwards."""
        return None

    def started_guest(self) -> tuple[str, int] | None:
        """(``lxc``|``qemu``, vmid) of the guest this step starts, if it starts one."""
        return None

    def started_service(self) -> tuple[int, str] | None:
        """(container vmid, unit) of the service this step starts, if it starts one."""
        return None

    def serves(self) -> bool:
        """Whether this step stops or starts what serves: a container or its service (a VM's
        stop or start is not the inference service's downtime)."""
        guest = self.stopped_guest() or self.started_guest()
        service = self.stopped_service() or self.started_service()
        return service is not None or (guest is not None and guest[0] == "lxc")

    def load_before(self, data: dict[str, Any]) -> BaseModel:
        return self.Before.model_validate(data)

    def timeout(self, timeouts: Timeouts) -> float | None:
        """Seconds this step may wait (:attr:`waits` of ``timeouts``); None when it does not wait."""
        return getattr(timeouts, self.waits) if self.waits else None

    def commands(self, ctx: CommandContext) -> list[str]:
        """The shell commands that do what :meth:`do` does, in its order (``plan --commands``)."""
        raise NotImplementedError

    def undo_commands(self, ctx: CommandContext) -> list[str]:
        """The shell commands that put back what :meth:`commands` changed, as :meth:`undo`
        would from the state the plan was made from ([] when its undo does nothing)."""
        raise NotImplementedError

    def signature(self) -> dict[str, Any]:
        """This step as data, without what is read again right before it runs (``digest``)."""
        return self.model_dump(mode="json", exclude={"digest"})


def stop_window(actions: Sequence[ActionModel]) -> tuple[int, int] | None:
    """(first, last) positions in ``actions`` of the stop window, what the inference service is
    down for: from the first step that stops a container or its service to the last that starts
    one again. The VMs that must stop do so before it and start after it, so their shutdown is
    not the service's downtime. Without such steps (only VMs change), from the first stop step to
    the last start step. None when nothing stops or starts."""
    picked = [i for i, a in enumerate(actions) if a.serves() and a.phase in ("stop", "start")]
    if not picked:
        picked = [i for i, a in enumerate(actions) if a.phase in ("stop", "start")]
    if not picked:
        return None
    stops = [i for i in picked if actions[i].phase == "stop"]
    starts = [i for i in picked if actions[i].phase == "start"]
    return min(stops or starts), max(starts or stops)


def action_class(kind: str) -> type[ActionModel]:
    """The class of action ``kind``. Raises KeyError for a kind no module registered."""
    return _KINDS[kind]


def action_kinds() -> dict[str, type[ActionModel]]:
    """Every registered kind -> its class (in registration order)."""
    return dict(_KINDS)


def undo_order(pending: list[tuple[int, ActionModel]]) -> list[int]:
    """The order in which to undo ``pending`` (step index, action), given newest first: each
    undo after every other one that restores what it needs, two undos of the same resource
    newest first, and among those free to run the newest, a guest's start only when nothing
    else can run. Raises ValueError naming the steps whose needs form a cycle."""
    age = {n: i for i, (n, _) in enumerate(pending)}  # 0: the newest
    restores = {n: a.undo_restores() for n, a in pending}
    starts = {n for n, r in restores.items() if any(x.kind == "running" for x in r)}
    graph: dict[int, set[int]] = {n: set() for n, _ in pending}
    for n, a in pending:
        needs = a.undo_needs()
        for m, theirs in restores.items():
            if m == n:
                continue
            if any(need.covers(r) for need in needs for r in theirs):
                graph[n].add(m)
            if age[m] < age[n] and restores[n] & theirs:
                graph[n].add(m)  # the same resource: the newer undo first
    ts = graphlib.TopologicalSorter(graph)
    try:
        ts.prepare()
    except graphlib.CycleError as e:
        steps = ", ".join(str(n + 1) for n in sorted(set(e.args[1])))
        raise ValueError(f"the undo steps {steps} need each other") from None
    ready: set[int] = set()
    order: list[int] = []
    while ts.is_active():
        ready.update(ts.get_ready())
        n = min(ready, key=lambda k: (k in starts, age[k]))
        ready.discard(n)
        order.append(n)
        ts.done(n)
    return _ranked(order, dict(pending), restores)


def _ranked(
    order: list[int], actions: dict[int, ActionModel], restores: dict[int, set[Resource]]
) -> list[int]:
    """``order`` with each run of consecutive undos that rank (:meth:`ActionModel.undo_rank`)
    and restore nothing in common sorted by rank: no undo of such a run needs another's, so any
    order of it is as valid. The nvidia driver gives a GPU the lowest free minor (see
    :mod:`gputopo.actions.rebind`): GPUs bound back in the order of their old minors get them back."""
    out: list[int] = []
    run: list[int] = []
    for n in [*order, None]:
        rank = actions[n].undo_rank() if n is not None else None
        if rank is not None and not any(restores[n] & restores[m] for m in run):
            run.append(n)
            continue
        out += sorted(run, key=lambda m: actions[m].undo_rank() or 0)
        run = [n] if rank is not None else []
        if n is not None and rank is None:
            out.append(n)
    return out


@dataclass
class PreflightContext:
    """What a step's preflight may look at: the facts and state the plan was made from, the
    steps of the whole plan, and readers of the live host. Built by apply's preflight."""

    facts: Facts
    current: CurrentState
    ports: Ports
    actions: list[ActionModel]
    api_ok: bool
    driver_loaded: Callable[[str], bool]  # sys/bus/pci/drivers/<name> exists
    holders: Callable[[list[str]], dict[str, list[Holder]]]  # device node -> its holders
    drm_nodes: Callable[[str], list[str]]  # the /dev/dri names of a PCI device
    _cache: dict[str, Any] = field(default_factory=dict)

    def stopped_guests(self, kind: str) -> set[int]:
        """The guests of ``kind`` the plan stops before it switches drivers."""
        return {g[1] for g in (a.stopped_guest() for a in self.actions) if g is not None and g[0] == kind}

    def stopped_services(self) -> set[tuple[int, str]]:
        """(container vmid, unit) of the services the plan stops before it switches drivers."""
        return {s for s in (a.stopped_service() for a in self.actions) if s is not None}

    def running_vm_configs(self) -> dict[int, dict[str, Any]]:
        """vmid -> config of every running VM (one whose config cannot be read is left out),
        read once per preflight. Raises ProxmoxError when the VMs cannot be listed."""
        return self.cached("running-vms", self._read_running_vm_configs)

    def _read_running_vm_configs(self) -> dict[int, dict[str, Any]]:
        out: dict[int, dict[str, Any]] = {}
        for g in self.ports.proxmox.list_guests("qemu"):
            vmid = int(g["vmid"])
            if self.ports.proxmox.guest_status("qemu", vmid) != "running":
                continue
            try:
                out[vmid] = self.ports.proxmox.qemu_config(vmid)
            except GputopoError:
                continue
        return out

    def cached(self, key: str, make: Callable[[], Any]) -> Any:
        """``make()`` once per preflight (e.g. the list of running VMs and their configs)."""
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]
