"""The planner: a pure function of (facts, spec, current state) -> the :class:`Plan`.

Decisions recorded here:

* The VM-side ``driver_override`` stays set after binding (``policy.keep_driver_override``), so a
  reprobe, a hot reset or an nvidia module reload cannot hand a VM GPU back to nvidia. Moving a
  GPU back to a container clears it.
* A mapping's ``map`` line names only the GPU function (``path=0000:81:00.0``): Proxmox passes
  the GPU's whole IOMMU group (the audio function included) to the VM anyway, and a line with
  ``path=A;B`` would mean two devices passed together, which Proxmox then checks one by one.
* A GPU whose ``/dev/nvidiaN`` minor is unknown (it is not on nvidia yet) is listed in its
  container's ``UpdateContainer.resolve``: apply reads the minor after the switch phase, once
  nvidia has bound it, and adds the entry in the same stop window (minors do not follow bus
  order and cannot be guessed). In legacy mode it gets its lines in the next plan.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from gputopo.actions import (
    PHASES,
    VFIO,
    Rebind,
    StartGuest,
    StopGuest,
    World,
)
from gputopo.capacity.estimate import Capacity
from gputopo.model.facts import Facts, Gpu, nvidia_gpus
from gputopo.model.owner import Owner
from gputopo.model.state import CurrentState
from gputopo.plan.binding import gpu_targets, needed_rebinds, persistence_actions
from gputopo.plan.capacity import check_capacity
from gputopo.plan.containers import ContainerChanges, plan_containers
from gputopo.plan.findings import Findings
from gputopo.plan.gone import refuse_gone_gpus
from gputopo.plan.ha import ha_container_stop_warning, ha_step
from gputopo.plan.model import MappingTarget, Plan
from gputopo.plan.render import p2p_must_be_disabled
from gputopo.plan.restarts import (
    check_service_unit,
    container_restarts,
    guest_restarts,
    with_shutdown_policy,
)
from gputopo.plan.select import (
    assign,
    check_container,
    check_locality,
    check_vm_gpus,
    held_by,
    held_now,
    pick_node,
)
from gputopo.plan.spec import Container, Node, Spec, VmMapping
from gputopo.plan.vm.consumers import VmPlan
from gputopo.plan.vm.safety import MapView, check_guests, check_listed, check_restarts
from gputopo.plan.vmside import NodeChoice, vm_side


def _vm_restarts(
    spec_node: Any,
    current: CurrentState,
    mappings: dict[str, MappingTarget],
    changed: set[str],
    rebinding: set[str],
    vm_plan: VmPlan,
    view: MapView,
    found: Findings,
) -> tuple[list[StopGuest], list[StartGuest]]:
    """(stops, starts) of VMs: those using a changed mapping or a moving device, consumers whose
    config changes, consumers the spec says run. A VM whose mapping would list a container's GPU
    (or have no device here) is never started, and a mapping a VM of the node names may not list
    a container's GPU after the plan: the plan is refused instead."""
    stops, starts = guest_restarts(spec_node, current, mappings, changed, rebinding)
    if not current.guest_status_known:
        for s in stops:
            found.warn(
                f"VM {s.vmid}: stopped and started again in case it runs (Proxmox's files cannot "
                "tell: plan with --local or --api-url to know)"
            )
    stopped = [s.vmid for s in stops]
    for vmid in vm_plan.restart:
        if vmid not in stopped:
            stops.append(StopGuest(guest="qemu", vmid=vmid))
            starts.append(StartGuest(guest="qemu", vmid=vmid))
            stopped.append(vmid)
    starts += [StartGuest(guest="qemu", vmid=v) for v in vm_plan.start]
    handled = {c.vmid for c in spec_node.vms.consumers}
    refused = check_guests(current, view, handled, set(stopped), found)
    configs = {vmid: g.config for vmid, g in current.guests.items()} | vm_plan.configs
    check_restarts([s.vmid for s in starts if s.vmid not in refused], configs, view, found)
    # a consumer the consumer checks refused has no planned config: its refusal says it all
    unplanned = handled - set(vm_plan.configs)
    check_listed(current, configs, view, refused | unplanned | {s.vmid for s in starts}, found)
    return stops, starts


