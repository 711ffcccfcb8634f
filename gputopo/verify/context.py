"""What the checks share, read once per verification: fresh facts, the current state, a fresh
plan (or why there is none), and each container's nvidia-smi rows and service properties.

The read itself (discover, observe, plan) is not made here: the caller hands a
:class:`ReadForChecks` (the use case's :func:`gputopo.usecases.readplan.read_for_checks`), which
:func:`checks_context` calls with ports whose ``exec`` answers ``systemctl show`` once per unit.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Protocol

from gputopo.errors import GputopoError, NvsmiParseError
from gputopo.formats.systemd import parse_show_properties, parse_systemctl_show
from gputopo.model.facts import Facts
from gputopo.model.state import ContainerState, CurrentState
from gputopo.plan.model import ContainerTarget, Plan
from gputopo.plan.spec import Container, Node, Service, Spec
from gputopo.ports import ExecPort, ExecResult, Ports
from gputopo.verify.parse import (
    QUERY_FIELDS,
    GpuRow,
    parse_gpu_rows,
)

EXEC_TIMEOUT = 30.0
NVSMI_ARGV = ["nvidia-smi", "--query-gpu=" + ",".join(QUERY_FIELDS), "--format=csv,noheader,nounits"]
SHOW_PROPS = ("ActiveState", "SubState", "ExecStart", "Environment", "LoadState")


def show_argv(unit: str) -> list[str]:
    """``systemctl show`` of every property verify reads (:data:`SHOW_PROPS`) of ``unit``."""
    argv = ["systemctl", "show"]
    for p in SHOW_PROPS:
        argv += ["-p", p]
    return argv + [unit]


class _ShowOnce:
    """An ExecPort over ``exec`` that runs ``systemctl show`` once per container and unit.

    The first ``systemctl show ... UNIT`` asks for all of :data:`SHOW_PROPS`; every later one,
    whatever properties it names, gets that same answer (or error). ``systemctl show -p`` prints
    only the properties asked for, one ``Key=value`` a line, and both its readers
    (:func:`gputopo.formats.systemd.parse_systemctl_show`, :func:`parse_show_properties`) pick
    lines by key, so the wider answer serves the current-state read and the checks alike.
    Every other command goes straight to ``exec``.
    """

    def __init__(self, exec: ExecPort):
        self._exec = exec
        self._show: dict[tuple[int, str], ExecResult | GputopoError] = {}

    def run(self, vmid: int, argv: list[str], timeout: float, input: str | None = None) -> ExecResult:
        if argv[:2] != ["systemctl", "show"] or len(argv) < 3 or input is not None:
            return self._exec.run(vmid, argv, timeout, input)
        key = (vmid, argv[-1])
        if key not in self._show:
            try:
                self._show[key] = self._exec.run(vmid, show_argv(argv[-1]), timeout)
            except GputopoError as e:
                self._show[key] = e
        got = self._show[key]
        if isinstance(got, GputopoError):
            raise got
        return got

    def push(self, vmid: int, path: str, content: str, mode: int = 0o644) -> None:
        self._exec.push(vmid, path, content, mode)


@dataclass(frozen=True)
class Reading:
    """One read of the host for the checks: the facts, the spec's entry of this node, the
    current state (or why it cannot be read) and the plan made from them (or its refusals)."""

    facts: Facts
    spec_node: Node
    current: CurrentState | None = None
    current_error: str | None = None
    plan: Plan | None = None
    plan_error: tuple[str, ...] = ()


class ReadForChecks(Protocol):
    """Reads the host under ``root`` through ``ports`` for the checks of ``spec``.

    Raises RootError when ``root`` holds no sysfs tree and SpecError when the spec names no node
    for this host; an unreadable current state or a refused plan is kept in the :class:`Reading`.
    """

    def __call__(self, spec: Spec, ports: Ports, root: str, node: str | None) -> Reading: ...


class Context:
    """Fresh facts, the current state and the plan of the spec's node (one :class:`Reading`),
    with the container reads the checks share (each made once)."""

    def __init__(
        self, spec: Spec, ports: Ports, exec: ExecPort, reading: Reading, root: str, http_timeout: float
    ):
        self.spec = spec
        self.ports = ports
        self.exec = exec
        self.root = root
        self.http_timeout = http_timeout
        self.start_vms = False  # the guest check runs on every VM of vms.consumers
        self.facts: Facts = reading.facts
        self.spec_node: Node = reading.spec_node
        self.node = self.spec_node.name
        self.current: CurrentState | None = reading.current
        self.current_error: str | None = reading.current_error
        self.plan: Plan | None = reading.plan
        self.plan_error: list[str] = list(reading.plan_error)
        self._smi: dict[int, tuple[list[GpuRow] | None, str | None]] = {}
        # container -> the KV-cache tokens its service reported to the inference check
        self.kv_reported: dict[int, int | None] = {}

    @property
    def no_plan(self) -> str | None:
        """Why there is no plan to check against, in a few words for the checks that need one
        (the converged check names the refusal or the read error in full: :attr:`refusal`);
        None when there is a plan."""
        if self.plan is not None:
            return None
        if not self.plan_error:
            return "no plan: the current state cannot be read (see converged)"
        return "the plan was refused (see converged)"

    @property
    def refusal(self) -> str | None:
        """The refused plan in one line: ``the spec was refused: ...`` with the first refusal
        and how many more; None when there is a plan or no refusal."""
        if self.plan is not None or not self.plan_error:
            return None
        more = f" (+{len(self.plan_error) - 1} more)" if len(self.plan_error) > 1 else ""
        return f"the spec was {self.plan_error[0]}{more}"

    @property
    def containers(self) -> list[Container]:
        """The spec's containers on this node."""
        return list(self.spec_node.containers)

    def target(self, vmid: int) -> ContainerTarget | None:
        """The plan's target for container ``vmid``; None without a plan or a target."""
        if self.plan is None:
            return None
        for ct in self.plan.containers:
            if ct.vmid == vmid:
                return ct
        return None

    def services(self, min_gpus: int = 1) -> Iterator[tuple[Container, Service, ContainerTarget]]:
        """(container, its service, its target) for each container with a service and at least
        ``min_gpus`` planned GPUs."""
        for c in self.containers:
            t = self.target(c.vmid)
            if c.service is not None and t is not None and len(t.gpus) >= min_gpus:
                yield c, c.service, t

    def container_state(self, vmid: int) -> ContainerState | None:
        """The container as the current state read it; None when unknown."""
        return self.current.containers.get(vmid) if self.current is not None else None

    def run(self, vmid: int, argv: list[str], what: str) -> tuple[str | None, str | None]:
        """(stdout, None) of ``argv`` in the container, or (None, why not: the error, or
        ``<what> exited N: <last line of stderr, else of stdout>``)."""
        try:
            res = self.exec.run(vmid, argv, EXEC_TIMEOUT)
        except GputopoError as e:
            # the checks put "CT <vmid>: " in front themselves; an ExecError already starts so
            return None, str(e).removeprefix(f"CT {vmid}: ")
        if res.rc != 0:
            text = (res.stderr.strip() or res.stdout.strip()).splitlines()
            return None, f"{what} exited {res.rc}" + (f": {text[-1]}" if text else "")
        return res.stdout, None

    def nvidia_smi(self, vmid: int) -> tuple[list[GpuRow] | None, str | None]:
        """(rows, None) or (None, why not), run once per container."""
        if vmid not in self._smi:
            self._smi[vmid] = self._read_smi(vmid)
        return self._smi[vmid]

    def _read_smi(self, vmid: int) -> tuple[list[GpuRow] | None, str | None]:
        out, err = self.run(vmid, list(NVSMI_ARGV), "nvidia-smi")
        if out is None:
            return None, err
        try:
            return parse_gpu_rows(out), None
        except NvsmiParseError as e:
            return None, str(e)

    def service_props(self, vmid: int, unit: str) -> tuple[dict[str, str] | None, str | None]:
        """(``systemctl show`` properties, None) or (None, why not), read once per container
        (the current-state read included)."""
        out, err = self.run(vmid, show_argv(unit), f"systemctl show {unit}")
        return (None, err) if out is None else (parse_show_properties(out), None)

    def service_command(self, vmid: int, unit: str) -> str | None:
        """The unit's effective ExecStart command line; None when it cannot be read."""
        props, _ = self.service_props(vmid, unit)
        if props is None:
            return None
        _, command = parse_systemctl_show("ExecStart=" + props.get("ExecStart", ""))
        return command


def services_not_run(ctx: Context) -> str | None:
    """Why the checks of the services (memory, service, inference) have nothing to run on: no
    service in the spec, no plan, or no service with GPUs planned; None when one has."""
    if not any(c.service is not None for c in ctx.containers):
        return "no service in the spec"
    if ctx.no_plan:
        return ctx.no_plan
    if next(ctx.services(), None) is None:
        return "no service with GPUs planned"
    return None


def checks_context(
    spec: Spec, ports: Ports, root: str, node: str | None, http_timeout: float, read: ReadForChecks
) -> Context:
    """The context of one verification: ``read`` made with ports whose ``exec`` runs each
    ``systemctl show`` once (shared with the checks). Raises what ``read`` raises."""
    exec = _ShowOnce(ports.exec)
    reading = read(spec, replace(ports, exec=exec), root, node)
    return Context(spec, ports, exec, reading, root, http_timeout)
