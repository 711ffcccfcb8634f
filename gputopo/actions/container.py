"""A container's device entries (``devN``, or legacy raw ``lxc.*`` lines) through the API.

Set and delete only what changes, guarded by the digest read right before the PUT. GPUs coming
back from vfio-pci are listed in ``resolve``: their ``/dev/nvidiaN`` minors exist only once nvidia
has bound them in the switch phase (minors do not follow bus order and cannot be guessed), so
their entries are computed here, from the minors read at that moment, and their nodes made
(:meth:`UpdateContainer.make_device_nodes`): the nvidia driver binds a GPU without making its
``/dev/nvidiaN``, and Proxmox refuses a devN whose node is missing.

A live change (``live``: the container keeps running) on PVE 9 hot-plugs each new devN; Proxmox
answers a hot-plug that fails with 400 and writes nothing (pve-container API2/LXC/Config.pm
update_vm raises the errors of LXC/Config.pm vmconfig_hotplug_pending before write_config), while
the new devN it did plug stay in the container until it restarts. With a ``fallback`` (the spec's
``policy.hotplug_failure: restart``) the step then stops the container, makes the same change
(a stopped container takes it at once) and starts it again, and warns naming the devN and
Proxmox's error; without one the error fails the step and apply rolls back (the rollback
restarts the container, which still sees what was plugged). The fallback journals
``fallback: container stopped by this step`` before the stop: a ``recover --finish`` of a step
killed after it makes the change on the stopped container and starts it.

Undo on a running container puts ``[pve:pending]`` back as well
(:meth:`gputopo.actions.guestconfig.GuestConfig.restore_pending`, from the pending section the
step journaled): a devN value the step left queued is reverted, not deleted.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from gputopo.actions import containercmds, devnodes
from gputopo.actions.base import (
    ActionModel,
    DiffContext,
    Phase,
    PreflightContext,
    Resource,
    StepContext,
    World,
)
from gputopo.actions.devnodes_by_address import by_address
from gputopo.actions.guest import power
from gputopo.actions.guestconfig import ConfigBefore, GuestConfig, LxcPending
from gputopo.actions.shell import CommandContext
from gputopo.errors import BindError, HostCommandError, ProxmoxError
from gputopo.formats.devn import (
    by_dev_index,
    dev_entries,
    dev_path,
    dev_sort,
    free_dev_key,
    gpu_nodes,
    is_devn_key,
    resolve_devices,
)
from gputopo.formats.lxcconf import parse_dev_value
from gputopo.model.state import ContainerState
from gputopo.model.strict import Strict


class ContainerBefore(ConfigBefore):
    """The config, and for a live change the GPU device nodes the running container saw."""

    seen: list[str] | None = Field(
        None,
        description="/dev/nvidiaN nodes in the running container's /dev before a live change "
        "(None: not a live change, or the container was not running)",
    )
    pending: LxcPending | None = Field(
        None,
        description="the config as Proxmox keeps it, [pve:pending] included: what a running "
        "container's undo puts back (None: a journal of an earlier version)",
    )


# the journal's note of a live change's fallback, written before it stops the container
FALLBACK_STOPPED = "fallback: container stopped by this step"


class RestartFallback(Strict):
    """How a live change restarts the container when a devN hot-plug fails: the stop's
    parameters, as the spec's policy gives them to every guest stop."""

    shutdown_timeout: int = 60
    force_stop: bool = False


