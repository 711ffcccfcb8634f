"""How a change to a container's config lands, as pve-container's API2/LXC/Config.pm update_vm
and LXC/Config.pm update_pct_config decide: the checks of the keys set, deleted and reverted,
then each key at once (fast-plug, hot-plug, a stopped container) or pending until the next start."""

from __future__ import annotations

import re
from collections.abc import Callable

from gputopo.formats.devn import is_devn_key
from gputopo.formats.lxcconf import LxcConf, LxcSection, check_lxc_option
from gputopo.sim.pveapi.answers import param_error, perm_error
from gputopo.sim.pveapi.auth import Caller

# Keys a running container takes at once (fast-plug) or hot-plugs (pve-container
# LXC/Config.pm:update_pct_config); anything else on a running CT stays pending.
FASTPLUG = {
    "description",
    "onboot",
    "startup",
    "protection",
    "hostname",
    "hookscript",
    "cores",
    "tags",
    "lock",
}
HOTPLUG = {"cpulimit", "cpuunits", "memory", "swap"}
DEV_RULE = "configuring device passthrough is only allowed for root@pam"


def check_update_keys(caller: Caller | None, sets: dict, deletes: list[str], reverts: list[str]) -> None:
    """update_vm's checks of the keys, in its order: root@pam alone may delete or revert a devN
    (check_ct_modify_config_perm, lines 179-184), a reverted or deleted key must be known and in
    no other list, and root@pam alone may set a devN. Raises the API's 403 or 400."""
    not_root = caller is not None and not caller.is_root_pam
    if not_root and any(is_devn_key(k) for k in deletes + reverts):
        raise perm_error(DEV_RULE)
    for k in reverts:
        # update_vm lines 186-192
        why = check_lxc_option(k, "0")
        if why and why.startswith("unknown setting") and k != "description":
            raise param_error({"revert": f"unknown option '{k}'"})
        if k in sets:
            raise param_error({"revert": f"you can't use '-{k}' and '-revert {k}' at the same time"})
    for k in deletes:
        # pve-container API2/LXC/Config.pm update_vm: unknown option, then set and delete
        why = check_lxc_option(k, "0")
        if why and why.startswith("unknown setting") and k != "description":
            raise param_error({"delete": f"unknown option '{k}'"})
        if k in sets:
            raise param_error({"delete": f"you can't use '-{k}' and -delete {k}' at the same time"})
        if k in reverts:
            raise param_error({"delete": f"you can't use '-delete {k}' and '-revert {k}' at the same time"})
    if not_root and any(is_devn_key(k) for k in sets):
        raise perm_error(DEV_RULE)


def apply_update(
    conf: LxcConf,
    sets: dict,
    deletes: list[str],
    reverts: list[str],
    running: bool,
    major: int,
    warn: Callable[[str], None],
) -> list[tuple[str, str]]:
    """Change ``conf`` as update_pct_config does and return the devN to hot-plug (key, value)
    into the running container; ``warn`` gets the Perl warning of a delete of an unset key."""
    pend = conf.pending
    # LXC/Config.pm update_pct_config (lines 1306-1309): a revert drops the key's pending
    # value and its pending delete, before anything else; the only way to take back a
    # pending devN that is not set now (a delete of it leaves the pending value)
    for k in reverts:
        pend.options.pop(k, None)
    pdel = [d for d in conf.pending_delete if d not in sets and d not in deletes and d not in reverts]
    plugged = _apply_sets(conf, sets, running, major)
    pdel += _apply_deletes(conf, deletes, running, warn)
    _write_pending_delete(conf, pdel)
    cleanup_pending(conf)
    return plugged


def _apply_sets(conf: LxcConf, sets: dict, running: bool, major: int) -> list[tuple[str, str]]:
    """Each key set: current at once, or pending; returns the devN a running container hot-plugs."""
    pend = conf.pending
    plugged = []
    for k, v in sets.items():
        pend.options.pop(k, None)
        now = (
            not running
            or k in FASTPLUG
            or k in HOTPLUG
            or (re.match(r"^net\d+$", k) and k not in conf.options)
            or (major >= 9 and is_devn_key(k) and k not in conf.options)
        )
        if now:
            if running and is_devn_key(k):
                plugged.append((k, v))
            if k == "description":
                conf.description = v
            else:
                conf.options[k] = v
        else:
            pend.options[k] = v
    return plugged


def _apply_deletes(
    conf: LxcConf, deletes: list[str], running: bool, warn: Callable[[str], None]
) -> list[str]:
    """Each key deleted: gone at once, or returned to be queued as a pending delete."""
    pend = conf.pending
    pdel = []
    for k in deletes:
        # LXC/Config.pm update_pct_config: a key set neither now nor pending is skipped
        # with a Perl warn, on a running container too (no pending delete is queued)
        if k not in conf.options and k not in pend.options and not (k == "description" and conf.description):
            warn(f"cannot delete '{k}' - not set in current configuration!")
            continue
        if not running or k in FASTPLUG:
            pend.options.pop(k, None)
            conf.options.pop(k, None)
            if k == "description":
                conf.description = None
        else:
            # add_to_pending_delete (pve-guest-common AbstractConfig.pm) leaves a pending
            # value where it is: a key set only in [pve:pending] keeps it (cleanup_pending
            # then drops the delete of a key not set now); only 'revert' takes it back
            pdel.append(k)
    return pdel


def cleanup_pending(conf: LxcConf) -> None:
    """Drop pending changes that change nothing (pve-guest-common AbstractConfig.pm
    cleanup_pending, run by update_pct_config after every change): a pending value equal to the
    current one, a pending delete of a key that is not set."""
    pend = conf.pending
    for k in [k for k, v in pend.options.items() if k != "delete" and conf.options.get(k) == v]:
        del pend.options[k]
    _write_pending_delete(conf, [d for d in conf.pending_delete if d in conf.options])


def _write_pending_delete(conf: LxcConf, keys: list[str]) -> None:
    """``[pve:pending]``'s ``delete``: the keys as one set, sorted (pve-guest-common
    AbstractConfig.pm print_pending_delete l. 93-103: ``join(',', ... sort keys %$delete_hash)``,
    Perl's string order, by every add_to_pending_delete, remove_from_pending_delete and
    cleanup_pending), or no ``delete`` when none is left."""
    if keys:
        conf.pending.options["delete"] = ",".join(sorted(set(keys)))
    else:
        conf.pending.options.pop("delete", None)


def apply_pending(conf: LxcConf) -> None:
    """Make ``conf``'s pending changes current (what a container start does)."""
    for k in conf.pending_delete:
        conf.options.pop(k, None)
    for k, v in conf.pending.options.items():
        if k != "delete":
            conf.options[k] = v
    conf.pending = LxcSection()
