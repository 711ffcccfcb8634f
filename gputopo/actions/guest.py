"""Containers and VMs: shut down before their devices change, started again after.

A shutdown sends Proxmox its ``timeout`` (the spec's ``policy.shutdown_timeout``) and
``forceStop=1`` only where the spec allows it (``policy.force_stop``): a guest that does not go
down in time is then stopped by force and the step warns so; otherwise the task fails
(``container did not stop``, ``VM quit/powerdown failed - got timeout``) and apply rolls back.
A task that ends ``WARNINGS: N`` succeeded: its warnings become the step's (``ctx.warn``).

A task's ``OK`` is not the guest's state: a guest that is an HA resource gets a ``hastart`` /
``hastop`` task that only asks the HA manager, ends ``OK`` at once and the guest moves seconds
later (pve-container API2/LXC/Status.pm and qemu-server API2/Qemu.pm, the
``vm_is_ha_managed`` branches of vm_start/vm_stop/vm_shutdown). So every start, stop and
shutdown waits until status/current says ``running`` / ``stopped`` (:func:`power`), within the
step's limit, before the next step (a rebind) may touch the guest's GPUs. A stop of an HA
resource also makes the HA manager write ``state stopped`` into ``ha/resources.cfg``
(pve-ha-manager HA/Manager.pm, the ``stop`` command): the stop's undo sets the requested state
back (``PUT /cluster/ha/resources/{sid}``, as ``ha-manager set`` does).
"""

from __future__ import annotations

import time
from typing import Literal

from gputopo.actions.base import (
    ActionModel,
    DiffContext,
    Phase,
    PreflightContext,
    Resource,
    RunningBefore,
    StepContext,
    World,
)
from gputopo.actions.dropin import load_dropin
from gputopo.actions.haguest import ha_requested, ha_stop, moved_away, take_back_start
from gputopo.actions.shell import CommandContext, line
from gputopo.errors import ProxmoxError
from gputopo.model.state import CurrentState
from gputopo.model.strict import Strict
from gputopo.ports import TaskResult

SHUTDOWN_TIMEOUT = 60  # Proxmox's own default (API2/LXC/Status.pm vm_shutdown, QemuServer.pm _do_vm_stop)


class GuestBefore(Strict):
    status: str  # running | stopped
    # an HA resource's requested state in ha/resources.cfg before the step (None: not one)
    ha_requested: str | None = None


def ha_sid(guest: str, vmid: int) -> str:
    """The HA resource id of a guest (pve-ha-manager Config.pm parse_sid): ``ct:101``, ``vm:201``."""
    return f"{'ct' if guest == 'lxc' else 'vm'}:{vmid}"


def guest_name(guest: str, vmid: int) -> str:
    return f"{'CT' if guest == 'lxc' else 'VM'} {vmid}"


def _record(current: CurrentState, guest: str, vmid: int, out: RunningBefore) -> None:
    if guest == "lxc":
        ct = current.containers.get(vmid)
        out.guests[f"lxc/{vmid}"] = ct.status if ct else "stopped"
    else:
        g = current.guests.get(vmid)
        out.guests[f"qemu/{vmid}"] = g.status if g else "stopped"


def power(
    ctx: StepContext,
    guest: str,
    vmid: int,
    action: str,
    shutdown_timeout: int = SHUTDOWN_TIMEOUT,
    force: bool = False,
) -> TaskResult:
    """Start, stop or shut down the guest and pass its task's warnings on (``ctx.warn``), and
    a forced shutdown as one more. Raises what ``ProxmoxPort.guest_action`` raises."""
    limit = ctx.timeouts.shutdown(shutdown_timeout) if action == "shutdown" else ctx.timeouts.guest
    t0 = time.monotonic()
    res = ctx.ports.proxmox.guest_action(
        guest,
        vmid,
        action,
        limit,
        shutdown_timeout=shutdown_timeout,
        force=force,
        on_task=lambda upid: ctx.task_started(upid, limit),
    )
    name = guest_name(guest, vmid)
    wait_status(ctx, guest, vmid, "running" if action == "start" else "stopped", t0 + limit, res.upid)
    for w in res.warnings:
        ctx.warn(f"{name} {action}: {w}")
    if res.forced:
        ctx.warn(
            f"{name} did not shut down within {shutdown_timeout} s; Proxmox stopped it by force "
            "(policy.force_stop)"
        )
    return res