def hotplug_errors(e: ProxmoxError) -> dict[str, str]:
    """devN -> Proxmox's error, of a PUT that failed because a hot-plug did: pve-container's
    vmconfig_hotplug_pending (LXC/Config.pm) records ``unable to hotplug $opt: $msg`` per key,
    update_vm raises them as parameter errors (400). Empty for any other error."""
    if e.status != 400:
        return {}
    return {
        k: str(v).strip()
        for k, v in e.errors.items()
        if is_devn_key(k) and str(v).startswith(f"unable to hotplug {k}: ")
    }


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
    addresses: dict[str, str] = Field(
        default_factory=dict,
        description="devN -> the address of the GPU its /dev/nvidiaN reached when planned: an undo "
        "gives each entry that GPU's minor then (a GPU back on nvidia may get another one)",
    )
    fallback: RestartFallback | None = Field(
        None,
        description="A live change whose hot-plug Proxmox refuses restarts the container with "
        "these stop parameters (policy.hotplug_failure: restart); None: the step fails",
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
        config = GuestConfig.lxc(ctx.ports.proxmox, self.vmid)
        cfg, pending = config.before(), config.read_pending()
        seen = None
        if self.live and (self.set or self.resolve) and ctx.running("lxc", self.vmid):
            # what a running container sees is fixed at its start, plus what was hot-plugged;
            # only an addition can be hot-plugged (a removal waits for its next start)
            seen = sorted(gpu_nodes(ctx.exec(self.vmid, ["ls", "/dev"]).stdout.split()))
        return ContainerBefore(config=cfg.config, seen=seen, pending=pending)

    def container_view(self, before: ContainerBefore) -> tuple[int, list[str]] | None:
        # a devN hot-plugged into a running container stays in its /dev when the config is
        # restored: Proxmox cannot unplug one (pve-container's vmconfig_hotplug_pending skips
        # every devN delete), only the container's next start drops it
        return (self.vmid, before.seen) if before.seen is not None else None

    def do(self, ctx: StepContext) -> None:
        resolved: dict[str, str] = {}

        def more(cfg: dict[str, Any]) -> dict[str, str]:
            resolved.update(self._resolved(ctx, cfg))
            return resolved

        config = GuestConfig.lxc(ctx.ports.proxmox, self.vmid)
        if FALLBACK_STOPPED in ctx.marks() and not ctx.running("lxc", self.vmid):
            # an earlier try of this step (a process killed, recover --finish) stopped the
            # container for the change and did not start it: end what it began
            ctx.note(f"CT {self.vmid}: finishing the restart with the change that the interrupted step began")
            self._change_stopped(ctx, config)
            return
        try:
            config.change(self.set, self.delete, more)
        except ProxmoxError as e:
            failed = hotplug_errors(e) if self.live else {}
            if not failed or self.fallback is None:
                raise
            sent = {**self.set, **resolved}
            what = "; ".join(
                f"{k} ({parse_dev_value(sent[k])['path'] if k in sent else '?'}): {msg}"
                for k, msg in sorted(failed.items(), key=lambda kv: dev_sort(kv[0]))
            )
            ctx.warn(
                f"CT {self.vmid}: Proxmox could not hot-plug {what}; restarting CT {self.vmid} "
                "with the change (policy.hotplug_failure: restart)"
            )
            # the devN it did plug stay in the running container, and a running container takes
            # no new devN but by hot-plug: a stopped one takes the change at once
            # (pve-container src/PVE/LXC/Config.pm update_pct_config l. 1392-1396:
            # vmconfig_apply_pending when not running)
            # journaled first: a process killed from here on leaves a stopped container that
            # a finish of this step starts (with the change), and its undo starts too
            ctx.mark(FALLBACK_STOPPED)
            power(ctx, "lxc", self.vmid, "shutdown", self.fallback.shutdown_timeout, self.fallback.force_stop)
            self._change_stopped(ctx, config)

    def _change_stopped(self, ctx: StepContext, config: GuestConfig) -> None:
        """The fallback's end: the change made on the stopped container (it takes every key at
        once), then the container started with it."""
        config.change(self.set, self.delete, lambda cfg: self._resolved(ctx, cfg))
        power(ctx, "lxc", self.vmid, "start")

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
        for said in made:
            ctx.note(said)
        return problems

    def _resolved_keys(self, cfg: dict[str, Any]) -> dict[str, str]:
        """GPU address -> the devN key its entry gets (:func:`resolve_devices`' choice: the
        lowest keys the config leaves free once ``set`` and ``delete`` are done)."""
        after = {k: v for k, v in dev_entries(cfg).items() if k not in self.delete}
        after.update(self.set)
        out = {}
        for address in self.resolve:
            key = free_dev_key(after)
            after[key] = address
            out[address] = key
        return out

    def commands(self, ctx: CommandContext) -> list[str]:
        return containercmds.update_commands(self, ctx)

    def undo_commands(self, ctx: CommandContext) -> list[str]:
        return containercmds.update_undo_commands(self, ctx)

    def undo(self, before: ContainerBefore, ctx: StepContext) -> str:
        # the nodes of the entries coming back, where missing (their GPUs are on nvidia again:
        # this undo needs the drivers restored); one still missing fails the PUT with Proxmox's words
        # each entry by the GPU it stood for, with that GPU's minor now
        minors = ctx.read_minors()
        config, left = by_address(before.config, self.addresses, minors)
        self.make_device_nodes(ctx, config, minors)
        # every devN key: entries resolved at apply time are not in the journaled action
        guest = GuestConfig.lxc(ctx.ports.proxmox, self.vmid)
        keys = set(self.set) | set(self.delete) | set(self.addresses)
        running = ctx.running("lxc", self.vmid)
        if running and before.pending is not None:
            # what waits for the next start goes back too: a pending devN this step queued
            # would otherwise hand the container another guest's GPU at its next start
            restored = guest.restore_pending(before.pending, keys, also=is_devn_key)
        else:
            # a stopped container takes every change at once (update_pct_config l. 1395)
            restored = guest.restore(config, keys, also=is_devn_key)
        said = [f"CT {self.vmid}: restored its configuration"] if restored else []
        said += [f"CT {self.vmid}: {line}" for line in left]
        if self._may_restart() and before.seen is not None and not running:
            # the fallback stopped it and did not start it again (its start failed, or the
            # process was killed in between): it ran before, with the config now back
            power(ctx, "lxc", self.vmid, "start")
            said.append(f"started lxc {self.vmid}")
        return "; ".join(said)

    def devices(self) -> list[str]:
        # the GPUs of the entries an undo gives back: one not back on nvidia leaves it incomplete
        return sorted(set(self.addresses.values()))

    def _may_restart(self) -> bool:
        """The step may stop and start the container: a live addition with a fallback."""
        return self.live and self.fallback is not None and bool(self.set or self.resolve)

    def undo_restores(self) -> set[Resource]:
        restores = {Resource("config", f"lxc/{self.vmid}")}
        if self._may_restart():
            restores.add(Resource("running", f"lxc/{self.vmid}"))
        return restores

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
