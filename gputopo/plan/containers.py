"""The containers' side of a plan: each container's target, the update of its device entries,
its service's drop-in, and which containers are touched, updated live, or only get new settings.
Pure."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gputopo.actions import NVIDIA, Rebind, RestartFallback, UpdateContainer, WriteServiceDropin
from gputopo.actions.devnodes_by_address import devn_addresses, nvidia_minors
from gputopo.formats.devn import dev_path
from gputopo.model.facts import Facts, Gpu
from gputopo.model.owner import Owner
from gputopo.model.state import ContainerState, CurrentState
from gputopo.plan.devices import device_update
from gputopo.plan.findings import Findings
from gputopo.plan.model import ContainerTarget, GpuTarget
from gputopo.plan.restarts import (
    environment_only,
    ha_managed,
    maps_a_moving_gpu,
    service_target,
    stays_running,
)
from gputopo.plan.spec import Container, Spec


@dataclass
class ContainerChanges:
    """What the plan does to the node's containers. ``touched``: containers whose devices change
    or map a moving GPU; ``live``: those of them updated while they keep running;
    ``settings_only``: containers whose drop-in changes only the environment."""

    containers: list[ContainerTarget] = field(default_factory=list)
    updates: list[UpdateContainer] = field(default_factory=list)
    dropins: list[WriteServiceDropin] = field(default_factory=list)
    touched: set[int] = field(default_factory=set)
    live: set[int] = field(default_factory=set)
    settings_only: set[int] = field(default_factory=set)


def plan_containers(
    facts: Facts,
    spec: Spec,
    cts: dict[Owner, Container],
    selected: dict[Owner, list[Gpu]],
    current: CurrentState,
    rebinds: list[Rebind],
    target: list[GpuTarget],
    p2p: bool,
    templates: str | None,
    node_name: str,
    found: Findings,
) -> ContainerChanges:
    """The changes to every container of ``cts`` that gets the GPUs ``selected`` for it.

    Warns about a container with no configuration on the node; the service checks refuse
    through ``found``.
    """
    out = ContainerChanges()
    for owner, c in cts.items():
        gpus = sorted(selected.get(owner, []), key=lambda g: g.address)
        state = current.containers.get(c.vmid)
        if state is None:
            found.warn(f"container {c.vmid}: no configuration found on node {node_name}")
            state = ContainerState()
        devices, lxc, update = device_update(c, gpus, state.config, facts.host.char_majors)
        if update is not None:
            update.addresses = devn_addresses(state.config, nvidia_minors(facts))
            out.updates.append(update)
        if update is not None or maps_a_moving_gpu(state.config, facts, rebinds):
            out.touched.add(c.vmid)
            stays = _removed_stay_on_nvidia(update, state.config, facts, target)
            if stays_running(c, update, len(gpus), current, spec.policy.container_restart, stays):
                out.live.add(c.vmid)
                if update is not None:
                    _update_live(update, spec, ha_managed(state))
        svc_target, dropin = service_target(c, len(gpus), state, p2p, templates, found)
        if dropin is not None:
            out.dropins.append(dropin)
            if c.vmid not in out.touched and environment_only(c, state, dropin, found):
                out.settings_only.add(c.vmid)  # written, the running service left alone
        out.containers.append(
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
    return out


def _update_live(update: UpdateContainer, spec: Spec, ha: bool) -> None:
    """Mark ``update`` as done on the running container, with the restart the spec allows when
    the hot-plug fails: never forced for an HA-managed container (``ha``), whose shutdown the
    HA manager makes without force, as every stop of one in the plan
    (:func:`gputopo.plan.restarts.with_shutdown_policy`)."""
    update.live = True
    if spec.policy.hotplug_failure == "restart" and (update.set or update.resolve):
        update.fallback = RestartFallback(
            shutdown_timeout=spec.policy.shutdown_timeout, force_stop=spec.policy.force_stop and not ha
        )


def _removed_stay_on_nvidia(
    update: UpdateContainer | None, config: dict[str, Any], facts: Facts, target: list[GpuTarget]
) -> bool:
    """True when a GPU whose device entry ``update`` deletes stays on nvidia: another
    container's, or one the spec leaves on the host (untouched, on nvidia now). The running
    container keeps its device node until it restarts, so it could still open that GPU; one
    that moves to vfio-pci is unusable to it anyway."""
    if update is None or not update.delete:
        return False
    by_minor = {g.minor: g.address for g in facts.gpus if g.minor is not None}
    drivers = {t.address: t.driver or t.current_driver for t in target}
    for key in update.delete:
        path = dev_path(str(config.get(key, "")))
        if path.startswith("/dev/nvidia") and path[len("/dev/nvidia") :].isdigit():
            address = by_minor.get(int(path[len("/dev/nvidia") :]))
            if address is not None and drivers.get(address) == NVIDIA:
                return True
    return False
