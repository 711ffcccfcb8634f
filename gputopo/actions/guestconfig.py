"""A guest's config through the Proxmox API, changed under the digest read right before the PUT.

The container's device entries (:mod:`gputopo.actions.container`) and a VM's passthrough keys
(:mod:`gputopo.actions.vmconfig`) change the same way, so it is written once here: read the
config and its digest, set only the values that differ, delete only the keys that are there, and
PUT with that digest, so a change someone made since the read fails the PUT instead of being
overwritten. Undo puts back the journaled value of every key the step touched and deletes the
ones it added, under a fresh digest.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gputopo.actions.shell import q
from gputopo.model.strict import Strict
from gputopo.ports import ProxmoxPort


class ConfigBefore(Strict):
    config: dict[str, Any]  # the guest's config without its digest


@dataclass(frozen=True)
class GuestConfig:
    """One guest's config: ``read`` returns it with its ``digest``, ``write(set, delete, digest)``
    PUTs a change guarded by that digest."""

    read: Callable[[], dict[str, Any]]
    write: Callable[[dict[str, str], list[str], str], None]

    @classmethod
    def lxc(cls, px: ProxmoxPort, vmid: int) -> GuestConfig:
        return cls(lambda: px.lxc_config(vmid), lambda s, d, digest: px.lxc_update(vmid, s, d, digest))

    @classmethod
    def qemu(cls, px: ProxmoxPort, vmid: int) -> GuestConfig:
        return cls(lambda: px.qemu_config(vmid), lambda s, d, digest: px.qemu_update(vmid, s, d, digest))

    def before(self) -> ConfigBefore:
        """The config now, without its digest (what undo puts back)."""
        return ConfigBefore(config={k: v for k, v in self.read().items() if k != "digest"})

    def change(
        self,
        set_: dict[str, str],
        delete: list[str],
        more: Callable[[dict[str, Any]], dict[str, str]] | None = None,
    ) -> None:
        """Set the values of ``set_`` that differ (and ``more(config)``, values computed from the
        config read now) and delete the keys of ``delete`` that are there; no PUT when nothing
        differs."""
        cfg = self.read()  # the digest right before the PUT
        sets = {k: v for k, v in set_.items() if str(cfg.get(k)) != v}
        if more is not None:
            sets.update(more(cfg))
        deletes = [k for k in delete if k in cfg]
        if sets or deletes:
            self.write(sets, deletes, cfg["digest"])

    def restore(self, old: dict[str, Any], keys: set[str], also: Callable[[str], bool] | None = None) -> bool:
        """Put back ``old``'s value of each of ``keys`` (and of every key ``also`` accepts, in
        ``old`` or now), delete those ``old`` did not have. False when nothing differed."""
        cfg = self.read()
        keys = set(keys) | ({k for k in (*old, *cfg) if also(k)} if also is not None else set())
        sets = {k: str(old[k]) for k in keys if k in old and str(cfg.get(k)) != str(old[k])}
        deletes = sorted(k for k in keys if k not in old and k in cfg)
        if not sets and not deletes:
            return False
        self.write(sets, deletes, cfg["digest"])
        return True


def set_args(config: dict[str, Any], set_: dict[str, str], delete: list[str]) -> list[str]:
    """``pct set``/``qm set`` options (quoted words) that make :meth:`GuestConfig.change`'s
    change to ``config``: the values that differ, ``--delete`` of the keys that are there."""
    words = [w for k, v in sorted(set_.items()) if str(config.get(k)) != v for w in (f"--{k}", q(v))]
    deletes = [k for k in delete if k in config]
    return words + (["--delete", q(",".join(deletes))] if deletes else [])


def restore_args(
    old: dict[str, Any], now: dict[str, Any], keys: set[str], also: Callable[[str], bool] | None = None
) -> list[str]:
    """The options that make :meth:`GuestConfig.restore`'s change: ``old``'s value of each of
    ``keys`` (and of every key ``also`` accepts) back in ``now``, the keys ``old`` lacked deleted."""
    keys = set(keys) | ({k for k in (*old, *now) if also(k)} if also is not None else set())
    sets = {k: str(old[k]) for k in keys if k in old and str(now.get(k)) != str(old[k])}
    deletes = sorted(k for k in keys if k not in old and k in now)
    return set_args(now, sets, deletes)
