"""The inference service inside a container: stopped before its GPUs move, started after.

A rollback starts again every service that was active before the apply (``RunningBefore``),
restarted when its drop-in was put back; so stopping's undo does nothing itself, and starting's
undo only stops a service that was stopped before it.
"""

from __future__ import annotations

from typing import Literal

from gputopo.actions.base import ActionModel, DiffContext, Phase, Resource, RunningBefore, StepContext, World
from gputopo.actions.dropin import load_dropin, record_service
from gputopo.actions.shell import CommandContext, line
from gputopo.model.state import ContainerState, CurrentState
from gputopo.model.strict import Strict

# what ``systemctl is-active`` says of a unit that has no process left to stop
STOPPED = ("inactive", "failed")


class ServiceBefore(Strict):
    active: bool


class _ServiceStep(ActionModel):
    """What stopping and starting a container's service share: which service, and its state."""

    vmid: int
    unit: str

    Before = ServiceBefore

    def before(self, ctx: StepContext) -> ServiceBefore:
        return ServiceBefore(active=ctx.systemctl().service_active(self.vmid, self.unit))

    def was_running(self, current: CurrentState, out: RunningBefore) -> None:
        record_service(current, self.vmid, self.unit, out)


class StopService(_ServiceStep):
    kind: Literal["stop_service"] = "stop_service"
    phase: Phase = "stop"
    waits = "exec"
    counts_as = "service restart"

    def describe(self) -> str:
        return f"CT {self.vmid}: stop {self.unit}"

    def stopped_service(self) -> tuple[int, str]:
        return self.vmid, self.unit

    def do(self, ctx: StepContext) -> None:
        if ctx.running("lxc", self.vmid):
            ctx.exec(self.vmid, ["systemctl", "stop", self.unit])

    def undo(self, before: ServiceBefore, ctx: StepContext) -> str:
        return ""  # the final restart brings back every service that was active

    def commands(self, ctx: CommandContext) -> list[str]:
        return [line("pct", "exec", self.vmid, "--", "systemctl", "stop", self.unit)]

    def undo_commands(self, ctx: CommandContext) -> list[str]:
        return []  # as undo: the final restart starts it again

    def expect(self, world: World) -> None:
        ct = world.current.containers.get(self.vmid)
        if ct is not None and ct.service is not None:
            ct.service.active = False


class StartService(_ServiceStep):
    kind: Literal["start_service"] = "start_service"
    phase: Phase = "start"
    waits = "service"

    def describe(self) -> str:
        return f"CT {self.vmid}: start {self.unit} (after systemctl daemon-reload)"

    def started_service(self) -> tuple[int, str]:
        return self.vmid, self.unit

    def do(self, ctx: StepContext) -> None:
        ctx.systemctl().start_service(self.vmid, self.unit)

    def commands(self, ctx: CommandContext) -> list[str]:
        # apply queues the start (--no-block) and watches it under its own timeout; pasted,
        # the start waits for it
        return [
            line("pct", "exec", self.vmid, "--", "systemctl", "daemon-reload"),
            line("pct", "exec", self.vmid, "--", "systemctl", "start", self.unit),
        ]

    def undo_commands(self, ctx: CommandContext) -> list[str]:
        ct = ctx.current.containers.get(self.vmid)
        if ct is not None and ct.service is not None and ct.service.active:
            return []  # as undo: it ran before, the final restart starts it again
        return [line("pct", "exec", self.vmid, "--", "systemctl", "stop", self.unit)]

    def undo(self, before: ServiceBefore, ctx: StepContext) -> str:
        # a service that was stopped before it stops again; one that ran before the apply is
        # started again by the final restart (RunningBefore), with the drop-in put back. One
        # still starting (``activating``: the apply was stopped while it loaded its model, or its
        # start timed out) holds its GPUs already, and a GPU that is held cannot leave nvidia. The
        # stop runs whatever the unit shows: a start asked with --no-block is a queued job
        # (``inactive`` until the job runs), and only a stop cancels it (systemd replaces a unit's
        # start job with the stop job)
        if before.active or not ctx.running("lxc", self.vmid):
            return ""
        state = ctx.exec(self.vmid, ["systemctl", "is-active", self.unit], check=False).stdout.strip()
        ctx.exec(self.vmid, ["systemctl", "stop", self.unit])
        return (
            ""
            if state in STOPPED
            else f"CT {self.vmid}: stopped {self.unit}" + (f" (it was {state})" if state != "active" else "")
        )

    def undo_restores(self) -> set[Resource]:
        return {Resource("stopped", f"{self.vmid}/{self.unit}")}

    def expect(self, world: World) -> None:
        ct = world.current.containers.setdefault(self.vmid, ContainerState())
        load_dropin(world, self.vmid)
        if ct.service is not None:
            ct.service.active = True

    def diff(self, ctx: DiffContext) -> None:
        ct = ctx.current.containers.get(self.vmid)
        if ct is not None and ct.status == "running" and ct.service is not None and not ct.service.active:
            ctx.area("guests and services").lines.append(f"CT {self.vmid}: {self.unit} is not running")
