"""Containers and VMs: shut down before their devices change, started again after."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from gputopo.actions.base import ActionModel, DiffContext, Phase, RunningBefore, StepContext, World
from gputopo.model.state import CurrentState


class GuestBefore(BaseModel):
    model_config = ConfigDict(extra="forbid")

    status: str  # running | stopped


def guest_name(guest: str, vmid: int) -> str:
    return f"{'CT' if guest == 'lxc' else 'VM'} {vmid}"


def _record(current: CurrentState, guest: str, vmid: int, out: RunningBefore) -> None:
    if guest == "lxc":
        ct = current.containers.get(vmid)
        out.guests[f"lxc/{vmid}"] = ct.status if ct else "stopped"
    else:
        g = current.guests.get(vmid)
        out.guests[f"qemu/{vmid}"] = g.status if g else "stopped"


def _set_status(world: World, guest: str, vmid: int, status: str) -> None:
    if guest == "lxc" and vmid in world.current.containers:
        world.current.containers[vmid].status = status  # type: ignore[assignment]
    elif guest == "qemu" and vmid in world.current.guests:
        world.current.guests[vmid].status = status  # type: ignore[assignment]


class _GuestStep(ActionModel):
    """What stopping and starting a guest share: which guest, and its status before."""

    guest: Literal["lxc", "qemu"]
    vmid: int

    Before = GuestBefore

    def before(self, ctx: StepContext) -> GuestBefore:
        return GuestBefore(status=ctx.ports.proxmox.guest_status(self.guest, self.vmid))

    def was_running(self, current: CurrentState, out: RunningBefore) -> None:
        _record(current, self.guest, self.vmid, out)


class StopGuest(_GuestStep):
    kind: Literal["stop_guest"] = "stop_guest"
    phase: Phase = "stop"
    waits = "guest"
    counts_as = "guest restart"

    def describe(self) -> str:
        return f"stop {guest_name(self.guest, self.vmid)}"

    def stopped_guest(self) -> tuple[str, int]:
        return self.guest, self.vmid

    def do(self, ctx: StepContext) -> None:
        if ctx.running(self.guest, self.vmid):
            ctx.ports.proxmox.guest_action(self.guest, self.vmid, "shutdown", ctx.timeouts.guest)

    def undo(self, before: GuestBefore, ctx: StepContext) -> str:
        if before.status == "running" and not ctx.running(self.guest, self.vmid):
            ctx.ports.proxmox.guest_action(self.guest, self.vmid, "start", ctx.timeouts.guest)
            return f"started {self.guest} {self.vmid}"
        return ""

    def expect(self, world: World) -> None:
        _set_status(world, self.guest, self.vmid, "stopped")


class StartGuest(_GuestStep):
    kind: Literal["start_guest"] = "start_guest"
    phase: Phase = "start"
    waits = "guest"

    def describe(self) -> str:
        return f"start {guest_name(self.guest, self.vmid)}"

    def do(self, ctx: StepContext) -> None:
        if not ctx.running(self.guest, self.vmid):
            ctx.ports.proxmox.guest_action(self.guest, self.vmid, "start", ctx.timeouts.guest)

    def undo(self, before: GuestBefore, ctx: StepContext) -> str:
        if before.status != "running" and ctx.running(self.guest, self.vmid):
            ctx.ports.proxmox.guest_action(self.guest, self.vmid, "shutdown", ctx.timeouts.guest)
            return f"stopped {self.guest} {self.vmid}"
        return ""

    def expect(self, world: World) -> None:
        _set_status(world, self.guest, self.vmid, "running")

    def diff(self, ctx: DiffContext) -> None:
        # a start after a stop of the same plan changes nothing that stays; a guest that is
        # stopped now and should run is a difference of its own
        now = (ctx.current.containers.get(self.vmid) if self.guest == "lxc" else ctx.current.guests.get(self.vmid))
        if now is not None and now.status != "running":
            ctx.area("guests and services").lines.append(
                f"{guest_name(self.guest, self.vmid)} is stopped; the spec says it serves")
