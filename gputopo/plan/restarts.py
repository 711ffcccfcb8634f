"""What must stop and start again: containers whose devices change, services whose drop-in
changes, VMs whose passthrough devices move, and what the spec says serves but is stopped. Pure."""

from __future__ import annotations

import shlex
from typing import Any

from gputopo.actions import (
    Rebind,
    StartGuest,
    StartService,
    StopGuest,
    StopService,
    UpdateContainer,
    WriteServiceDropin,
)
from gputopo.formats.devn import dev_path, is_devn_key
from gputopo.formats.hostpci import hostpci_refs
from gputopo.formats.mapline import map_node, map_paths
from gputopo.formats.systemctl import parse_tp
from gputopo.model.facts import Facts, slot_of
from gputopo.model.state import ContainerState, CurrentState, ServiceState
from gputopo.plan.findings import Findings
from gputopo.plan.model import MappingTarget, ServiceTarget
from gputopo.plan.render import dropin_path, render_dropin
from gputopo.plan.spec import Container, Node, Spec

P2P_VAR = "NCCL_P2P_DISABLE"  # the template's variable that turns NCCL's peer-to-peer DMA off


def check_service_unit(c: Container, state: ContainerState | None, tp: int, found: Findings) -> None:
    """Refuse, before anything stops, a service the container does not have or whose unit's own
    command has no tensor-parallel flag: otherwise the container would be stopped and its GPUs moved, and the
    start at the end fail and roll everything back (two outages for a typo). Checked only when the
    service was read from the running container. One that could not be read there (``--api-url``
    from a machine without pct) is refused too unless the spec gives ``service.command``: planned
    without it, the new tensor-parallel size would be left out."""
    svc = state.service if state is not None else None
    if c.service is None or tp == 0:
        return
    if svc is None and state is not None and state.service_error and c.service.command is None:
        # without its command the drop-in (the new tensor-parallel size) would be left out
        found.refuse(
            None,
            f"container {c.vmid}: cannot read {c.service.unit}'s command ({state.service_error}): set "
            "service.command in the spec, or run gputopo on the node (--local)",
            "service-unreadable",
        )
        return
    if svc is None:
        return
    if not svc.found:
        found.refuse(
            None,
            f"container {c.vmid}: unit {c.service.unit} not found in the container (check service.unit)",
            "no-unit",
        )
        return
    # a spec's command is a base that gputopo completes with the flag; the unit's own command
    # must show the flag, or the drop-in would append it to something that is not the server
    if c.service.command is None and svc.exec_start is not None and parse_tp(svc.exec_start) is None:
        found.refuse(
            None,
            f"container {c.vmid}: {c.service.unit} runs without a tensor-parallel flag "
            f"({c.service.tp_flag}): {svc.exec_start[:80]}; set service.command",
            "no-tp-flag",
        )


def service_target(
    c: Container, tp: int, state: ContainerState, p2p: bool, templates: str | None, found: Findings
) -> tuple[ServiceTarget | None, WriteServiceDropin | None]:
    """(the service's target, the drop-in to write or None) for container ``c`` with ``tp`` GPUs.

    Without GPUs, or without a known command, the drop-in is not managed (a warning says why).
    """
    if c.service is None:
        return None, None
    svc_state = state.service
    command = c.service.command or (svc_state.exec_start if svc_state else None)
    svc_target = ServiceTarget(
        unit=c.service.unit,
        tp_flag=c.service.tp_flag,
        tp=tp,
        dropin=c.service.dropin,
        command=command,
        current_tp=_running_tp(svc_state),
    )
    if tp == 0:
        found.warn(f"container {c.vmid}: no GPUs left; {c.service.unit} is left alone")
        svc_target.command = None
        return svc_target, None
    if command is None:
        found.warn(
            f"container {c.vmid}: {c.service.unit} has no known command (set service.command); "
            "its drop-in is not managed"
        )
        return svc_target, None
    content = render_dropin(command, c.service.tp_flag, tp, p2p, templates)
    if svc_state is not None and svc_state.dropin == content:
        return svc_target, None
    return svc_target, WriteServiceDropin(
        vmid=c.vmid,
        unit=c.service.unit,
        path=dropin_path(c.service.unit, c.service.dropin),
        content=content,
        tp=tp,
    )


