"""A container's device entries (``devN``, or legacy raw ``lxc.*`` lines) through the API.

Set and delete only what changes, guarded by the digest read right before the PUT. GPUs coming
back from vfio-pci are listed in ``resolve``: their ``/dev/nvidiaN`` minors exist only once nvidia
has bound them in the switch phase (minors do not follow bus order and cannot be guessed), so
their entries are computed here, from the minors read at that moment, and their nodes made
(:meth:`UpdateContainer.make_device_nodes`): the nvidia driver binds a GPU without making its
``/dev/nvidiaN``, and Proxmox refuses a devN whose node is missing.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from gputopo.actions import devnodes
from gputopo.actions.base import (
    ActionModel,
    DiffContext,
    Phase,
    PreflightContext,
    Resource,
    StepContext,
    World,
)
from gputopo.actions.guestconfig import ConfigBefore, GuestConfig
from gputopo.errors import BindError, HostCommandError
from gputopo.formats.devn import (
    by_dev_index,
    dev_path,
    dev_sort,
    gpu_nodes,
    is_devn_key,
    resolve_devices,
)
from gputopo.model.state import ContainerState


class ContainerBefore(ConfigBefore):
    """The config, and for a live change the GPU device nodes the running container saw."""

    seen: list[str] | None = Field(
        None,
        description="/dev/nvidiaN nodes in the running container's /dev before a live change "
        "(None: not a live change, or the container was not running)",
    )


class UpdateContainer(ActionModel):
    kind: Literal["update_container"] = "update_container"
    phase: Phase = "config"
    vmid: int
    set: dict[str, str] = Field(default_factory=dict)
    delete: list[str] = Field(default_factory=list)
    digest: str | None = None
    lxc_add: list[list[str]] = Field(default_factory=list, description="raw lxc.* lines to add (legacy)")
    lxc_remove: list[list[str]] = Field(default_factory=list, description="raw lxc.* lines to remove")
    resolve: list[str] = Field(
        default_factory=list,
        description="GPUs coming back to nvidia whose /dev/nvidiaN entries apply adds after the switch "
        "phase: their minors exist only once nvidia has bound them",
    )
    dev_gid: int | None = Field(None, description="gid option of the resolved entries")
    dev_mode: str | None = Field(None, description="mode option of the resolved entries")
    live: bool = Field(
        False,
        description="The container keeps running: a removal stays pending until its "
        "next restart, an addition is hot-plugged (PVE 9)",
    )

    Before = ContainerBefore

    def describe(self) -> str:
        parts = []
        if self.set:
            parts.append("set " + " ".join(f"{k}={v.split(',')[0]}" for k, v in by_dev_index(self.set)))
        if self.delete:
            parts.append("delete " + ",".join(sorted(self.delete, key=dev_sort)))
        if self.resolve:
            parts.append(f"add /dev/nvidia of {', '.join(self.resolve)} once nvidia has bound them")
        if self.lxc_add:
            parts.append(f"add {len(self.lxc_add)} lxc line(s)")
        if self.lxc_remove:
            parts.append(f"remove {len(self.lxc_remove)} lxc line(s)")
        if self.live:
            parts.append("live" + (", removals apply at its next restart" if self.delete else ""))
        return f"CT {self.vmid}: " + "; ".join(parts)

    def changes_devices(self) -> bool:
        return any(is_devn_key(k) for k in [*self.set, *self.delete]) or bool(self.resolve)

    def preflight(self, ctx: PreflightContext) -> list[str]:
        problems = []
        if ctx.api_ok and self.changes_devices():
            ok, why = ctx.cached("can-change-devices", ctx.ports.proxmox.can_change_devices)
            if not ok:
                problems.append(why)
        if self.lxc_add or self.lxc_remove:
            problems.append(
                f"CT {self.vmid}: legacy lxc.* device lines cannot be changed through the Proxmox API; "
                "use device_mode: devN (Proxmox >= 8.1)"
            )
        return problems

    def before(self, ctx: StepContext) -> ContainerBefore:
        cfg = GuestConfig.lxc(ctx.ports.proxmox, self.vmid).before()
        seen = None
        if self.live and (self.set or self.resolve) and ctx.running("lxc", self.vmid):
            # what a running container sees is fixed at its start, plus what was hot-plugged;
            # only an addition can be hot-plugged (a removal waits for its next start)
            seen = sorted(gpu_nodes(ctx.exec(self.vmid, ["ls", "/dev"]).stdout.split()))
        return ContainerBefore(config=cfg.config, seen=seen)

    def container_view(self, before: ContainerBefore) -> tuple[int, list[str]] | None:
        # a devN hot-plugged into a running container stays in its /dev when the config is
        # restored: Proxmox cannot unplug one (pve-container's vmconfig_hotplug_pending skips
        # every devN delete), only the container's next start drops it
        return (self.vmid, before.seen) if before.seen is not None else None

    def do(self, ctx: StepContext) -> None:
        GuestConfig.lxc(ctx.ports.proxmox, self.vmid).change(
            self.set, self.delete, lambda cfg: self._resolved(ctx, cfg)
        )

    def _resolved(self, ctx: StepContext, cfg: dict[str, Any]) -> dict[str, str]:
        """devN entries of the GPUs that came back to nvidia in the switch phase, from their minors
        read now. Raises BindError for a GPU without one."""
        if not self.resolve:
            return {}
        minors = ctx.read_minors()
        try:
            entries = resolve_devices(
                cfg, self.set, self.delete, self.resolve, self.dev_gid, self.dev_mode, minors
            )
        except KeyError as e:
            address = e.args[0]
            raise BindError(
                address,
                "nvidia",
                ctx.binder.driver_of(address),
                f"no /dev/nvidia minor for CT {self.vmid} (proc/driver/nvidia/gpus/{address} missing)",
            ) from None
        problems = self.make_device_nodes(ctx, entries, minors)
        if problems:
            raise HostCommandError([devnodes.NVIDIA_MODPROBE], "; ".join(problems))
        return entries

    def make_device_nodes(
        self, ctx: StepContext, entries: dict[str, Any], minors: dict[str, int | None]
    ) -> list[str]:
        """Make the missing host nodes of ``entries`` (devN -> value) with nvidia-modprobe before
        they are written: a GPU that came back to nvidia has no ``/dev/nvidiaN`` until something
        makes it (:mod:`gputopo.actions.devnodes`). ``minors``: address -> minor, read now.
        Returns one line per node still missing, naming it and the fix."""
        wanted = {
            dev_path(str(v)): f"CT {self.vmid} {k}"
            for k, v in sorted(entries.items(), key=lambda kv: dev_sort(kv[0]))
            if is_devn_key(k)
        }
        on_nvidia = {m: a for a, m in minors.items() if m is not None}
        made, problems = devnodes.make_nodes(ctx.ports.host, ctx.root, wanted, on_nvidia, ctx.timeouts.exec)
        for line in made:
            ctx.note(line)
        return problems

    def undo(self, before: ContainerBefore, ctx: StepContext) -> str:
        # the nodes of the entries coming back, where missing (their GPUs are on nvidia again:
        # this undo needs the drivers restored); one still missing fails the PUT with Proxmox's words
        self.make_device_nodes(ctx, before.config, ctx.read_minors())
        # every devN key: entries resolved at apply time are not in the journaled action
        if not GuestConfig.lxc(ctx.ports.proxmox, self.vmid).restore(
            before.config, set(self.set) | set(self.delete), also=is_devn_key
        ):
            return ""
        return f"CT {self.vmid}: restored its configuration"

    def undo_restores(self) -> set[Resource]:
        return {Resource("config", f"lxc/{self.vmid}")}

    def undo_needs(self) -> set[Resource]:
        # Proxmox refuses a devN whose /dev node does not exist, and the node of a GPU coming
        # back from vfio-pci is made (make_device_nodes) only once nvidia has it again
        return {Resource("driver")}

    def expect(self, world: World) -> None:
        world.settle()
        ct = world.current.containers.setdefault(self.vmid, ContainerState())
        minors = {g.address: g.minor for g in world.facts.gpus}
        extra = (
            resolve_devices(
                ct.config, self.set, self.delete, self.resolve, self.dev_gid, self.dev_mode, minors
            )
            if self.resolve
            else {}
        )
        for k in self.delete:
            ct.config.pop(k, None)
        ct.config.update(self.set)
        ct.config.update(extra)
        lxc = [list(x) for x in ct.config.get("lxc", []) if list(x) not in self.lxc_remove] + self.lxc_add
        if lxc or "lxc" in ct.config:
            ct.config["lxc"] = lxc
        ct.config["digest"] = "new"

    def diff(self, ctx: DiffContext) -> None:
        path = f"pve/lxc/{self.vmid}.devices.conf"
        cfg = ctx.current.containers[self.vmid].config if self.vmid in ctx.current.containers else {}
        area = ctx.area("container devices")
        area.lines.append(self.describe())
        area.files[path] = ctx.unified(path, ctx.render_devices(cfg, self.vmid), ctx.rendered.get(path, ""))