def plan(
    facts: Facts,
    spec: Spec,
    current: CurrentState | None = None,
    *,
    node: str | None = None,
    templates: str | None = None,
) -> Plan:
    """Plan the changes that bring the host from ``current`` to what ``spec`` asks.

    Returns a :class:`Plan` (no actions when converged; the warnings found are its ``warnings``).
    Raises :class:`PlanRefused` with every :class:`Refusal` found when the spec cannot be carried
    out safely, SpecError when the spec names no node for this host, ConfigError for a broken
    user template.
    """
    current = current or CurrentState()
    spec_node = pick_node(spec, facts, node)
    node_name = spec_node.name
    found = Findings()
    _refuse_missing_containers(spec_node, current, found)
    refuse_gone_gpus(facts, current, spec_node, found)
    cts = {Owner.container(c.vmid): c for c in spec_node.containers}
    vms = {Owner.vm(m.name): m for m in spec_node.vms.mappings}
    selected, owner_of, placement, capacity, unknown = _select(
        facts, spec, current, node_name, cts, vms, found
    )

    target, vfio_all, rebinds = _drivers(facts, spec, owner_of)
    mappings, mapping_actions, changed_mappings, view, vm_plan = vm_side(
        facts, NodeChoice(spec_node, cts, vms, selected, owner_of, current, rebinds), found
    )
    p2p = p2p_must_be_disabled(facts)
    cp = plan_containers(
        facts, spec, cts, selected, current, rebinds, target, p2p, templates, node_name, found
    )

    guests = _guest_steps(
        spec, spec_node, current, cp, rebinds, mappings, changed_mappings, vm_plan, view, found
    )
    ha = ha_step(
        node_name, mappings, current, vm_plan.configs, found, bool(mapping_actions or vm_plan.updates)
    )
    persistence = persistence_actions(vfio_all, current, templates)
    actions = _in_order(persistence, mapping_actions, cp, guests, rebinds, vm_plan, ha)
    return Plan(
        node=node_name,
        target=target,
        containers=cp.containers,
        vms=vm_plan.targets,
        mappings=mappings,
        kept_mappings=_kept_mappings(current, mappings),
        p2p_disable=p2p,
        keep_override=spec.policy.keep_driver_override,
        placement=placement,
        capacity=capacity,
        capacity_unknown=unknown,
        warnings=found.warnings,
        actions=actions,
    )


def _drivers(facts: Facts, spec: Spec, owner_of: dict[str, Owner]) -> tuple[list[Any], list[str], list[Any]]:
    """Each GPU's target driver, every address that ends on vfio-pci (companions included), and
    the rebinds that take them there."""
    target = gpu_targets(facts, owner_of)
    vfio_all = sorted({a for t in target if t.driver == VFIO for a in [t.address, *t.companions]})
    rebinds = needed_rebinds(facts, target, spec.policy.keep_driver_override, spec.policy.pin_native_driver)
    return target, vfio_all, rebinds


def _kept_mappings(current: CurrentState, mappings: dict[str, MappingTarget]) -> dict[str, MappingTarget]:
    """The host's PCI mappings the spec does not manage, as they are."""
    return {
        mid: MappingTarget(map=list(m.map), description=m.description)
        for mid, m in current.mappings.items()
        if mid not in mappings
    }


class _Selected(NamedTuple):
    """Each owner's GPUs, each GPU's owner, the placement's lines, each served model's capacity
    and why a capacity is unknown."""

    selected: dict[Owner, list[Gpu]]
    owner_of: dict[str, Owner]
    placement: list[str]
    capacity: list[Capacity]
    unknown: list[str]


class _GuestSteps(NamedTuple):
    """The plan's stops and starts of containers and VMs."""

    ct_stops: list[Any]
    ct_starts: list[Any]
    vm_stops: list[Any]
    vm_starts: list[Any]


def _guest_steps(
    spec: Spec,
    spec_node: Node,
    current: CurrentState,
    cp: ContainerChanges,
    rebinds: list[Rebind],
    mappings: dict[str, MappingTarget],
    changed_mappings: set[str],
    vm_plan: VmPlan,
    view: MapView,
    found: Findings,
) -> _GuestSteps:
    """The containers and VMs that stop and start again, each stop with the spec's shutdown
    policy; a line per HA resource among them. Raises PlanRefused when a VM may not be
    (re)started (:func:`_vm_restarts`) or anything else was refused so far."""
    restart_services = {d.vmid for d in cp.dropins} - cp.settings_only
    ct_stops, ct_starts = container_restarts(spec_node, current, cp.touched, restart_services, cp.live)
    rebinding = {m for r in rebinds for m in r.members}
    vm_stops, vm_starts = _vm_restarts(
        spec_node, current, mappings, changed_mappings, rebinding, vm_plan, view, found
    )
    found.raise_if_refused()
    ct_stops, vm_stops = (
        with_shutdown_policy(ct_stops, spec, current),
        with_shutdown_policy(vm_stops, spec, current),
    )
    _warn_ha(current, [*ct_stops, *vm_stops, *ct_starts, *vm_starts], found)
    return _GuestSteps(ct_stops, ct_starts, vm_stops, vm_starts)