def _dropin_parts(text: str | None) -> tuple[str | None, dict[str, str], list[str]]:
    """(the command of its last ``ExecStart=``, its ``Environment=`` assignments, every other
    directive) of a drop-in's text; comments, blank lines and section headers are left out (a
    drop-in of gputopo's has one ``[Service]`` section)."""
    command: str | None = None
    env: dict[str, str] = {}
    other: list[str] = []
    for raw in (text or "").splitlines():
        line = raw.strip()
        if not line or line[0] in "#;[":
            continue
        key, _, value = line.partition("=")
        if key == "ExecStart":
            command = value.replace("%%", "%") or None  # an empty ExecStart= resets the list
        elif key == "Environment":
            try:
                words = shlex.split(value)
            except ValueError:
                words = value.split()
            env.update(w.partition("=")[::2] for w in words if "=" in w)
        else:
            other.append(line)
    return command, env, other


def _same_command(a: str, b: str) -> bool:
    try:
        return shlex.split(a) == shlex.split(b)
    except ValueError:
        return a.split() == b.split()


def environment_only(
    c: Container, state: ContainerState, dropin: WriteServiceDropin, found: Findings
) -> bool:
    """True when ``dropin`` changes nothing of container ``c``'s running service but its
    environment: the service is active, the drop-in's command is the one it runs (tensor-parallel
    size included) and no other directive changes. Called for a container whose GPUs do not move:
    the service is then left running (restarting it would be an outage for settings only), the
    drop-in is still written, and a warning says when its environment takes effect. systemd reads
    a changed drop-in only at a ``daemon-reload`` (or the container's boot), so a restart alone
    would still run the old one, as ``systemctl`` then warns; gputopo's own start of the service
    reloads first."""
    svc = state.service
    if c.service is None or svc is None or not svc.active or state.status != "running" or not svc.exec_start:
        return False
    command, env, other = _dropin_parts(dropin.content)
    _, old_env, old_other = _dropin_parts(svc.dropin)
    if command is None or not _same_command(command, svc.exec_start) or other != old_other:
        return False
    names = sorted(k for k in {*env, *old_env} if env.get(k) != old_env.get(k))
    if names:
        unit = c.service.unit
        found.warn(
            f"CT {c.vmid}: {unit} keeps running, its GPUs do not move: its new drop-in only changes its "
            f"environment ({', '.join(names)}), which takes effect at its next start after a daemon-reload "
            f"(the next plan that moves its GPUs, a restart of CT {c.vmid}, or `systemctl daemon-reload && "
            f"systemctl restart {unit}` in it)"
            + (
                "; until then peer-to-peer DMA stays on, which can corrupt data with SEV-SNP and a translating IOMMU"
                if env.get(P2P_VAR) == "1" != old_env.get(P2P_VAR)
                else ""
            )
        )
    return True


def _running_tp(svc: ServiceState | None) -> int | None:
    if svc is None:
        return None
    if svc.tp is not None:
        return svc.tp
    return parse_tp(svc.exec_start) if svc.exec_start else None


def maps_a_moving_gpu(config: dict[str, Any], facts: Facts, rebinds: list[Rebind]) -> bool:
    """True when a devN entry of ``config`` is the /dev/nvidiaN of a device being rebound: the
    container must stop before that GPU is unbound under it."""
    used_paths = {dev_path(v) for k, v in config.items() if is_devn_key(k)}
    for r in rebinds:
        for a in r.members:
            g = facts.gpu(a)
            if g is not None and g.minor is not None and f"/dev/nvidia{g.minor}" in used_paths:
                return True
    return False


def pve_major(version: str | None) -> int:
    """The major release of a Proxmox VE version (``9.1.2`` -> 9); 0 when unknown."""
    head = (version or "").split(".", 1)[0]
    return int(head) if head.isdigit() else 0


def stays_running(
    c: Container,
    update: UpdateContainer | None,
    gpus_after: int,
    current: CurrentState,
    policy: str,
    removed_stay_on_nvidia: bool,
) -> bool:
    """Whether container ``c`` can keep running while its GPUs change (``container_restart:
    auto``): Proxmox keeps the removal of a ``devN`` from a running container pending until its
    next start (pve-container LXC/Config.pm vmconfig_hotplug_pending: "skip" for devN deletes),
    and from PVE 9 on hot-plugs a new one (device_passthrough_hotplug, added in pve-container 6.x;
    earlier a new devN on a running container waits in [pve:pending] too). Legacy lxc.* lines
    and a container left without GPUs restart, and so does one whose removed GPUs stay on nvidia
    (another container's, or left on the host): until its restart it keeps their device nodes,
    which would still reach them (verify would find them in it). Removed GPUs that move to
    vfio-pci are unusable to it anyway: those removals wait for its next restart. So does a container whose service the spec does not name: gputopo could not stop
    what uses its GPUs inside it, and stopping the container is the only way it knows they are
    released (with a named service, preflight still refuses any other process in it that holds a
    moving GPU)."""
    if policy != "auto" or c.device_mode != "devN" or gpus_after == 0 or removed_stay_on_nvidia:
        return False
    if c.service is None:
        return False
    adds = update is not None and (bool(update.set) or bool(update.resolve))
    return not adds or pve_major(current.pve_version) >= 9