def wait_status(ctx: StepContext, guest: str, vmid: int, want: str, deadline: float, upid: str = "") -> None:
    """Poll status/current until the guest is ``want`` (``running``, ``stopped``); raise
    ProxmoxError naming it when it is not by ``deadline`` (``time.monotonic()``). The task that
    asked for it may have ended long before: a ``hastart``/``hastop`` task only queues a request
    for the HA manager (its CRM and LRM work in 10 s rounds, pve-ha-manager HA/CRM.pm, LRM.pm)."""
    while True:
        try:
            now = ctx.ports.proxmox.guest_status(guest, vmid)
        except ProxmoxError:
            away = moved_away(ctx, guest, vmid) if ":hastart:" in upid else None
            if away is None:
                raise
            raise ProxmoxError(f"{guest_name(guest, vmid)} start", None, away) from None
        if now == want:
            return
        if time.monotonic() >= deadline:
            break
        time.sleep(ctx.timeouts.poll)
    name = guest_name(guest, vmid)
    ha = ":hastart:" in upid or ":hastop:" in upid
    raise ProxmoxError(
        f"{name} {'start' if want == 'running' else 'stop'}",
        None,
        f"its task ended OK but {name} is still {now}"
        + (
            f" (an HA resource: the HA manager moves it; see 'ha-manager status' on the node, task {upid})"
            if ha
            else f" (task {upid})"
        ),
    )


def _set_status(world: World, guest: str, vmid: int, status: str) -> None:
    if guest == "lxc" and vmid in world.current.containers:
        world.current.containers[vmid].status = status  # type: ignore[assignment]
    elif guest == "qemu" and vmid in world.current.guests:
        world.current.guests[vmid].status = status  # type: ignore[assignment]


def cli(guest: str) -> str:
    """The node's command line tool of a guest kind: ``pct`` or ``qm``."""
    return "pct" if guest == "lxc" else "qm"


def shutdown_command(guest: str, vmid: int, timeout: int = SHUTDOWN_TIMEOUT, force: bool = False) -> str:
    """``pct|qm shutdown VMID --timeout N [--forceStop 1]``: the API's shutdown with apply's
    parameters (pct.pm and qm.pm map ``shutdown`` to the status endpoint's ``vm_shutdown``)."""
    return line(cli(guest), "shutdown", vmid, "--timeout", timeout, *(["--forceStop", 1] if force else []))


def _was_running(current: CurrentState, guest: str, vmid: int) -> bool:
    g = current.containers.get(vmid) if guest == "lxc" else current.guests.get(vmid)
    return g is not None and g.status == "running"


class _GuestStep(ActionModel):
    """What stopping and starting a guest share: which guest, and its status before."""

    guest: Literal["lxc", "qemu"]
    vmid: int

    Before = GuestBefore

    def before(self, ctx: StepContext) -> GuestBefore:
        return GuestBefore(status=ctx.ports.proxmox.guest_status(self.guest, self.vmid))

    def preflight(self, ctx: PreflightContext) -> list[str]:
        """An HA resource in the HA manager's ``error`` state is neither stopped nor started by
        it: a ``stop`` command only acts on a started service (pve-ha-manager HA/Manager.pm
        next_state_started), ``ha-manager set --state started`` dies ``service ... in error
        state, must be disabled and fixed first`` (API2/HA/Resources.pm check_service_state), and
        only ``disabled`` leaves the state (next_state_error)."""
        st = (
            ctx.current.containers.get(self.vmid)
            if self.guest == "lxc"
            else ctx.current.guests.get(self.vmid)
        )
        if st is None or st.ha is None or st.ha.state != "error":
            return []
        if self.kind == "start_guest" and self.vmid in ctx.stopped_guests(self.guest):
            return []  # its stop says it
        sid = ha_sid(self.guest, self.vmid)
        return [
            f"{guest_name(self.guest, self.vmid)} is HA-managed ({sid}) and in the HA manager's error "
            f"state: the manager will not {'stop' if self.kind == 'stop_guest' else 'start'} it; fix it, "
            f"run 'ha-manager set {sid} --state disabled' and then '--state started' (or 'stopped')"
        ]

    def was_running(self, current: CurrentState, out: RunningBefore) -> None:
        _record(current, self.guest, self.vmid, out)

    @property
    def key(self) -> str:
        """``lxc/101``, ``qemu/201``: the guest as resources name it."""
        return f"{self.guest}/{self.vmid}"


