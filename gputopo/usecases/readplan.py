"""Observe, then plan: the one read every use case that needs a plan makes.

Design of the use-case layer (``gputopo.usecases``, rank 9: above apply, verify, cluster, sim
and watch, below the CLI). Each module is one thing an operator does: a typed request in (a
frozen dataclass where it carries ports or callables, else a model on the Strict base), its
versioned document (:mod:`gputopo.model.documents`) or a typed result out, or a GputopoError.
The CLI parses options into the request, makes one call and prints the result.

What a plan is made of, in order, for every path (plan, diff, render, export's check, apply,
verify, the watch, the demo):

1. **the spec** (:func:`resolve_spec`): a spec file, or quick mode (``--split numa|half|auto``
   and its options, :class:`SpecSource`). With a connection, quick mode first looks inside the
   container for the unit that runs SGLang or vLLM (:func:`with_service`); the source it returns
   carries that unit, so every later step, the auto re-split included, keeps the service;
2. **observe** (:func:`gputopo.facts.observe.observe`): the facts and the current state the spec
   needs read, through the ports or from Proxmox's files;
3. **the final spec and the plan** (:func:`spec_and_plan`, pure): ``--split auto`` splits again
   knowing what the container and the mapping hold now (the fewest moves), from the same
   source, so the service found in 1. stays; then the planner.

A cluster path reads its nodes itself (over SSH, its state from the API): it calls
:func:`resolve_spec` for the spec its reads are made for, then :func:`spec_and_plan` with each
node's facts and current state (the pure half: no I/O). :func:`read_and_plan` is the same
three steps on one host through its ports (apply passes it down as its
:class:`gputopo.apply.ReadPlan`, called before the operator confirms and again under the lock);
:func:`planned` and :func:`read_inputs` are the CLI's (plan, diff, render), where the state may
also come from Proxmox's files; :func:`read_for_checks` is verify's and the watch's
(:class:`gputopo.verify.context.ReadForChecks`), which keeps an unreadable state or a refused
plan as what the checks report.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gputopo.errors import ConfigError, GputopoError, InputError, PlanRefused, SpecError
from gputopo.facts.units import UNSEEN
from gputopo.model.facts import Facts
from gputopo.model.state import CurrentState
from gputopo.plan.model import Plan
from gputopo.plan.spec import Spec
from gputopo.ports import Ports, ProxmoxReadPort
from gputopo.usecases.connect import Connection, host_root, node_for, pve_root, source_ports
from gputopo.usecases.notes import say, warn, warn_unfinished
from gputopo.usecases.specsource import SpecSource
from gputopo.verify.context import Reading

# quick mode: the spec field each option fills, so an error names the option the operator typed
_QUICK_OPTIONS = {
    "nodes[0].name": "--node",
    "nodes[0].containers[0].vmid": "--container",
    "nodes[0].containers[0].mapping": "--container-mapping",
    "nodes[0].containers[0].service.unit": "--service-unit",
    "nodes[0].containers[0].service.tp_flag": "--tp-flag",
    "nodes[0].vms.mappings[0].name": "--vm-mapping",
    "nodes[0].vms.consumers[0].vmid": "--vm",
}


@dataclass(frozen=True)
class ReadInputs:
    """What one read of a host gives a plan: the facts, the spec and the current state."""

    facts: Facts
    spec: Spec
    current: CurrentState


@dataclass(frozen=True)
class Planned:
    """A read of a host and the plan made from it."""

    facts: Facts
    spec: Spec
    current: CurrentState
    plan: Plan


def quick_spec(
    facts: Facts, source: SpecSource, node: str | None, current: CurrentState | None = None
) -> Spec:
    """The spec of quick mode for ``source``; ``current`` given: the auto split's fewest moves.

    Raises ConfigError naming the option whose value the spec refuses, SpecError when the host
    cannot be split that way.
    """
    from gputopo.plan.select import pick_node
    from gputopo.plan.starter import spec_from_split

    try:
        spec = spec_from_split(
            facts, split=source.split, node=node, current=current, **source.quick_options()
        )
        pick_node(spec, facts, None)
        return spec
    except SpecError as e:
        option = _QUICK_OPTIONS.get(e.field)
        if option is None:
            raise
        raise ConfigError(f"{option}: {e.expected}") from None


def container_status(proxmox: ProxmoxReadPort, vmid: int) -> str | None:
    """Container ``vmid``'s status on the API's node (``running``, ``stopped``), None when
    there is no such container there."""
    for guest in proxmox.list_guests("lxc"):
        if str(guest.get("vmid")) == str(vmid):
            return str(guest.get("status") or "unknown")
    return None


def require_container(ports: Ports, vmid: int) -> None:
    """Raises InputError (exit 2) when there is no container ``vmid`` on the API's node."""
    if container_status(ports.proxmox, vmid) is None:
        have = sorted(
            int(g["vmid"]) for g in ports.proxmox.list_guests("lxc") if str(g.get("vmid")).isdigit()
        )
        node = getattr(ports.proxmox, "node", None)
        where = f" on node {node}" if node else ""
        raise InputError(
            f"container {vmid} does not exist{where} (containers there: "
            f"{', '.join(map(str, have)) or 'none'}); give its vmid with --container"
        )


