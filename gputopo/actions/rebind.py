"""One IOMMU group moving between drivers, per address (``driver_override``, unbind, probe).

To vfio-pci every member goes to vfio-pci; to nvidia the GPU goes to nvidia and the other
functions back to their default drivers (override cleared). Consecutive rebinds run in parallel,
one worker per group; every sysfs write runs under a timeout, and a write that hangs leaves its
group to a human (the rollback does not race the worker that may still be blocked in it).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, RootModel

from gputopo.actions.base import (
    ActionModel,
    DiffContext,
    Phase,
    PreflightContext,
    Resource,
    StepContext,
    World,
)
from gputopo.actions.shell import CommandContext, move_group_writes, restore_writes
from gputopo.errors import BindError, ProxmoxError
from gputopo.formats.hostpci import hostpci_refs, is_hostpci_key
from gputopo.formats.mapline import map_paths
from gputopo.model.strict import Strict
from gputopo.ports import MemberState

VFIO = "vfio-pci"
NVIDIA = "nvidia"


class MemberBefore(Strict):
    driver: str | None
    override: str | None


class RebindBefore(RootModel[dict[str, MemberBefore]]):
    """Every member's driver and driver_override before the move."""


class Rebind(ActionModel):
    """Move one IOMMU group's devices to ``to_driver``."""

    kind: Literal["rebind"] = "rebind"
    phase: Phase = "switch"
    address: str
    members: list[str]
    from_drivers: dict[str, str | None]
    to_driver: Literal["nvidia", "vfio-pci"]
    keep_override: bool = True
    minor: int | None = Field(
        None,
        description="The /dev/nvidia minor the GPU has on nvidia when the plan moves it to vfio-pci: "
        "a rollback binds GPUs back in the order of these minors",
    )

    Before = RebindBefore
    parallel = True
    waits = "sysfs"
    counts_as = "rebind"

    def describe(self) -> str:
        before = sorted({d or "none" for d in self.from_drivers.values()})
        extra = [m for m in self.members if m != self.address]
        with_ = f" with {', '.join(extra)}" if extra else ""
        keep = " (override kept)" if self.keep_override else ""
        if before == [self.to_driver]:
            # already on the driver: only driver_override changes
            what = "set" if self.keep_override else "clear"
            return f"{what} driver_override on {self.address}{with_} (stays on {self.to_driver})"
        return f"rebind {self.address}{with_}: {'/'.join(before)} -> {self.to_driver}{keep}"

    def devices(self) -> list[str]:
        return list(self.members)

    # -- preflight ------------------------------------------------------------------------------

    def preflight(self, ctx: PreflightContext) -> list[str]:
        problems: list[str] = []
        if self.to_driver == VFIO:
            if not ctx.facts.host.iommu_enabled:
                problems.append(
                    "IOMMU is off (no sys/kernel/iommu_groups); add amd_iommu=on or intel_iommu=on "
                    "to the kernel command line and reboot"
                )
            if not ctx.driver_loaded(VFIO):
                problems.append(
                    "the vfio-pci driver is not loaded (no sys/bus/pci/drivers/vfio-pci); run: modprobe vfio-pci"
                )
            problems += self._holders(ctx)
        elif not ctx.driver_loaded(NVIDIA):
            going = [a.address for a in ctx.actions if isinstance(a, Rebind) and a.to_driver == NVIDIA]
            problems.append(
                f"the nvidia driver is not loaded (no sys/bus/pci/drivers/nvidia) but "
                f"{', '.join(going)} must go back to it; run: modprobe nvidia"
            )
        problems += self._running_vms(ctx)
        return problems

    def _holders(self, ctx: PreflightContext) -> list[str]:
        """Processes outside the containers the plan stops that hold a moving GPU's nodes."""
        nodes: dict[str, str] = {}
        for m in self.members:
            g = ctx.facts.gpu(m)
            if g is None or g.driver != NVIDIA:
                continue
            if g.minor is not None:
                nodes[f"/dev/nvidia{g.minor}"] = m
            # nvidia_drm gives a GPU /dev/dri nodes; a display server or console on them holds it too
            nodes.update({f"/dev/dri/{name}": m for name in ctx.drm_nodes(m)})
        if not nodes:
            return []
        # a CUDA context on the host holds the control nodes too, and keeps every GPU busy
        paths = sorted(nodes) + ["/dev/nvidiactl", "/dev/nvidia-uvm"]
        held = ctx.holders(paths)
        stopped = ctx.stopped_guests("lxc")
        services = ctx.stopped_services()
        # one line per program: the workers of one server (same command, same container) hold the
        # same nodes, and are named together rather than once per node and PID
        by_program: dict[tuple, tuple[list[str], list[int]]] = {}
        for path in paths:
            for h in held.get(path, []):
                if h.container is not None and h.container in stopped:
                    continue  # it ends when the plan stops its container
                if h.container is not None and (h.container, h.unit) in services:
                    continue  # it ends when the plan stops its service (the container keeps running)
                key = (h.comm == "nvidia-persistenced", h.container, h.cmdline or h.comm)
                held_paths, pids = by_program.setdefault(key, ([], []))
                if path not in held_paths:
                    held_paths.append(path)
                if h.pid not in pids:
                    pids.append(h.pid)
        problems = []
        for (persistenced, container, cmd), (held_paths, pids) in by_program.items():
            what = ", ".join(f"{p} (GPU {nodes[p]})" if p in nodes else p for p in held_paths)
            verb = "is" if len(held_paths) == 1 else "are"
            who = f"PID {pids[0]}" if len(pids) == 1 else f"PIDs {', '.join(map(str, sorted(pids)))}"
            if persistenced:
                problems.append(
                    f"{what} {verb} held open by nvidia-persistenced ({who}); it keeps every GPU "
                    "on nvidia: run 'systemctl stop nvidia-persistenced' before apply (and "
                    "'systemctl start nvidia-persistenced' after)"
                )
            elif container is not None:
                problems.append(
                    f"{what} {verb} held open by {who} ({cmd}) in CT {container}, which the plan keeps "
                    "running; stop it, name its unit as the container's service, or set "
                    "policy.container_restart: always"
                )
            else:
                problems.append(f"{what} {verb} held open by {who} ({cmd}); stop it before apply")
        return problems

    def _running_vms(self, ctx: PreflightContext) -> list[str]:
        """Running VMs the plan does not stop that use a device of this group."""
        if not ctx.api_ok:
            return []
        try:
            vms = ctx.running_vm_configs()
        except ProxmoxError as e:
            return [f"cannot list VMs: {e}"]
        mapping_paths = {
            mid: {p for e in m.map for p in map_paths(e)} for mid, m in ctx.current.mappings.items()
        }
        stopped = ctx.stopped_guests("qemu")
        problems = []
        for vmid, cfg in vms.items():
            if vmid in stopped:
                continue
            for k, v in cfg.items():
                if not is_hostpci_key(k):
                    continue
                hits = hostpci_addresses(str(v), mapping_paths) & set(self.members)
                if hits:
                    problems.append(
                        f"VM {vmid} is running with {', '.join(sorted(hits))} ({k}) and the plan does "
                        f"not stop it; shut it down or list it in the spec's vms.guests"
                    )
        return problems

    # -- before, do, undo -----------------------------------------------------------------------

    def before(self, ctx: StepContext) -> RebindBefore:
        return RebindBefore(
            {
                m: MemberBefore(driver=s.driver, override=s.override)
                for m, s in ((m, ctx.binder.state_of(m)) for m in self.members)
            }
        )

    def do(self, ctx: StepContext) -> None:
        self._refuse_running(ctx)
        if self.to_driver == VFIO:
            ctx.binder.move_group(self.members, VFIO, self.keep_override)
            return
        # every member back by name: the GPU to nvidia, its other functions to the driver their
        # modalias resolves to, so that no vfio-pci dynamic id can take them
        natives = {m: NVIDIA if m == self.address else ctx.native_driver(m) for m in self.members}
        ctx.binder.move_group(self.members, None, self.keep_override, natives)
        got = ctx.binder.driver_of(self.address)
        if got != NVIDIA:
            raise BindError(self.address, NVIDIA, got)

    def _refuse_running(self, ctx: StepContext) -> None:
        """Check, now, that no guest runs on this group: every guest the plan stopped before the
        switch is stopped (a stop task's OK is not enough: an HA resource's ``hastop`` ends before
        the HA manager stops it), and no running VM passes one of its devices. Raises
        ProxmoxError naming the guest; nothing has moved then."""
        running = sorted((kind, vmid) for kind, vmid in ctx.stopped_guests if ctx.running(kind, vmid))
        if running:
            names = ", ".join(f"{'CT' if k == 'lxc' else 'VM'} {v}" for k, v in running)
            raise ProxmoxError(
                f"switch {self.address}",
                None,
                f"{names} still running although the plan stopped it; the GPUs stay where they are",
            )
        mapping_paths = {
            m["id"]: {p for e in m.get("map") or [] for p in map_paths(e)}
            for m in ctx.ports.proxmox.mappings()
        }
        for g in ctx.ports.proxmox.list_guests("qemu"):
            vmid = int(g["vmid"])
            if ("qemu", vmid) in ctx.stopped_guests or not ctx.running("qemu", vmid):
                continue
            cfg = ctx.ports.proxmox.qemu_config(vmid)
            for k, v in cfg.items():
                hits = (
                    hostpci_addresses(str(v), mapping_paths) & set(self.members)
                    if is_hostpci_key(k)
                    else set()
                )
                if hits:
                    raise ProxmoxError(
                        f"switch {self.address}",
                        None,
                        f"VM {vmid} is running with {', '.join(sorted(hits))} ({k}); the GPUs stay where they are",
                    )

    def undo(self, before: RebindBefore, ctx: StepContext) -> str:
        if ctx.stuck & set(self.members):
            return f"left IOMMU group of {self.address} alone (a write hung there)"
        prev = dict(before.root)
        # a device that fell off the bus cannot be rebound: it is a human's (rescan or reboot),
        # the rest of its group still goes back
        gone = sorted(m for m in prev if not ctx.device_present(m))
        ctx.gone.update(gone)
        prev = {m: s for m, s in prev.items() if m not in gone}
        left = f"left {', '.join(gone)} alone: gone from the bus" if gone else ""
        now = {m: ctx.binder.state_of(m) for m in prev}
        if all((now[m].driver, now[m].override) == (s.driver, s.override) for m, s in prev.items()):
            return left
        leaving = [m for m in prev if now[m].driver == NVIDIA and prev[m].driver != NVIDIA]
        stopped, held = self._free(ctx, leaving)
        if held:
            # its unbind would block until the holder lets go: the group stays on nvidia, whole
            ctx.stuck.update(self.members)
            return "; ".join([*stopped, held, *([left] if left else [])])
        ctx.binder.restore({m: MemberState(s.driver, s.override) for m, s in prev.items()})
        back = (
            f"rebound {self.address} back to {prev[self.address].driver or 'none'}"
            if self.address in prev
            else f"rebound {', '.join(prev)} back"
        )
        return "; ".join([*stopped, back + self._new_minor(ctx), *([left] if left else [])])

    def _new_minor(self, ctx: StepContext) -> str:
        """What to add to the undo's line when the GPU came back to nvidia with another minor
        than it had (another GPU took its old one): its devN lines are given by address."""
        if self.minor is None or self.to_driver != VFIO:
            return ""
        now = ctx.read_minors().get(self.address)
        if now is None or now == self.minor:
            return ""
        return (
            f" as /dev/nvidia{now} (it was /dev/nvidia{self.minor}: nvidia hands out the lowest free minor)"
        )

    def _free(self, ctx: StepContext, leaving: list[str]) -> tuple[list[str], str]:
        """Stop what holds the device nodes of ``leaving`` (GPUs this undo takes from nvidia),
        as the forward path stops the service before the switch: nvidia's unbind waits for the
        last process that holds its GPU, so unbinding a held GPU hangs. A service of the plan
        (one that started, or was starting, with the GPUs the apply gave it) is stopped; anything
        else is not the rollback's to stop. Returns (what was stopped, one line naming what
        still holds them; '' when nothing does)."""
        minors = ctx.read_minors() if leaving else {}
        nodes: dict[str, str] = {}
        for m in leaving:
            if minors.get(m) is not None:
                nodes[f"/dev/nvidia{minors[m]}"] = m
            nodes.update({f"/dev/dri/{name}": m for name in ctx.drm_nodes(m)})
        if not nodes:
            return [], ""
        held = ctx.holders(sorted(nodes))
        units = sorted(
            {
                (h.container, h.unit)
                for hs in held.values()
                for h in hs
                if (h.container, h.unit) in ctx.services
            }
        )
        stopped = []
        for vmid, unit in units:
            ctx.exec(vmid, ["systemctl", "stop", unit])
            stopped.append(f"CT {vmid}: stopped {unit} (it held {self.address})")
        if units:
            held = ctx.holders(sorted(nodes))
        # one entry per program (the workers of one server share its command line), as preflight
        who: dict[tuple[int | None, str | None, str], tuple[list[int], list[str]]] = {}
        for path, hs in sorted(held.items()):
            for h in hs:
                pids, paths = who.setdefault((h.container, h.unit, h.cmdline or h.comm), ([], []))
                if h.pid not in pids:
                    pids.append(h.pid)
                if path not in paths:
                    paths.append(path)
        if not who:
            return stopped, ""
        named = "; ".join(
            (f"PID {pids[0]}" if len(pids) == 1 else f"PIDs {', '.join(map(str, sorted(pids)))}")
            + f" ({cmd})"
            + (f" of {unit}" if unit else "")
            + (f" in CT {ct}" if ct is not None else "")
            + f" {'holds' if len(pids) == 1 else 'hold'} {', '.join(paths)}"
            for (ct, unit, cmd), (pids, paths) in who.items()
        )
        return stopped, (
            f"left IOMMU group of {self.address} on nvidia (its unbind would hang until released): "
            f"{named}; stop it, then run 'gputopo recover'"
        )

    def undo_restores(self) -> set[Resource]:
        return {Resource("driver", m) for m in self.members}

    def undo_rank(self) -> int | None:
        # nvidia gives a GPU the lowest free minor, with no memory of the one it had
        # (open-gpu-kernel-modules kernel-open/nvidia/nv.c l.5629-5644): bound back in the order
        # of their old minors, GPUs that all left together get each its own again
        return self.minor if self.to_driver == VFIO else None

    def undo_needs(self) -> set[Resource]:
        # what this apply started (a guest, a service) holds the GPUs it moved: stopped first,
        # or the unbind blocks
        return {Resource("stopped")}

    # -- commands ---------------------------------------------------------------------------------

    def _wanted(self, ctx: CommandContext) -> dict[str, str | None]:
        """Each member's driver after the move (None: whichever native driver probes it)."""
        if self.to_driver == VFIO:
            return {m: VFIO for m in self.members}
        return {m: NVIDIA if m == self.address else ctx.native_driver(m) for m in self.members}

    def commands(self, ctx: CommandContext) -> list[str]:
        overrides = {m: ctx.override_of(m) for m in self.members}
        return move_group_writes(
            self.members, self.from_drivers, overrides, self._wanted(ctx), self.keep_override
        )

    def undo_commands(self, ctx: CommandContext) -> list[str]:
        overrides = {m: ctx.override_of(m) for m in self.members}
        return restore_writes(
            self.members, self.from_drivers, overrides, self._wanted(ctx), self.keep_override
        )

    # -- expect, diff ---------------------------------------------------------------------------

    def expect(self, world: World) -> None:
        for m in self.members:
            if self.to_driver == VFIO:
                world.drivers[m] = VFIO
                world.overrides[m] = VFIO if self.keep_override else None
            else:
                world.drivers[m] = NVIDIA if m == self.address else None
                world.overrides[m] = NVIDIA if self.keep_override and m == self.address else None

    def diff(self, ctx: DiffContext) -> None:
        area = ctx.area("driver bindings")
        for m in self.members:
            area.lines.append(f"{m}: {self.from_drivers.get(m) or 'none'} -> {self.to_driver}")


def hostpci_addresses(value: str, mapping_paths: dict[str, set[str]]) -> set[str]:
    """The host devices a VM's ``hostpciN`` value passes: its mapping's paths and its ``host``
    devices, as :func:`gputopo.formats.hostpci.hostpci_refs` reads them (a slot ``81:00`` means
    every function of the card)."""
    hosts, mapping = hostpci_refs(value)
    out = set(mapping_paths.get(mapping, set())) if mapping is not None else set()
    for h in hosts:
        if "." in h:
            out.add(h)
        else:  # a whole slot: every function
            out.update(f"{h}.{f}" for f in range(8))
    return out
