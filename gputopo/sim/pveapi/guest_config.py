"""Guest configs through the simulated API: list, read (pending, snapshots) and change.

A running container takes some keys at once (fast-plug), hot-plugs others and keeps the rest
pending until its next start, as pve-container's LXC/Config.pm:update_pct_config decides; a
PVE 9 node hot-plugs a new ``devN`` too. Only root@pam may configure device passthrough.

A hot-plug can be made to fail (:meth:`GuestConfigHandlers.inject_hotplug_failure`); the PUT then
answers as pve-container does: 400 with the devN's error, nothing written, and the other new devN
of the same PUT hot-plugged all the same (the container keeps them until it restarts).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from gputopo.formats.devn import is_devn_key
from gputopo.formats.lxcconf import (
    LxcConf,
    parse_dev_value,
    parse_lxc_conf,
    write_lxc_conf,
)
from gputopo.formats.propstring import sha1_digest
from gputopo.sim import state
from gputopo.sim.addresses import container_address
from gputopo.sim.files import PMXCFS_MODE, atomic_write
from gputopo.sim.pveapi.answers import die, param_error
from gputopo.sim.pveapi.auth import Caller
from gputopo.sim.pveapi.lxc_update import apply_update, check_update_keys
from gputopo.sim.pveapi.params import BOOL_KEYS, INT_KEYS

HOTPLUG_FAULTS = "hotplug-faults"  # run-state name: devN hot-plugs that fail
# a failure device_passthrough_hotplug (pve-container src/PVE/LXC.pm l. 2336-2416) can die
# with: the move_mount of the new node into the container's mount namespace refused (l. 2405)
HOTPLUG_ERROR = "move_mount failed: Operation not permitted"


class GuestConfigHandlers:
    """Guest config handlers of :class:`gputopo.sim.pveapi.PveApiServer` (a mixin)."""

    def inject_hotplug_failure(
        self, vmid: int, key: str | None = None, message: str = HOTPLUG_ERROR, count: int | None = 1
    ) -> None:
        """Make the next ``count`` hot-plugs (every one until healed when None) of a new devN
        (``key``; any devN when None) into running container ``vmid`` fail with ``message``, as
        ``device_passthrough_hotplug`` dies (``move_mount failed: ...``, ``failed to open pidfd of
        container ...``)."""
        add_hotplug_fault(self.run_dir, vmid, key, message, count)

    def _take_hotplug_fault(self, vmid: int, key: str) -> str | None:
        if not (self.run_dir / f"{HOTPLUG_FAULTS}.json").exists():
            return None
        with state.locked(self.run_dir, HOTPLUG_FAULTS):
            faults = state.read_state(self.run_dir, HOTPLUG_FAULTS, []) or []
            for f in faults:
                if f["vmid"] == vmid and f["key"] in (None, key) and (f["count"] is None or f["count"] > 0):
                    if f["count"] is not None:
                        f["count"] -= 1
                        faults = [x for x in faults if x["count"] is None or x["count"] > 0]
                        state.write_state(self.run_dir, HOTPLUG_FAULTS, faults)
                    return str(f["message"])
        return None

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
        descr = conf.description
        if not current and conf.pending.description:
            descr = conf.pending.description  # load_current_config takes the pending one in
        if descr:
            out["description"] = descr
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

    def h_lxc_pending(self, caller: Caller, p: dict) -> Any:
        """GET .../lxc/{vmid}/pending (pve-container src/PVE/API2/LXC.pm ``vm_pending``, with
        pve-guest-common ``GuestHelpers.pm`` ``config_with_pending_array``): one item per key set
        now (``value``, and ``pending``/``delete`` when queued; ``digest`` among them), then one per
        key set only pending, then one per pending delete of a key not set now. Raw ``lxc.*``
        lines are left out. Perl's hash order is random: the simulator sorts each part."""
        text = self._load("lxc", p["vmid"])
        conf = parse_lxc_conf(text)
        pend = {k: v for k, v in conf.pending.options.items() if k != "delete"}
        dels = set(conf.pending_delete)
        now = {**conf.options, **({"description": conf.description} if conf.description else {})}
        now["digest"] = sha1_digest(text)
        out: list[dict[str, Any]] = []
        for k in sorted(now):
            item: dict[str, Any] = {"key": k, "value": _typed(k, now[k]) if k != "digest" else now[k]}
            if k in pend:
                item["pending"] = _typed(k, pend.pop(k))
            if k in dels:
                dels.discard(k)
                item["delete"] = 1
            out.append(item)
        out += [{"key": k, "pending": _typed(k, v)} for k, v in sorted(pend.items())]
        out += [{"key": k, "delete": 1} for k in sorted(dels)]
        return out

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

    def _check_devn_paths(self, sets: dict) -> None:
        """Every devN set names a host path that exists, or the API dies."""
        for k, v in sets.items():
            if is_devn_key(k):
                # pve-container LXC/Config.pm update_pct_config validates every devN set with
                # LXC/Tools.pm get_device_mode_and_rdev: stat() of the host path, "Device
                # $path does not exist" on ENOENT (the container's start checks the same,
                # LXC.pm update_lxc_config: gputopo.sim.guesthooks)
                path = parse_dev_value(v)["path"]
                if self.sysfs_root is not None and not os.path.exists(self.sysfs_root / path.lstrip("/")):
                    raise die(f"Device {path} does not exist")

    def h_lxc_put(self, caller: Caller, p: dict) -> Any:
        vmid = p.pop("vmid")
        p.pop("node")
        digest = p.pop("digest", None)
        # pve-container src/PVE/API2/LXC/Config.pm update_vm (line 161): with node, vmid and
        # digest taken out, no parameter left dies at once, before the config is locked and read
        # (so before its lock and its digest are checked); 'delete' or 'revert' count as one
        if not p:
            raise die("no options specified")
        deletes = [d.lstrip("!") for d in p.pop("delete", [])]
        reverts = list(p.pop("revert", []))
        sets = p
        with self._lock:
            text = self._load("lxc", vmid)
            conf = parse_lxc_conf(text)
            lock = conf.options.get("lock")
            if lock:
                raise die(f"CT is locked ({lock})")
            if digest and sha1_digest(text) != digest:
                raise die("detected modified configuration - file changed by other user? Try again.")
            check_update_keys(caller, sets, deletes, reverts)
            self._check_devn_paths(sets)
            running = state.guest_status(self.run_dir, "lxc", vmid) == "running"
            major = int(self.version.split(".")[0])
            plugged = apply_update(conf, sets, deletes, reverts, running, major, self.print_stderr)
            # pve-container (94f5585) src/PVE/LXC/Config.pm vmconfig_hotplug_pending: each new
            # devN in key order (l. 1702-1736, device_passthrough_hotplug), an error recorded as
            # "unable to hotplug $opt: $msg" (l. 1630-1633, the die text with its newline) and
            # the loop going on, the key left pending (l. 1740-1745); src/PVE/API2/LXC/Config.pm
            # update_vm then raises them as parameter errors (l. 258-259, raise_param_exc: 400
            # "Parameter verification failed.") before write_config (l. 261): nothing written,
            # while the devN plugged before or after the failed one stay in the running container
            errors = {}
            for k, _ in sorted(plugged):
                msg = self._take_hotplug_fault(vmid, k)
                if msg is not None:
                    errors[k] = f"unable to hotplug {k}: {msg.rstrip(chr(10))}\n"
            plugged = [(k, v) for k, v in sorted(plugged) if k not in errors]
            if not errors:
                atomic_write(self.conf_path("lxc", vmid), write_lxc_conf(conf), PMXCFS_MODE)
        for k, v in plugged:
            if self.hooks is not None and hasattr(self.hooks, "on_lxc_hotplug"):
                self.hooks.on_lxc_hotplug(vmid, k, v)
        if errors:
            raise param_error(errors)
        return None