def with_service(ports: Ports, source: SpecSource) -> SpecSource:
    """``source`` with the unit inside its container whose command runs SGLang or vLLM, and the
    flag it spells (unless ``--tp-flag`` was given), when ``--service-unit`` is not given.

    A container that cannot be looked into is a one-line warning: the service is then not
    managed. A container that does not exist is not looked into: the plan refuses it, ``init``
    stops first (:func:`require_container`).
    """
    from gputopo.facts.units import find_inference_unit

    if source.service_unit:
        return source
    status = container_status(ports.proxmox, source.container)
    if status is None:
        return source
    if status != "running":
        # pct exec is lxc-attach into the container (pve-container src/PVE/CLI/pct.pm, exec),
        # which a stopped container cannot take: say so instead of what lxc-attach prints
        warn(f"container {source.container} is {status}: its inference unit cannot be looked for; {UNSEEN}")
        return source
    unit, why = find_inference_unit(ports.exec, source.container)
    if unit is None:
        warn(why)
        return source
    say(f"container {source.container}: {unit.unit} runs {unit.server} with {unit.tp_flag} {unit.tp}")
    flag = source.tp_flag if source.tp_flag_given else unit.tp_flag
    return replace(source, service_unit=unit.unit, tp_flag=flag)


def resolve_spec(facts: Facts, source: SpecSource, node: str | None) -> Spec:
    """The spec ``source`` names: its file, or quick mode's (``source`` should carry the service
    found inside the container already: :func:`with_service`).

    Raises ConfigError (both or neither given, an option the spec refuses), SpecError.
    """
    from gputopo.plan.spec import load_spec

    if source.spec_file and source.split:
        raise ConfigError("give either --spec FILE or --split, not both")
    if source.spec_file:
        return load_spec(source.spec_file)
    if not source.split:
        raise ConfigError("give --spec FILE, or --split numa --container N --vm-mapping NAME")
    return quick_spec(facts, source, node)


def final_spec(facts: Facts, current: CurrentState, source: SpecSource, spec: Spec, node: str | None) -> Spec:
    """The spec to plan once the current state is known: ``--split auto`` splits again knowing
    what the container and the mapping hold now (the fewest moves; the same container, mapping
    and service as ``source``, so the same reads); any other source's ``spec`` as it is."""
    if source.split == "auto" and not source.spec_file:
        return quick_spec(facts, source, node, current=current)
    return spec


def spec_and_plan(
    facts: Facts,
    current: CurrentState,
    source: SpecSource,
    spec: Spec,
    node: str | None = None,
    templates: str | None = None,
) -> tuple[Spec, Plan]:
    """The pure half of a plan, for a caller that read the host itself (a cluster's node):
    the final spec (:func:`final_spec`) and its plan. Raises PlanRefused, SpecError."""
    from gputopo.plan.planner import plan as make_plan

    spec = final_spec(facts, current, source, spec, node)
    return spec, make_plan(facts, spec, current, node=node, templates=templates)


def observe_for(
    host: str | Facts, spec: Spec, ports: Ports, node: str | None = None, ha: bool = True
) -> tuple[Facts, CurrentState]:
    """The facts of ``host`` (a root to discover, or facts already read) and the current state
    ``spec`` needs, through ``ports``, with each running service's model footprint (read through
    ``ports.ctfiles``, else pct exec); ``ha`` False leaves the cluster's HA placement unread."""
    from gputopo.facts.footprint import read_footprints
    from gputopo.facts.observe import observe
    from gputopo.plan.reads import spec_reads

    facts, current = observe(
        host,
        spec_reads(spec, node),
        proxmox=ports.proxmox,
        exec=ports.exec,
        files=ports.files,
        cluster=ports.cluster if ha else None,
    )
    # each served model's footprint, for the plan's capacity line (and its refusal)
    read_footprints(current, ports.ctfiles, ports.exec)
    return facts, current