def _in_order(
    persistence: list[Any],
    mapping_actions: list[Any],
    cp: ContainerChanges,
    guests: _GuestSteps,
    rebinds: list[Rebind],
    vm_plan: VmPlan,
    ha: Any,
) -> list[Any]:
    """Every step of the plan in the order apply runs them: by phase, and within a phase in
    the order below."""
    actions: list[Any] = [
        *persistence,
        *mapping_actions,
        *cp.dropins,
        # VMs stop before the containers' services: a guest's shutdown (seconds to tens of
        # seconds, up to policy.shutdown_timeout) is then not part of the service's downtime
        *guests.vm_stops,
        *guests.ct_stops,
        *rebinds,
        *cp.updates,
        *vm_plan.updates,
        *guests.ct_starts,
        # after the service is back (outside its stop window: the step reads the cluster's
        # VMs again), before the VMs start, so that the HA manager starts them where it may
        *([ha] if ha is not None else []),
        *guests.vm_starts,
    ]
    order = {p: i for i, p in enumerate(PHASES)}
    return sorted(actions, key=lambda a: order[a.phase])  # stable: keeps the order within a phase


def _refuse_missing_containers(spec_node: Node, current: CurrentState, found: Findings) -> None:
    """Raise PlanRefused when a container of the spec's node is not on the host (as apply's
    preflight: the spec is then for another host, and every other finding would follow from that
    mistake). Nothing is checked when the containers could not be read."""
    if not current.containers_known:
        return
    for c in spec_node.containers:
        if c.vmid not in current.containers:
            found.refuse(
                None, f"container {c.vmid} does not exist on node {spec_node.name}", "no-such-container"
            )
    found.raise_if_refused()


def _select(
    facts: Facts,
    spec: Spec,
    current: CurrentState,
    node_name: str,
    cts: dict[Owner, Container],
    vms: dict[Owner, VmMapping],
    found: Findings,
) -> _Selected:
    """Which GPUs each owner gets, and the checks of that choice (each served model's capacity
    at its new tensor-parallel size among them). Raises PlanRefused when a check refuses it."""
    held = held_by(held_now(facts, current, node_name), [*cts, *vms])
    selected, owner_of = assign(facts, cts, vms, found, held)
    placement = check_locality(facts, selected, held, spec, found)
    check_vm_gpus(facts, {a for a, o in owner_of.items() if o.is_vm}, found)
    capacity: list[Capacity] = []
    unknown: list[str] = []
    for owner, c in cts.items():
        check_container(c, owner, selected.get(owner, []), spec, owner_of, found, facts.host.char_majors)
        state, tp = current.containers.get(c.vmid), len(selected.get(owner, []))
        check_service_unit(c, state, tp, found)
        cap, why = check_capacity(c, state, tp, spec, len(nvidia_gpus(facts)), found)
        capacity += [cap] if cap is not None else []
        unknown += [why] if why is not None else []
    if facts.host.sev_snp and facts.host.iommu_mode == "pt":
        found.warn(
            "SEV-SNP is on but the IOMMU is in passthrough (iommu=pt); SEV-SNP needs it translating: "
            "drop iommu=pt from the kernel command line"
        )
    found.raise_if_refused()
    return _Selected(selected, owner_of, placement, capacity, unknown)


def _warn_ha(current: CurrentState, steps: list[Any], found: Findings) -> None:
    """One line per HA resource the plan stops or starts: Proxmox hands its start, stop and
    shutdown to the HA manager (a ``hastart``/``hastop`` task that ends before the guest moves,
    pve-container API2/LXC/Status.pm, qemu-server API2/Qemu.pm), and the manager writes the
    requested state into ha/resources.cfg."""
    seen: set[tuple[str, int]] = set()
    for a in steps:
        key = a.stopped_guest() or a.started_guest()
        if key is None or key in seen:
            continue
        seen.add(key)
        kind, vmid = key
        st = current.containers.get(vmid) if kind == "lxc" else current.guests.get(vmid)
        if st is None or st.ha is None:
            continue
        name = f"{'CT' if kind == 'lxc' else 'VM'} {vmid}"
        sid = f"{'ct' if kind == 'lxc' else 'vm'}:{vmid}"
        found.warn(
            f"{name} is HA-managed ({sid}, requested state {st.ha.requested or 'unknown'}): its stop and "
            "start go through the HA manager, which moves it seconds after the task ends; apply waits "
            "for its real state before touching its GPUs, and a rollback sets the requested state back"
        )
        stop = next((x for x in steps if x.stopped_guest() == key), None)
        if kind == "lxc" and stop is not None:
            found.warn(ha_container_stop_warning(vmid, getattr(stop, "shutdown_timeout", 60)))


def expected_after(p: Plan, facts: Facts, current: CurrentState) -> tuple[Facts, CurrentState]:
    """What facts and current state look like once ``p`` has been applied successfully.

    Each step changes a copy of the host as it would change the host (``ActionModel.expect``),
    phase by phase; GPUs that reach nvidia without a known minor get the lowest free one, as the
    driver does. Used to rehearse a plan and to check that a converged host plans nothing.
    """
    world = World(facts=facts.model_copy(deep=True), current=current.model_copy(deep=True))
    for phase in PHASES:
        for a in p.actions:
            if a.phase == phase:
                a.expect(world)
        world.settle()
    return world.facts, world.current
