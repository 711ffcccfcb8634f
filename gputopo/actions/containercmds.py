"""The shell lines ``plan --commands`` prints for a container's device change
(``self``: a :class:`gputopo.actions.container.UpdateContainer`, which imports this module) and for its undo."""

from __future__ import annotations

from typing import Any

from gputopo.actions.guest import shutdown_command
from gputopo.actions.guestconfig import restore_args, set_args
from gputopo.actions.shell import CommandContext, line, q
from gputopo.formats.devn import dev_sort, format_dev, is_devn_key


def update_commands(self: Any, ctx: CommandContext) -> list[str]:
    """``plan --commands``: the shell lines that make ``self``'s change (a GPU back from vfio-pci
    gets its minor read as apply does)."""
    ct = ctx.current.containers.get(self.vmid)
    cfg = ct.config if ct is not None else {}
    out = []
    words = set_args(cfg, self.set, self.delete)
    # a GPU back from vfio-pci: its minor is read once nvidia has bound it, as apply does
    for address, key in self._resolved_keys(cfg).items():
        var = "minor_" + address.replace(":", "_").replace(".", "_")
        info = f"/proc/driver/nvidia/gpus/{address}/information"
        out.append(f"{var}=$(sed -n 's/^Device Minor:[[:space:]]*//p' {q(info)})")
        # nvidia binds a GPU without making its node; Proxmox refuses a devN whose node is
        # missing (make_device_nodes does the same)
        out.append(f'[ -e "/dev/nvidia${{{var}}}" ] || nvidia-modprobe -c "${{{var}}}"')
        value = format_dev("/dev/nvidia0", self.dev_gid, self.dev_mode)
        words += [f"--{key}", f'"/dev/nvidia${{{var}}}{value[len("/dev/nvidia0") :]}"']
    if self.lxc_add or self.lxc_remove:
        out.append(
            f"# the lxc.* lines cannot change through Proxmox's API or pct: edit /etc/pve/lxc/{self.vmid}.conf"
        )
    if words:
        out.append(line("pct", "set", self.vmid) + " " + " ".join(words))
        if self.fallback is not None and self._may_restart():
            stop = shutdown_command(
                "lxc", self.vmid, self.fallback.shutdown_timeout, self.fallback.force_stop
            )
            out.append(
                f"# if it answers 'unable to hotplug devN: ...' (nothing written): {stop}, "
                f"the pct set above again, pct start {self.vmid}"
            )
    return out


def update_undo_commands(self: Any, ctx: CommandContext) -> list[str]:
    """``plan --commands``: the shell lines that undo ``self``'s change, pending section included."""
    ct = ctx.current.containers.get(self.vmid)
    old = {k: v for k, v in (ct.config if ct is not None else {}).items() if k != "digest"}
    after = {k: v for k, v in old.items() if k not in self.delete}
    after.update(self.set)
    after.update({k: "?" for k in self._resolved_keys(old).values()})
    words = restore_args(old, after, set(self.set) | set(self.delete), also=is_devn_key)
    out = [line("pct", "set", self.vmid) + " " + " ".join(words)] if words else []
    queued = sorted({*self.set, *self._resolved_keys(old).values()}, key=dev_sort)
    if self.live and queued:
        # a running container keeps a devN it has in [pve:pending]; a delete leaves that
        # value queued for its next start, only a revert drops it (update_pct_config l. 1306)
        out.insert(0, line("pct", "set", self.vmid, "--revert", ",".join(queued)))
    if self.live and (self.set or self.resolve):
        # as the rollback's device-view check: Proxmox cannot unplug a hot-plugged devN
        out.append(
            f"# if CT {self.vmid} still lists a /dev/nvidiaN it did not before: "
            f"{shutdown_command('lxc', self.vmid)} && pct start {self.vmid}"
        )
    return out