def service_may_run(state: ContainerState) -> bool:
    """Whether the service of a container in ``state`` may be running: read as active, or not
    read at all in a running container (``--api-url`` has no exec into a container, Proxmox's
    files tell nothing of it). One that cannot be seen counts as running, so every source plans
    the same stop before its GPUs move; stopping a unit that turns out to be stopped changes
    nothing."""
    if state.service is not None:
        return state.service.active
    return state.status == "running"


def container_restarts(
    spec_node: Node, current: CurrentState, touched: set[int], restart_services: set[int], live: set[int]
) -> tuple[list[StopService | StopGuest], list[StartGuest | StartService]]:
    """(stops, starts) of the containers and services: only what must stop, and what the spec
    says serves but is not running. A container in ``live`` whose devices change keeps running;
    only its service stops and starts again."""
    stops: list[StopService | StopGuest] = []
    starts: list[StartGuest | StartService] = []
    for c in spec_node.containers:
        state = current.containers.get(c.vmid) or ContainerState()
        running = state.status == "running"
        svc = c.service
        svc_active = service_may_run(state)
        if c.vmid in touched and running and c.vmid not in live:
            if svc is not None and svc_active:
                stops.append(StopService(vmid=c.vmid, unit=svc.unit))
            stops.append(StopGuest(guest="lxc", vmid=c.vmid))
            starts.append(StartGuest(guest="lxc", vmid=c.vmid))
            if svc is not None:
                starts.append(StartService(vmid=c.vmid, unit=svc.unit))
        elif (c.vmid in restart_services or c.vmid in touched) and running and svc is not None:
            if svc_active:
                stops.append(StopService(vmid=c.vmid, unit=svc.unit))
            starts.append(StartService(vmid=c.vmid, unit=svc.unit))
        elif c.vmid in current.containers and not running:
            # The spec says this container serves its GPUs: a stopped one is not converged.
            starts.append(StartGuest(guest="lxc", vmid=c.vmid))
            if svc is not None:
                starts.append(StartService(vmid=c.vmid, unit=svc.unit))
        elif svc is not None and state.service is not None and not svc_active:
            # The service state was read (pct exec) and it is not running.
            starts.append(StartService(vmid=c.vmid, unit=svc.unit))
    return stops, starts


def guest_restarts(
    spec_node: Node,
    current: CurrentState,
    mappings: dict[str, MappingTarget],
    changed_mappings: set[str],
    rebinding: set[str],
) -> tuple[list[StopGuest], list[StartGuest]]:
    """(stops, starts) of the running VMs that use a changed mapping, a mapping holding a device
    of this node being rebound, or such a device directly (``host=``). A mapping's lines for
    other nodes name their own devices (the same PCI path on another server is another GPU):
    they do not make this node's VMs stop."""
    affected = set(changed_mappings)
    node = spec_node.name
    for mid, m in {**mappings, **current.mappings}.items():
        if any(p in rebinding for e in m.map if map_node(e) in (node, None) for p in map_paths(e)):
            affected.add(mid)
    stops: list[StopGuest] = []
    starts: list[StartGuest] = []
    for vmid in spec_node.vms.guests or sorted(current.guests):
        gs = current.guests.get(vmid)
        if gs is None or gs.status != "running":
            continue
        hit = False
        for value in gs.hostpci:
            hosts, mapping = hostpci_refs(value)
            hit = hit or mapping in affected or any(a in hosts or slot_of(a) in hosts for a in rebinding)
        if hit:
            stops.append(StopGuest(guest="qemu", vmid=vmid))
            starts.append(StartGuest(guest="qemu", vmid=vmid))
    return stops, starts


def ha_managed(ct: ContainerState | None) -> bool:
    """True for a container the HA manager manages (its stops go through it, without force)."""
    return ct is not None and ct.ha is not None and ct.ha.managed


def with_shutdown_policy(stops: list[Any], spec: Spec, current: CurrentState) -> list[Any]:
    """``stops`` with the spec's shutdown timeout and force-stop permission on each guest stop;
    never force for an HA-managed container, whose shutdown the HA manager makes without it
    (:func:`gputopo.plan.ha.ha_container_stop_warning`), so the plan does not promise one."""
    pol = spec.policy

    def force(a: StopGuest) -> bool:
        return pol.force_stop and not (a.guest == "lxc" and ha_managed(current.containers.get(a.vmid)))

    return [
        a.model_copy(update={"shutdown_timeout": pol.shutdown_timeout, "force_stop": force(a)})
        if isinstance(a, StopGuest)
        else a
        for a in stops
    ]