def read_and_plan(
    spec: Spec, ports: Ports, root: str, node: str | None = None, ha: bool = True
) -> tuple[Facts, CurrentState, Plan]:
    """Discover ``root``, read the current state through ``ports`` and plan; ``ha`` False
    leaves the cluster's HA placement out (not read, not planned).

    Raises what observe and plan raise (RootError, SpecError, ProxmoxError, PlanRefused...).
    """
    from gputopo.plan.planner import plan as make_plan

    facts, current = observe_for(root, spec, ports, node, ha)
    return facts, current, make_plan(facts, spec, current, node=node)


def _from_files(spec: Spec, facts: Facts, root: str, conn: Connection) -> CurrentState:
    """The current state from Proxmox's files (no ``--sim``, ``--api-url`` or ``--local``)."""
    from gputopo.adapters.hostfiles import RealHostFiles
    from gputopo.adapters.pvefiles import PveFiles
    from gputopo.facts.observe import observe
    from gputopo.facts.snapshot import is_snapshot
    from gputopo.plan.reads import spec_reads
    from gputopo.plan.select import pick_node

    # a snapshot holds no /etc: its persistence files count as absent
    files = None if is_snapshot(root) else RealHostFiles(root)
    source = PveFiles(pve_root(conn), pick_node(spec, facts, conn.node).name)
    return observe(facts, spec_reads(spec, conn.node), proxmox=source, files=files).current


def _say_unit_unseen(source: SpecSource, current: CurrentState) -> None:
    """Warn that quick mode from Proxmox's files manages no service in a container it found:
    the files cannot show the unit the container runs (``--local`` looks inside it)."""
    if (
        source.split
        and not source.spec_file
        and not source.service_unit
        and source.container in current.containers
    ):
        warn(
            f"container {source.container}: Proxmox's files cannot show the unit it runs; {UNSEEN} "
            "(give --service-unit, or plan with --local)"
        )


def read_facts(root: str) -> Facts:
    """Discover ``root``: a host root directory or a ``gputopo snapshot`` archive."""
    from gputopo.facts.snapshot import discover_opened

    return discover_opened(root)


def read_inputs(conn: Connection, source: SpecSource) -> ReadInputs:
    """The facts, the spec and the current state for plan, diff and render, read from the host
    root and Proxmox's files or the API that ``conn`` names.

    Raises SpecError/ConfigError for bad input, ProxmoxError when the API fails.
    """
    root = host_root(conn)
    warn_unfinished(root)
    facts = read_facts(root)
    # a spec file is read first: the API names its node (or this host's), not the machine gputopo
    # runs on; quick mode looks into the container for its service, so it needs the ports
    spec = resolve_spec(facts, source, conn.node) if source.spec_file else None
    ports = source_ports(conn, default_node=node_for(conn, spec, facts.host.hostname))
    try:
        if spec is None:
            if ports is not None and source.split:
                source = with_service(ports, source)
            spec = resolve_spec(facts, source, conn.node)
        if ports is not None:
            current = observe_for(facts, spec, ports, conn.node)[1]
        else:
            current = _from_files(spec, facts, root, conn)
            _say_unit_unseen(source, current)
        return ReadInputs(facts, final_spec(facts, current, source, spec, conn.node), current)
    finally:
        if ports is not None:
            ports.close()


def planned(conn: Connection, source: SpecSource, templates: str | None = None) -> Planned:
    """:func:`read_inputs` and the plan of what it read (plan, render). Raises what
    :func:`read_inputs` raises, and PlanRefused."""
    from gputopo.plan.planner import plan as make_plan

    got = read_inputs(conn, source)
    p = make_plan(got.facts, got.spec, got.current, node=conn.node, templates=templates)
    return Planned(got.facts, got.spec, got.current, p)


def read_for_checks(spec: Spec, ports: Ports, root: str, node: str | None) -> Reading:
    """The read verify and the watch check against (:class:`gputopo.verify.context.ReadForChecks`):
    fresh facts of ``root``, the spec's node for this host, the current state through ``ports``
    (the cluster's HA placement left out) and the plan, an unreadable state or a refused plan
    kept as why not.

    Raises RootError when ``root`` holds no sysfs tree, SpecError when the spec names no node for
    this host: a state that cannot be read is what the checks report.
    """
    from gputopo.facts.discover import discover
    from gputopo.plan.planner import plan as make_plan
    from gputopo.plan.select import pick_node

    facts = discover(root)
    spec_node = pick_node(spec, facts, node)
    current: CurrentState | None = None
    current_error: str | None = None
    try:
        current = observe_for(facts, spec, ports, spec_node.name, ha=False)[1]
    except GputopoError as e:
        current_error = str(e)
    try:
        p = make_plan(facts, spec, current or CurrentState(), node=spec_node.name)
    except PlanRefused as e:
        return Reading(
            facts, spec_node, current, current_error, None, tuple(f"refused: {r}" for r in e.refusals)
        )
    return Reading(facts, spec_node, current, current_error, p)