def _truthy(v: str | None) -> bool:
    return v not in (None, "", "0")


def _typed(key: str, value: str) -> Any:
    if key in INT_KEYS and re.match(r"^-?\d+$", value):
        return int(value)
    if key in BOOL_KEYS:
        return 1 if value.lower() in ("1", "yes", "on", "true") else 0
    return value


def add_hotplug_fault(
    run_dir: Path, vmid: int, key: str | None = None, message: str = HOTPLUG_ERROR, count: int | None = 1
) -> None:
    """Record a hot-plug fault in the run state of ``run_dir`` (see
    :meth:`GuestConfigHandlers.inject_hotplug_failure`); no server needs to run."""
    with state.locked(run_dir, HOTPLUG_FAULTS):
        faults = state.read_state(run_dir, HOTPLUG_FAULTS, []) or []
        faults.append({"vmid": vmid, "key": key, "message": message, "count": count})
        state.write_state(run_dir, HOTPLUG_FAULTS, faults)


def clear_hotplug_faults(run_dir: Path, vmid: int) -> None:
    """Remove every hot-plug fault of container ``vmid``."""
    with state.locked(run_dir, HOTPLUG_FAULTS):
        faults = state.read_state(run_dir, HOTPLUG_FAULTS, []) or []
        state.write_state(run_dir, HOTPLUG_FAULTS, [f for f in faults if f["vmid"] != vmid])
