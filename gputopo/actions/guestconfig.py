"""A guest's config through the Proxmox API, changed under the digest read right before the PUT.

The container's device entries (:mod:`gputopo.actions.container`) and a VM's passthrough keys
(:mod:`gputopo.actions.vmconfig`) change the same way, so it is written once here: read the
config and its digest, set only the values that differ, delete only the keys that are there, and
PUT with that digest, so a change someone made since the read fails the PUT instead of being
overwritten. Undo puts back the journaled value of every key the step touched and deletes the
ones it added, under a fresh digest.

A running container keeps what cannot change at once in ``[pve:pending]`` (pve-container
src/PVE/LXC/Config.pm update_pct_config l. 1301-1398: every set lands in the pending section, a
delete is queued by add_to_pending_delete, and only fast-plug keys and hot-plugged devN leave it
before the next start). A delete keeps a key's pending value (pve-guest-common
src/PVE/AbstractConfig.pm add_to_pending_delete l. 105-117 touches the queue only); ``revert``
alone drops it (update_pct_config l. 1306-1309). So a container's undo journals the pending
section (:class:`LxcPending`) and puts it back too (:meth:`GuestConfig.restore_pending`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import Field

from gputopo.actions.shell import q
from gputopo.model.strict import Strict
from gputopo.ports import ProxmoxPort


class ConfigBefore(Strict):
    config: dict[str, Any]  # the guest's config without its digest


class LxcPending(Strict):
    """A container's config as Proxmox keeps it: the values in effect, the pending values and
    the keys queued for deletion (GET .../lxc/{vmid}/pending)."""

    current: dict[str, str] = Field(default_factory=dict)
    pending: dict[str, str] = Field(default_factory=dict)
    delete: list[str] = Field(default_factory=list)

    @classmethod
    def of(cls, items: list[dict[str, Any]]) -> tuple[LxcPending, str]:
        """The view of the pending endpoint's ``items`` (pve-guest-common GuestHelpers.pm
        config_with_pending_array: ``value``, ``pending``, ``delete`` 1 or 2 (forced) per key),
        and the config's digest."""
        out, digest = cls(), ""
        for item in items:
            k = str(item["key"])
            if k == "digest":
                digest = str(item.get("value", ""))
                continue
            if "value" in item:
                out.current[k] = str(item["value"])
            if "pending" in item:
                out.pending[k] = str(item["pending"])
            if item.get("delete"):
                out.delete.append(k)
        return out, digest

    def keys(self) -> set[str]:
        return {*self.current, *self.pending, *self.delete}

    def queued(self, key: str) -> tuple[str | None, bool]:
        """What waits for the next start: the pending value (None: none), whether a delete is."""
        return self.pending.get(key), key in self.delete


def pending_restore(old: LxcPending, now: LxcPending, keys: set[str]) -> tuple[list[str], dict, list[str]]:
    """The reverts, sets and deletes that bring ``keys`` of a running container from ``now`` back
    to ``old``, pending section included: revert a key whose queued change is not ``old``'s, set
    ``old``'s pending value again, queue ``old``'s deletes. A value in effect that changed (a devN
    hot-plugged, a fast-plug key) cannot be taken back before the next start: it gets ``old``'s
    value pending, or a pending delete where ``old`` did not have the key."""
    reverts = sorted(k for k in keys if now.queued(k) != (None, False) and now.queued(k) != old.queued(k))
    sets, deletes = {}, []
    for k in sorted(keys):
        value, deleted = (None, False) if k in reverts else now.queued(k)
        want, want_deleted = old.queued(k)
        was = old.current.get(k)
        if now.current.get(k) != was and want is None:
            if was is None:
                want_deleted = True
            else:
                want = was
        if want is not None and value != want:
            sets[k], deleted = want, False
        if want_deleted and not deleted:
            deletes.append(k)
    return reverts, sets, deletes


@dataclass(frozen=True)
class GuestConfig:
    """One guest's config: ``read`` returns it with its ``digest``, ``write(set, delete, digest)``
    PUTs a change guarded by that digest."""

    read: Callable[[], dict[str, Any]]
    write: Callable[[dict[str, str], list[str], str], None]
    pending: Callable[[], list[dict[str, Any]]] | None = None  # a container's pending endpoint
    revert: Callable[[list[str], str], None] | None = None  # a PUT of ``revert`` under a digest

    @classmethod
    def lxc(cls, px: ProxmoxPort, vmid: int) -> GuestConfig:
        return cls(
            lambda: px.lxc_config(vmid),
            lambda s, d, digest: px.lxc_update(vmid, s, d, digest),
            lambda: px.lxc_pending(vmid),
            lambda r, digest: px.lxc_update(vmid, {}, [], digest, revert=r),
        )

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

    def read_pending(self) -> LxcPending:
        """A container's config with its pending section (what :meth:`restore_pending` takes)."""
        assert self.pending is not None, "only a container's config has a pending section"
        return LxcPending.of(self.pending())[0]

    def restore_pending(self, old: LxcPending, keys: set[str], also: Callable[[str], bool]) -> bool:
        """Put ``keys`` (and every key ``also`` accepts) of a running container back as ``old``
        had them, pending section included (:func:`pending_restore`), each PUT under the digest
        read right before it: the reverts first (Proxmox refuses a key reverted and set or
        deleted in one PUT, API2/LXC/Config.pm update_vm l. 186-208), then the sets and deletes,
        then the deletes of keys just set (a set takes a key off the delete queue,
        update_pct_config l. 1383). False when nothing differed."""
        assert self.pending is not None and self.revert is not None
        now, digest = LxcPending.of(self.pending())
        keys = set(keys) | {k for k in old.keys() | now.keys() if also(k)}
        reverts, sets, deletes = pending_restore(old, now, keys)
        puts = [
            ({}, [], reverts),
            (sets, [k for k in deletes if k not in sets], []),
            ({}, [k for k in deletes if k in sets], []),
        ]
        done = False
        for s, d, r in puts:
            if not (s or d or r):
                continue
            if done:
                digest = self.read()["digest"]
            if r:
                self.revert(r, digest)
            else:
                self.write(s, d, digest)
            done = True
        return done


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