class StopGuest(_GuestStep):
    """Shut the guest down: Proxmox waits ``shutdown_timeout`` s for it, then stops it by
    force only with ``force_stop`` (the spec's policy)."""

    kind: Literal["stop_guest"] = "stop_guest"
    phase: Phase = "stop"
    shutdown_timeout: int = SHUTDOWN_TIMEOUT
    force_stop: bool = False
    waits = "guest"
    counts_as = "guest restart"

    def describe(self) -> str:
        forced = f" (force-stop after {self.shutdown_timeout} s)" if self.force_stop else ""
        return f"stop {guest_name(self.guest, self.vmid)}{forced}"

    def stopped_guest(self) -> tuple[str, int]:
        return self.guest, self.vmid

    def before(self, ctx: StepContext) -> GuestBefore:
        ha = ctx.ports.proxmox.guest_ha(self.guest, self.vmid)
        return GuestBefore(
            status=ctx.ports.proxmox.guest_status(self.guest, self.vmid),
            ha_requested=ha.get("requested") if int(ha.get("managed") or 0) else None,
        )

    def do(self, ctx: StepContext) -> None:
        if not ctx.running(self.guest, self.vmid):
            return
        if ha_stop(ctx, self.guest, self.vmid, self.shutdown_timeout):
            return  # an HA resource: the HA manager stopped it (no force for a container)
        power(ctx, self.guest, self.vmid, "shutdown", self.shutdown_timeout, self.force_stop)

    def commands(self, ctx: CommandContext) -> list[str]:
        return [shutdown_command(self.guest, self.vmid, self.shutdown_timeout, self.force_stop)]

    def undo_commands(self, ctx: CommandContext) -> list[str]:
        out = (
            [line(cli(self.guest), "start", self.vmid)]
            if _was_running(ctx.current, self.guest, self.vmid)
            else []
        )
        g = (
            ctx.current.containers.get(self.vmid)
            if self.guest == "lxc"
            else ctx.current.guests.get(self.vmid)
        )
        ha = g.ha if g is not None else None
        if ha is not None and ha.managed and ha.requested is not None:
            # as undo() does: the HA manager wrote 'state stopped' when it took the stop
            out.append(line("ha-manager", "set", ha_sid(self.guest, self.vmid), "--state", ha.requested))
        return out

    def undo(self, before: GuestBefore, ctx: StepContext) -> str:
        done = []
        if before.status == "running" and not ctx.running(self.guest, self.vmid):
            # an HA resource's start is a hastart task: 'ha-manager set <sid> --state started'
            power(ctx, self.guest, self.vmid, "start")
            done.append(f"started {self.guest} {self.vmid}")
        if before.ha_requested is not None:
            sid = ha_sid(self.guest, self.vmid)
            now = ctx.ports.proxmox.guest_ha(self.guest, self.vmid).get("requested")
            if now != before.ha_requested:
                # the HA manager wrote 'state stopped' when it took the stop (HA/Manager.pm); left
                # so, it would keep the guest stopped, or stop it again
                ctx.ports.proxmox.ha_set_state(sid, before.ha_requested)
                done.append(f"set HA resource {sid} back to state {before.ha_requested}")
                if before.ha_requested == "started" and before.status == "running":
                    wait_status(ctx, self.guest, self.vmid, "running", time.monotonic() + ctx.timeouts.guest)
        return "; ".join(done)

    def undo_restores(self) -> set[Resource]:
        return {Resource("running", self.key)}

    def undo_needs(self) -> set[Resource]:
        # its undo starts it: a start of this apply undone first, its config back, every GPU on
        # its driver (a container's devN nodes exist only on nvidia; Proxmox refuses a missing
        # one) and, for a VM, the mappings its hostpciN lines name (a start looks each one up)
        needs = {Resource("stopped", self.key), Resource("config", self.key), Resource("driver")}
        if self.guest == "qemu":
            needs.add(Resource("mapping"))
        return needs

    def expect(self, world: World) -> None:
        _set_status(world, self.guest, self.vmid, "stopped")


class StartGuest(_GuestStep):
    kind: Literal["start_guest"] = "start_guest"
    phase: Phase = "start"
    waits = "guest"

    def describe(self) -> str:
        return f"start {guest_name(self.guest, self.vmid)}"

    def started_guest(self) -> tuple[str, int]:
        return self.guest, self.vmid

    def before(self, ctx: StepContext) -> GuestBefore:
        return GuestBefore(
            status=ctx.ports.proxmox.guest_status(self.guest, self.vmid),
            ha_requested=ha_requested(ctx, self.guest, self.vmid),
        )

    def do(self, ctx: StepContext) -> None:
        if not ctx.running(self.guest, self.vmid):
            power(ctx, self.guest, self.vmid, "start")

    def commands(self, ctx: CommandContext) -> list[str]:
        return [line(cli(self.guest), "start", self.vmid)]

    def undo_commands(self, ctx: CommandContext) -> list[str]:
        return (
            []
            if _was_running(ctx.current, self.guest, self.vmid)
            else [shutdown_command(self.guest, self.vmid)]
        )

    def undo(self, before: GuestBefore, ctx: StepContext) -> str:
        if before.status != "running" and before.ha_requested not in (None, "started"):
            # an HA resource's start only asked the HA manager: take the request back
            return take_back_start(ctx, self.guest, self.vmid, before.ha_requested)
        if before.status != "running" and ctx.running(self.guest, self.vmid):
            power(ctx, self.guest, self.vmid, "shutdown")
            return f"stopped {self.guest} {self.vmid}"
        return ""

    def undo_restores(self) -> set[Resource]:
        return {Resource("stopped", self.key)}

    def expect(self, world: World) -> None:
        _set_status(world, self.guest, self.vmid, "running")
        if self.guest == "lxc":
            load_dropin(world, self.vmid)  # its systemd boots with the drop-in on disk

    def diff(self, ctx: DiffContext) -> None:
        # a start after a stop of the same plan changes nothing that stays; a guest that is
        # stopped now and should run is a difference of its own
        now = (
            ctx.current.containers.get(self.vmid)
            if self.guest == "lxc"
            else ctx.current.guests.get(self.vmid)
        )
        if now is not None and now.status != "running":
            ctx.area("guests and services").lines.append(
                f"{guest_name(self.guest, self.vmid)} is stopped; the spec says it serves"
            )
