"""Guest configs through the simulated API: list, read (pending, snapshots) and change.

A running container takes some keys at once (fast-plug), hot-plugs others and keeps the rest
pending until its next start, as pve-container's LXC/Config.pm:update_pct_config decides; a
PVE 9 node hot-plugs a new ``devN`` too. Only root@pam may configure device passthrough.
"""

from __future__ import annotations

import os
import re
from typing import Any

from gputopo.formats.devn import is_devn_key
from gputopo.formats.lxcconf import (
    LxcConf,
    LxcSection,
    check_lxc_option,
    parse_dev_value,
    parse_lxc_conf,
    write_lxc_conf,
)
from gputopo.formats.propstring import sha1_digest
from gputopo.sim import state
from gputopo.sim.addresses import container_address
from gputopo.sim.files import PMXCFS_MODE, atomic_write
from gputopo.sim.pveapi.answers import die, param_error, perm_error
from gputopo.sim.pveapi.auth import Caller
from gputopo.sim.pveapi.params import BOOL_KEYS, INT_KEYS

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


class GuestConfigHandlers:
    """Guest config handlers of :class:`gputopo.sim.pveapi.PveApiServer` (a mixin)."""

    def _config_rel(self, kind: str, vmid: int) -> str:
        return f"nodes/{self.node}/{'lxc' if kind == 'lxc' else 'qemu-server'}/{vmid}.conf"

    def _load(self, kind: str, vmid: int) -> str:
        try:
            return self.conf_path(kind, vmid).read_text()
        except FileNotFoundError:
            raise die(f"Configuration file '{self._config_rel(kind, vmid)}' does not exist") from None

    def _guest_view(
        self, kind: str, vmid: int, text: str, current: bool, snapshot: str | None = None
    ) -> dict:
        conf = parse_lxc_conf(text)
        if snapshot:
            # AbstractConfig load_current_config: that snapshot's keys, the file's digest
            snap = conf.snapshots.get(snapshot)
            if snap is None:
                raise die(f"snapshot '{snapshot}' does not exist")
            conf = LxcConf(options=snap.options, lxc=snap.lxc, description=snap.description)
        opts = dict(conf.options)
        if not current:
            opts.update({k: v for k, v in conf.pending.options.items() if k != "delete"})
            for k in conf.pending_delete:
                if _truthy(opts.get(k)):
                    opts.pop(k, None)
        out: dict[str, Any] = {k: _typed(k, v) for k, v in opts.items()}
        if conf.description:
            out["description"] = conf.description
        if conf.lxc and kind == "lxc":
            out["lxc"] = [[k, v] for k, v in conf.lxc]
        out["digest"] = sha1_digest(text)
        return out

    def h_list_guests(self, caller: Caller, p: dict) -> Any:
        kind = p["kind"]
        folder = self.conf_path(kind, 100).parent
        out = []
        for f in sorted(folder.glob("*.conf")):
            if not f.stem.isdigit():
                continue
            vmid = int(f.stem)
            if not self._has_any(caller, ("VM.Audit",)):
                continue
            opts = parse_lxc_conf(f.read_text()).options
            name = (
                opts.get("hostname" if kind == "lxc" else "name")
                or f"{'CT' if kind == 'lxc' else 'VM'}{vmid}"
            )
            item = {
                "vmid": vmid,
                "status": state.guest_status(self.run_dir, kind, vmid),
                "name": name,
                "maxmem": int(opts.get("memory", 512)) << 20,
                "cpus": int(opts.get("cores", 1) or 1),
            }
            if kind == "lxc":
                item["type"] = "lxc"
            out.append(item)
        return out

    def h_lxc_get(self, caller: Caller, p: dict) -> Any:
        if p.get("snapshot") and p.get("current"):
            msg = "cannot use 'snapshot' parameter with 'current'"
            raise param_error({"snapshot": msg, "current": msg})
        text = self._load("lxc", p["vmid"])
        return self._guest_view("lxc", p["vmid"], text, bool(p.get("current")), p.get("snapshot"))

    def h_lxc_interfaces(self, caller: Caller, p: dict) -> Any:
        """The running container's interfaces as ``ip --json a`` inside it shows them
        (pve-container ``PVE::LXC::get_interfaces``: lo and eth0 with ``inet`` as address/prefix,
        ``hwaddr`` and ``hardware-address``, ``ip-addresses``); a stopped container has no pid to
        enter, so the answer is null (``get_interfaces`` returns early)."""
        vmid = p["vmid"]
        opts = parse_lxc_conf(self._load("lxc", vmid)).options
        if state.guest_status(self.run_dir, "lxc", vmid) != "running":
            return None
        net0 = dict(kv.split("=", 1) for kv in str(opts.get("net0", "")).split(",") if "=" in kv)
        mac = net0.get("hwaddr", "bc:24:11:00:00:00").lower()
        out = []
        for name, addr, prefix, hw in (
            ("lo", "127.0.0.1", 8, "00:00:00:00:00:00"),
            (net0.get("name", "eth0"), container_address(vmid), 24, mac),
        ):
            out.append(
                {
                    "name": name,
                    "hwaddr": hw,
                    "hardware-address": hw,
                    "inet": f"{addr}/{prefix}",
                    "ip-addresses": [{"ip-address-type": "inet", "ip-address": addr, "prefix": prefix}],
                }
            )
        return out

    def h_lxc_put(self, caller: Caller, p: dict) -> Any:
        vmid = p.pop("vmid")
        p.pop("node")
        digest = p.pop("digest", None)
        deletes = [d.lstrip("!") for d in p.pop("delete", [])]
        p.pop("revert", None)
        sets = p
        with self._lock:
            text = self._load("lxc", vmid)
            conf = parse_lxc_conf(text)
            lock = conf.options.get("lock")
            if lock:
                raise die(f"CT is locked ({lock})")
            if digest and sha1_digest(text) != digest:
                raise die("detected modified configuration - file changed by other user? Try again.")
            dev_rule = "configuring device passthrough is only allowed for root@pam"
            if caller is not None and not caller.is_root_pam and any(is_devn_key(k) for k in deletes):
                raise perm_error(dev_rule)
            for k in deletes:
                # pve-container API2/LXC/Config.pm update_vm: unknown option, then set and delete
                why = check_lxc_option(k, "0")
                if why and why.startswith("unknown setting") and k != "description":
                    raise param_error({"delete": f"unknown option '{k}'"})
                if k in sets:
                    raise param_error({"delete": f"you can't use '-{k}' and -delete {k}' at the same time"})
            if caller is not None and not caller.is_root_pam and any(is_devn_key(k) for k in sets):
                raise perm_error(dev_rule)
            if not sets and not deletes:
                raise die("no options specified")
            for k, v in sets.items():
                if is_devn_key(k):
                    # pve-container LXC/Config.pm update_pct_config validates every devN set with
                    # LXC/Tools.pm get_device_mode_and_rdev: stat() of the host path, "Device
                    # $path does not exist" on ENOENT (the container's start checks the same,
                    # LXC.pm update_lxc_config: gputopo.sim.guesthooks)
                    path = parse_dev_value(v)["path"]
                    if self.sysfs_root is not None and not os.path.exists(self.sysfs_root / path.lstrip("/")):
                        raise die(f"Device {path} does not exist")
            running = state.guest_status(self.run_dir, "lxc", vmid) == "running"
            major = int(self.version.split(".")[0])
            plugged = []
            pend = conf.pending
            pdel = [d for d in conf.pending_delete if d not in sets and d not in deletes]
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
            for k in deletes:
                # LXC/Config.pm update_pct_config: a key set neither now nor pending is skipped
                # with a Perl warn, on a running container too (no pending delete is queued)
                if (
                    k not in conf.options
                    and k not in pend.options
                    and not (k == "description" and conf.description)
                ):
                    self.print_stderr(f"cannot delete '{k}' - not set in current configuration!")
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
            if pdel:
                pend.options["delete"] = ",".join(pdel)
            else:
                pend.options.pop("delete", None)
            cleanup_pending(conf)
            atomic_write(self.conf_path("lxc", vmid), write_lxc_conf(conf), PMXCFS_MODE)
        for k, v in plugged:
            if self.hooks is not None and hasattr(self.hooks, "on_lxc_hotplug"):
                self.hooks.on_lxc_hotplug(vmid, k, v)
        return None


def _truthy(v: str | None) -> bool:
    return v not in (None, "", "0")


def _typed(key: str, value: str) -> Any:
    if key in INT_KEYS and re.match(r"^-?\d+$", value):
        return int(value)
    if key in BOOL_KEYS:
        return 1 if value.lower() in ("1", "yes", "on", "true") else 0
    return value


def cleanup_pending(conf: LxcConf) -> None:
    """Drop pending changes that change nothing (pve-guest-common AbstractConfig.pm
    cleanup_pending, run by update_pct_config after every change): a pending value equal to the
    current one, a pending delete of a key that is not set."""
    pend = conf.pending
    for k in [k for k, v in pend.options.items() if k != "delete" and conf.options.get(k) == v]:
        del pend.options[k]
    keep = [d for d in conf.pending_delete if d in conf.options]
    if keep:
        pend.options["delete"] = ",".join(keep)
    else:
        pend.options.pop("delete", None)


def apply_pending(conf: LxcConf) -> None:
    """Make ``conf``'s pending changes current (what a container start does)."""
    for k in conf.pending_delete:
        conf.options.pop(k, None)
    for k, v in conf.pending.options.items():
        if k != "delete":
            conf.options[k] = v
    conf.pending = LxcSection()
