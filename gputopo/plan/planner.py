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

from typing import Any

from gputopo.actions import (
    NVIDIA,
    PHASES,
    VFIO,
    Rebind,
    RemoveHostFile,
    RestartFallback,
    StartGuest,
    StopGuest,
    UpdateContainer,
    World,
    WriteHostFile,
    WriteServiceDropin,
)
from gputopo.formats.devn import dev_path
from gputopo.model.facts import Facts, Gpu, MemberRole
from gputopo.model.owner import HOST, Owner
from gputopo.model.state import ContainerState, CurrentState
from gputopo.plan.devices import device_update
from gputopo.plan.findings import Findings
from gputopo.plan.ha import ha_step
from gputopo.plan.mappings import mapping_changes, shrink_other_mappings
from gputopo.plan.model import ContainerTarget, GpuTarget, MappingTarget, Plan
from gputopo.plan.render import PERSISTENCE_PATHS, p2p_must_be_disabled, persistence_files
from gputopo.plan.restarts import (
    check_service_unit,
    container_restarts,
    environment_only,
    guest_restarts,
    maps_a_moving_gpu,
    service_target,
    stays_running,
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
from gputopo.plan.spec import Spec
from gputopo.plan.vm.consumers import VmPlan, plan_consumers
from gputopo.plan.vm.safety import MapView, check_guests, check_listed, check_restarts
from gputopo.plan.vm.sets import consumer_sets, map_order


def _targets(facts: Facts, owner_of: dict[str, Owner]) -> list[GpuTarget]:
    """Every GPU of ``facts`` with its owner and target driver (None: left with the host)."""
    target = []
    for g in facts.gpus:
        owner = owner_of.get(g.address, HOST)
        drv = NVIDIA if owner.is_container else VFIO if owner.is_vm else None
        target.append(
            GpuTarget(
                address=g.address,
                owner=owner,
                driver=drv,
                current_driver=g.driver,
                companions=g.companions,
                numa_node=g.numa_node,
                minor=g.minor,
                iommu_group=g.iommu_group,
            )
        )
    return target


def _persistence_actions(
    vfio_addresses: list[str], current: CurrentState, templates: str | None
) -> list[WriteHostFile | RemoveHostFile]:
    """Writes of the persistence files that differ, removals of those no longer wanted."""
    want = persistence_files(vfio_addresses, templates)
    actions: list[WriteHostFile | RemoveHostFile] = []
    for path in PERSISTENCE_PATHS:
        have = current.files.get(path)
        if path in want:
            if have != want[path]:
                actions.append(WriteHostFile(path=path, content=want[path]))
        elif have is not None:
            actions.append(RemoveHostFile(path=path))
    return actions


def _rebinds(facts: Facts, target: list[GpuTarget], keep_override: bool, pin_native: bool) -> list[Rebind]:
    """One Rebind per IOMMU group that is not yet where the target wants it. ``keep_override``
    pins VM GPUs to vfio-pci, ``pin_native`` container GPUs to nvidia (``driver_override``)."""
    rebinds: list[Rebind] = []
    seen_groups: set[Any] = set()
    for t in target:
        if t.driver is None:
            continue
        g = facts.gpu(t.address)
        assert g is not None
        gkey = g.iommu_group if g.iommu_group is not None else g.address
        keep = keep_override if t.driver == VFIO else pin_native
        if gkey in seen_groups or not _needs_rebind(g, t.driver, keep):
            continue
        seen_groups.add(gkey)
        members = {
            g.address: g.driver,
            **{m.address: m.driver for m in g.iommu_members if m.role != MemberRole.BRIDGE},
        }
        rebinds.append(
            Rebind(
                address=g.address,
                members=sorted(members),
                from_drivers=dict(sorted(members.items())),
                to_driver=t.driver,
                keep_override=keep,
            )
        )
    return rebinds


def _needs_rebind(g: Gpu, to: str, keep_override: bool) -> bool:
    others = [m for m in g.iommu_members if m.role != MemberRole.BRIDGE]
    if to == VFIO:
        if g.driver != VFIO or any(m.driver != VFIO for m in others):
            return True
        return keep_override and g.driver_override != VFIO
    if g.driver != NVIDIA or g.driver_override != (NVIDIA if keep_override else None):
        return True
    return any(m.driver == VFIO and m.role == MemberRole.FUNCTION for m in others)


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


def _shutdown_policy(stops: list[Any], spec: Spec) -> list[Any]:
    """``stops`` with the spec's shutdown timeout and force-stop permission on each guest stop."""
    pol = spec.policy
    return [
        a.model_copy(update={"shutdown_timeout": pol.shutdown_timeout, "force_stop": pol.force_stop})
        if isinstance(a, StopGuest)
        else a
        for a in stops
    ]


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
    if current.containers_known:
        # as apply's preflight: a container that is not there means the spec is for another
        # host, and every other finding would follow from that mistake
        for c in spec_node.containers:
            if c.vmid not in current.containers:
                found.refuse(
                    None, f"container {c.vmid} does not exist on node {node_name}", "no-such-container"
                )
        found.raise_if_refused()
    cts = {Owner.container(c.vmid): c for c in spec_node.containers}
    vms = {Owner.vm(m.name): m for m in spec_node.vms.mappings}

    held = held_by(held_now(facts, current, node_name), [*cts, *vms])
    selected, owner_of = assign(facts, cts, vms, found, held)
    placement = check_locality(facts, selected, held, spec, found)
    check_vm_gpus(facts, {a for a, o in owner_of.items() if o.is_vm}, found)
    for owner, c in cts.items():
        check_container(c, owner, selected.get(owner, []), spec, owner_of, found)
        check_service_unit(c, current.containers.get(c.vmid), len(selected.get(owner, [])), found)
    if facts.host.sev_snp and facts.host.iommu_mode == "pt":
        found.warn(
            "SEV-SNP is on but the IOMMU is in passthrough (iommu=pt); SEV-SNP needs it translating: "
            "drop iommu=pt from the kernel command line"
        )
    found.raise_if_refused()

    keep_override = spec.policy.keep_driver_override
    target = _targets(facts, owner_of)
    vfio_all = sorted({a for t in target if t.driver == VFIO for a in [t.address, *t.companions]})
    rebinds = _rebinds(facts, target, keep_override, spec.policy.pin_native_driver)
    consumers = spec_node.vms.consumers
    sets = consumer_sets(consumers, {m.name.lower(): selected.get(o, []) for o, m in vms.items()}, facts.nics)
    orders = {m.name: map_order(consumers, sets, m.name) for m in vms.values()}
    mappings, mapping_actions, changed_mappings = mapping_changes(
        node_name, cts, vms, selected, current, orders
    )
    ct_gpus = {a for a, o in owner_of.items() if o.is_container}
    if spec_node.vms.other_mappings == "shrink":
        shrunk, shrink_actions, shrunk_ids = shrink_other_mappings(node_name, set(mappings), current, ct_gpus)
        mappings.update(shrunk)
        mapping_actions += shrink_actions
        changed_mappings |= shrunk_ids
    view = MapView(
        node=node_name,
        before={mid: list(m.map) for mid, m in current.mappings.items()},
        after={
            **{mid: list(m.map) for mid, m in current.mappings.items() if mid not in mappings},
            **{mid: list(m.map) for mid, m in mappings.items() if m.map},
        },
        owner_of=owner_of,
        to_container={r.address for r in rebinds if r.to_driver == NVIDIA},
        managed={m.name for m in spec_node.vms.mappings},
    )
    vm_plan = plan_consumers(consumers, facts, current, view, found, sets)

    containers: list[ContainerTarget] = []
    updates: list[UpdateContainer] = []
    dropins: list[WriteServiceDropin] = []
    touched: set[int] = set()
    live: set[int] = set()  # containers whose devices change while they keep running
    settings_only: set[int] = set()  # containers whose drop-in changes only the environment
    p2p = p2p_must_be_disabled(facts)
    for owner, c in cts.items():
        gpus = sorted(selected.get(owner, []), key=lambda g: g.address)
        state = current.containers.get(c.vmid)
        if state is None:
            found.warn(f"container {c.vmid}: no configuration found on node {node_name}")
            state = ContainerState()
        devices, lxc, update = device_update(c, gpus, state.config)
        if update is not None:
            updates.append(update)
        if update is not None or maps_a_moving_gpu(state.config, facts, rebinds):
            touched.add(c.vmid)
            if stays_running(
                c,
                update,
                len(gpus),
                current,
                spec.policy.container_restart,
                _removed_stay_on_nvidia(update, state.config, facts, target),
            ):
                live.add(c.vmid)
                if update is not None:
                    update.live = True
                    if spec.policy.hotplug_failure == "restart" and (update.set or update.resolve):
                        update.fallback = RestartFallback(
                            shutdown_timeout=spec.policy.shutdown_timeout, force_stop=spec.policy.force_stop
                        )
        svc_target, dropin = service_target(c, len(gpus), state, p2p, templates, found)
        if dropin is not None:
            dropins.append(dropin)
            if c.vmid not in touched and environment_only(c, state, dropin, found):
                settings_only.add(c.vmid)  # written, the running service left alone
        containers.append(
            ContainerTarget(
                vmid=c.vmid,
                gpus=[g.address for g in gpus],
                device_mode=c.device_mode,
                devices=devices,
                lxc=lxc,
                mapping=c.mapping,
                service=svc_target,
            )
        )

    restart_services = {d.vmid for d in dropins} - settings_only
    ct_stops, ct_starts = container_restarts(spec_node, current, touched, restart_services, live)
    rebinding = {m for r in rebinds for m in r.members}
    vm_stops, vm_starts = _vm_restarts(
        spec_node, current, mappings, changed_mappings, rebinding, vm_plan, view, found
    )
    found.raise_if_refused()
    ct_stops, vm_stops = _shutdown_policy(ct_stops, spec), _shutdown_policy(vm_stops, spec)
    _warn_ha(current, [*ct_stops, *vm_stops, *ct_starts, *vm_starts], found)
    ha = ha_step(
        node_name, mappings, current, vm_plan.configs, found, bool(mapping_actions or vm_plan.updates)
    )
    actions: list[Any] = [
        *_persistence_actions(vfio_all, current, templates),
        *mapping_actions,
        *dropins,
        # VMs stop before the containers' services: a guest's shutdown (seconds to tens of
        # seconds, up to policy.shutdown_timeout) is then not part of the service's downtime
        *vm_stops,
        *ct_stops,
        *rebinds,
        *updates,
        *vm_plan.updates,
        *ct_starts,
        # after the service is back (outside its stop window: the step reads the cluster's
        # VMs again), before the VMs start, so that the HA manager starts them where it may
        *([ha] if ha is not None else []),
        *vm_starts,
    ]
    order = {p: i for i, p in enumerate(PHASES)}
    actions.sort(key=lambda a: order[a.phase])  # stable: keeps the order within a phase
    return Plan(
        node=node_name,
        target=target,
        containers=containers,
        vms=vm_plan.targets,
        mappings=mappings,
        kept_mappings={
            mid: MappingTarget(map=list(m.map), description=m.description)
            for mid, m in current.mappings.items()
            if mid not in mappings
        },
        p2p_disable=p2p,
        keep_override=keep_override,
        placement=placement,
        warnings=found.warnings,
        actions=actions,
    )


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


def _removed_stay_on_nvidia(
    update: UpdateContainer | None, config: dict[str, Any], facts: Facts, target: list[GpuTarget]
) -> bool:
    """True when a GPU whose device entry ``update`` deletes stays on nvidia (another container's)."""
    if update is None or not update.delete:
        return False
    by_minor = {g.minor: g.address for g in facts.gpus if g.minor is not None}
    drivers = {t.address: t.driver for t in target}
    for key in update.delete:
        path = dev_path(str(config.get(key, "")))
        if path.startswith("/dev/nvidia") and path[len("/dev/nvidia") :].isdigit():
            address = by_minor.get(int(path[len("/dev/nvidia") :]))
            if address is not None and drivers.get(address) == NVIDIA:
                return True
    return False


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
