"""The inference service's systemd drop-in inside a container (``pct push``): its ``ExecStart``
with the tensor-parallel size the container's GPUs allow, read by systemd at the next start."""

from __future__ import annotations

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
from gputopo.actions.shell import CommandContext, q, with_text
from gputopo.actions.shell import line as command
from gputopo.errors import ExecError
from gputopo.model.state import ContainerState, CurrentState, ServiceState
from gputopo.model.strict import Strict


class DropinBefore(Strict):
    content: str | None  # None: there was no drop-in
    dir_existed: bool = True  # whether the unit's .d directory existed (removed again if not)


def _dir(path: str) -> str:
    return path.rsplit("/", 1)[0] or "/"


def push_commands(vmid: int, path: str, content: str, mode: int = 0o644) -> list[str]:
    """What gputopo's own ``pct push`` does (:meth:`gputopo.adapters.pct.PctExec.push`):
    ``content`` in a private temp file on the host, ``pct push`` of it with ``--perms``, the
    temp file removed (pct push opens a local file: pve-container src/PVE/CLI/pct.pm ``push``)."""
    return [
        with_text('tmp=$(mktemp) && cat > "$tmp"', content),
        f'{command("pct", "push", vmid)} "$tmp" {q(path)} --perms {mode:04o}; rm -f "$tmp"',
    ]


class WriteServiceDropin(ActionModel):
    kind: Literal["write_service_dropin"] = "write_service_dropin"
    phase: Phase = "prepare"
    vmid: int
    unit: str
    path: str
    content: str
    tp: int

    Before = DropinBefore

    def describe(self) -> str:
        return (
            f"CT {self.vmid}: write {self.path} ({self.unit}, tensor parallel {self.tp}; read at next start)"
        )

    def preflight(self, ctx: PreflightContext) -> list[str]:
        ct = ctx.current.containers.get(self.vmid)
        if ct is not None and ct.status != "running":
            return [
                f"CT {self.vmid} is stopped; start it so {self.path} can be written (pct push needs it running)"
            ]
        return []

    def before(self, ctx: StepContext) -> DropinBefore:
        content = ctx.read_file_in(self.vmid, self.path)
        exists = ctx.exec(self.vmid, ["test", "-d", _dir(self.path)], check=False).rc == 0
        return DropinBefore(content=content, dir_existed=exists)

    def do(self, ctx: StepContext) -> None:
        if ctx.read_file_in(self.vmid, self.path) != self.content:
            # pct push creates the file only; a unit's .d directory rarely exists yet
            ctx.exec(self.vmid, ["mkdir", "-p", _dir(self.path)])
            ctx.ports.exec.push(self.vmid, self.path, self.content, 0o644)

    def commands(self, ctx: CommandContext) -> list[str]:
        return [
            command("pct", "exec", self.vmid, "--", "mkdir", "-p", _dir(self.path)),
            *push_commands(self.vmid, self.path, self.content),
        ]

    def undo_commands(self, ctx: CommandContext) -> list[str]:
        ct = ctx.current.containers.get(self.vmid)
        old = ct.service.dropin if ct is not None and ct.service is not None else None
        if old is not None:
            return push_commands(self.vmid, self.path, old)
        # the directory goes too when the write made it (it is left when anything else is in it)
        return [
            command("pct", "exec", self.vmid, "--", "rm", "-f", self.path),
            command("pct", "exec", self.vmid, "--", "rmdir", "--ignore-fail-on-non-empty", _dir(self.path)),
        ]

    def undo(self, before: DropinBefore, ctx: StepContext) -> str:
        if not ctx.running("lxc", self.vmid):
            raise ExecError(
                self.vmid,
                ["cat", self.path],
                255,
                f"CT {self.vmid} is not running; cannot restore {self.path}",
            )
        now = ctx.read_file_in(self.vmid, self.path)
        done = ""
        if now != before.content:
            ctx.service_changed.add(self.vmid)
            if before.content is None:
                ctx.exec(self.vmid, ["rm", "-f", self.path])
                done = f"CT {self.vmid}: removed {self.path}"
            else:
                ctx.ports.exec.push(self.vmid, self.path, before.content, 0o644)
                return f"CT {self.vmid}: restored {self.path}"
        if (
            not before.dir_existed
            and ctx.exec(self.vmid, ["test", "-d", _dir(self.path)], check=False).rc == 0
        ):
            # the directory apply made for the drop-in (a failed push may leave it empty)
            ctx.exec(self.vmid, ["rmdir", "--ignore-fail-on-non-empty", _dir(self.path)])
            done = done or f"CT {self.vmid}: removed {_dir(self.path)}"
        return done

    def undo_restores(self) -> set[Resource]:
        return {Resource("dropin", f"{self.vmid}/{self.unit}")}

    def undo_needs(self) -> set[Resource]:
        return {Resource("running", f"lxc/{self.vmid}")}  # pct push needs it running

    def expect(self, world: World) -> None:
        ct = world.current.containers.setdefault(self.vmid, ContainerState())
        svc = ct.service or ServiceState(unit=self.unit)
        svc.dropin = self.content
        ct.service = svc
        # the command changes once systemd loads the drop-in (load_dropin: daemon-reload, boot)
        exec_start = None
        for line in self.content.splitlines():
            if line.startswith("ExecStart=") and line != "ExecStart=":
                exec_start = line[len("ExecStart=") :].replace("%%", "%")
        world.reloads[self.vmid] = (exec_start, self.tp)

    def diff(self, ctx: DiffContext) -> None:
        target = next(c for c in ctx.plan.containers if c.vmid == self.vmid)
        svc = target.service
        was = ctx.current.containers[self.vmid].service if self.vmid in ctx.current.containers else None
        now_tp = svc.current_tp if svc is not None and svc.current_tp is not None else "?"
        area = ctx.area("service")
        area.lines.append(f"CT {self.vmid} {self.unit}: tensor parallel {now_tp} -> {self.tp}")
        path = f"ct/{self.vmid}{self.path}"
        area.files[path] = ctx.unified(path, was.dropin if was else None, ctx.rendered.get(path))

    def was_running(self, current: CurrentState, out: RunningBefore) -> None:
        record_service(current, self.vmid, self.unit, out)


def load_dropin(world: World, vmid: int) -> None:
    """What a daemon-reload or a boot of container ``vmid`` does to ``world``: the drop-in
    written before (``WriteServiceDropin.expect``) becomes the service's command."""
    pending = world.reloads.pop(vmid, None)
    ct = world.current.containers.get(vmid)
    if pending is None or ct is None or ct.service is None:
        return
    exec_start, tp = pending
    if exec_start is not None:
        ct.service.exec_start = exec_start
    ct.service.tp = tp


def record_service(current: CurrentState, vmid: int, unit: str, out: RunningBefore) -> None:
    """Note whether ``unit`` in container ``vmid`` was active before the apply."""
    ct = current.containers.get(vmid)
    active = bool(ct and ct.service and ct.service.active)
    out.services[f"{vmid}/{unit}"] = "active" if active else "inactive"
