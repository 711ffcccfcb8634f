"""A VM's config keys gputopo owns (``hostpciN`` of its mappings, ``affinity``, ``numa``,
``numa0``, ``hugepages``, ``args``) through the API, like the container's.

Set and delete only what differs, guarded by the digest read right before the PUT; undo puts
back the journaled value of every key the step touched (and deletes the ones it added). The
planner stops a running VM before this step: qemu-server keeps these keys pending on a running
VM until its next start.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from gputopo.actions.base import (
    ActionModel,
    DiffContext,
    Phase,
    PreflightContext,
    Resource,
    StepContext,
    World,
)
from gputopo.actions.guestconfig import ConfigBefore, GuestConfig, restore_args, set_args
from gputopo.actions.shell import CommandContext, line
from gputopo.formats.hostpci import hostpci_index, hostpci_keys, hostpci_number
from gputopo.model.state import GuestState


def _summary(key: str, value: str) -> str:
    # the value really written (``hostpci1=mapping=pro6000-vm,pcie=1``), as ``qm set`` takes it
    return f"{key}={value}"


def config_lines(config: dict[str, Any], keys: list[str]) -> str:
    """``key: value`` lines of ``keys`` present in ``config``, sorted as Proxmox writes them."""
    return "".join(f"{k}: {config[k]}\n" for k in sorted(keys) if k in config)


class UpdateVmConfig(ActionModel):
    kind: Literal["update_vm_config"] = "update_vm_config"
    phase: Phase = "config"
    vmid: int
    set: dict[str, str] = Field(default_factory=dict)
    delete: list[str] = Field(default_factory=list)
    digest: str | None = Field(
        None, description="The digest at plan time (the PUT uses the one read right before it)"
    )

    Before = ConfigBefore

    def describe(self) -> str:
        parts = []
        if self.set:
            parts.append(
                "set " + " ".join(_summary(k, v) for k, v in sorted(self.set.items(), key=_key_order))
            )
        if self.delete:
            parts.append("delete " + ",".join(sorted(self.delete, key=lambda k: _key_order((k, "")))))
        return f"VM {self.vmid}: " + "; ".join(parts)

    def preflight(self, ctx: PreflightContext) -> list[str]:
        g = ctx.current.guests.get(self.vmid)
        if g is not None and "lock" in g.config:
            return [f"VM {self.vmid} is locked ({g.config['lock']}); its config cannot change"]
        return []

    def before(self, ctx: StepContext) -> ConfigBefore:
        return GuestConfig.qemu(ctx.ports.proxmox, self.vmid).before()

    def do(self, ctx: StepContext) -> None:
        GuestConfig.qemu(ctx.ports.proxmox, self.vmid).change(self.set, self.delete)

    def commands(self, ctx: CommandContext) -> list[str]:
        g = ctx.current.guests.get(self.vmid)
        words = set_args(g.config if g is not None else {}, self.set, self.delete)
        return [line("qm", "set", self.vmid) + " " + " ".join(words)] if words else []

    def undo_commands(self, ctx: CommandContext) -> list[str]:
        g = ctx.current.guests.get(self.vmid)
        old = {k: v for k, v in (g.config if g is not None else {}).items() if k != "digest"}
        now = {k: v for k, v in old.items() if k not in self.delete} | dict(self.set)
        words = restore_args(old, now, set(self.set) | set(self.delete))
        return [line("qm", "set", self.vmid) + " " + " ".join(words)] if words else []

    def undo(self, before: ConfigBefore, ctx: StepContext) -> str:
        if not GuestConfig.qemu(ctx.ports.proxmox, self.vmid).restore(
            before.config, set(self.set) | set(self.delete)
        ):
            return ""
        return f"VM {self.vmid}: restored its configuration"

    def undo_restores(self) -> set[Resource]:
        return {Resource("config", f"qemu/{self.vmid}")}

    def expect(self, world: World) -> None:
        g = world.current.guests.setdefault(self.vmid, GuestState())
        for k in self.delete:
            g.config.pop(k, None)
        g.config.update(self.set)
        g.config["digest"] = "new"
        keys = [k for k in hostpci_keys(g.config) if hostpci_index(k) is not None]
        g.hostpci = [str(g.config[k]) for k in keys]

    def diff(self, ctx: DiffContext) -> None:
        path = f"pve/qemu-server/{self.vmid}.conf"
        now = ctx.current.guests[self.vmid].config if self.vmid in ctx.current.guests else {}
        keys = sorted(set(self.set) | set(self.delete))
        area = ctx.area("vm config")
        area.lines.append(self.describe())
        area.files[path] = ctx.unified(path, config_lines(now, keys), config_lines(self.set, keys))


def _key_order(kv: tuple[str, Any]) -> tuple[str, int]:
    n = hostpci_number(kv[0])
    return ("hostpci", n) if n is not None else (kv[0], -1)
