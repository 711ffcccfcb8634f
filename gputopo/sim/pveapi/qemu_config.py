"""VM configs through the simulated API: ``GET`` and ``PUT .../qemu/{vmid}/config``.

As qemu-server's ``update_vm_api`` (``PVE/API2/Qemu.pm``) does it: every change is written to
``[PENDING]`` first; a stopped VM then takes it at once (``vmconfig_apply_pending``), a running
one only takes the fast-plug keys (``$fast_plug_option``) and keeps the rest (``hostpciN``,
``affinity``, ``numa``, ``hugepages``, ``args``...) pending until its next start. A stale digest
is ``checksum mismatch (file change by other user?)``; deleting a key that is not set warns and
is skipped; only root@pam may set a ``hostpciN`` with ``host=``, others need ``Mapping.Use``
for a mapping (``check_hostpci_perm``). Any other caller, an API token of root@pam included
(its user is the token id ``root@pam!name``), may set or delete only the keys
``$check_vm_modify_config_perm`` gives a privilege to; every other key (``affinity``, ``args``,
``hugepages``...) is ``only root can set '<key>' config`` (500).
"""

from __future__ import annotations

import re
from typing import Any

from gputopo.errors import PveFormatError
from gputopo.formats.hostpci import is_hostpci_key, parse_hostpci
from gputopo.formats.propstring import sha1_digest
from gputopo.formats.qemuconf import QemuConf, check_qemu_option, parse_qemu_conf, write_qemu_conf
from gputopo.sim import state
from gputopo.sim.files import PMXCFS_MODE, atomic_write
from gputopo.sim.pveapi.answers import die, param_error, perm_error
from gputopo.sim.pveapi.auth import Caller

FAST_PLUG = {
    "description",
    "hookscript",
    "lock",
    "migrate_downtime",
    "migrate_speed",
    "name",
    "onboot",
    "protection",
    "shares",
    "startup",
    "tags",
    "vmstatestorage",
}
# the part of qemu-server's config schema the simulator knows; anything else is not in the schema
_KEYS = {
    "acpi",
    "affinity",
    "agent",
    "args",
    "balloon",
    "bios",
    "boot",
    "cores",
    "cpu",
    "cpulimit",
    "cpuunits",
    "description",
    "hotplug",
    "hugepages",
    "keephugepages",
    "kvm",
    "lock",
    "machine",
    "memory",
    "name",
    "numa",
    "onboot",
    "ostype",
    "protection",
    "scsihw",
    "shares",
    "sockets",
    "startup",
    "tablet",
    "tags",
    "vcpus",
    "vga",
    "vmgenid",
    "meta",
}
# qemu-server 9.2.6 src/PVE/API2/Qemu.pm, the option groups of $check_vm_modify_config_perm
# (lines 789-862: $cpuoptions, $memoryoptions, $hwtypeoptions, $generaloptions, $vmpoweroptions,
# $diskoptions, $cloudinitoptions) and the privilege each needs (lines 995-1043)
_PRIV_OF_GROUP = (
    (
        {"cores", "cpu", "runningcpu", "cpulimit", "cpuunits", "numa", "smp", "sockets", "vcpus"},
        "VM.Config.CPU",
    ),
    ({"memory", "balloon", "shares", "allow-ksm"}, "VM.Config.Memory"),
    (
        {
            "acpi",
            "hotplug",
            "kvm",
            "machine",
            "runningmachine",
            "scsihw",
            "smbios1",
            "tablet",
            "vga",
            "watchdog",
            "audio0",
            "rng0",
        },
        "VM.Config.HWType",
    ),
    (
        {
            "agent",
            "autostart",
            "bios",
            "description",
            "keyboard",
            "localtime",
            "migrate_downtime",
            "migrate_speed",
            "name",
            "onboot",
            "ostype",
            "protection",
            "reboot",
            "startdate",
            "startup",
            "tdf",
            "template",
        },
        "VM.Config.Options",
    ),
    ({"freeze"}, "VM.PowerMgmt"),
    ({"boot", "bootdisk", "vmstatestorage"}, "VM.Config.Disk"),
    (
        {"cicustom", "cipassword", "citype", "ciuser", "ciupgrade", "nameserver", "searchdomain", "sshkeys"},
        "VM.Config.Cloudinit|VM.Config.Network",  # either of them
    ),
)
# keys whose check is value dependent and done elsewhere ($check_vm_modify_config_perm's `next`s;
# hostpciN too, see _check_hostpci_perm)
_PERM_ELSEWHERE = re.compile(
    r"^(?:(?:ide|sata|scsi|virtio|efidisk|tpmstate|unused|serial|usb|virtiofs)\d+|cdrom|tags)$"
)
_INDEXED = re.compile(
    r"^(numa|net|scsi|virtio|sata|ide|efidisk|tpmstate|unused|usb|serial|ipconfig)\d+$"
)  # and hostpciN
_INT_KEYS = {"cores", "sockets", "memory", "vcpus", "balloon", "cpuunits"}
_BOOL_KEYS = {"numa", "onboot", "protection", "acpi", "kvm", "tablet"}


def qemu_key_known(name: str) -> bool:
    """True for a key the VM config schema defines."""
    return name in _KEYS or is_hostpci_key(name) or bool(_INDEXED.match(name))


def qemu_param_problem(name: str, value: Any) -> str | None:
    """Why the API refuses parameter ``name`` of a VM config update, or None."""
    if not qemu_key_known(name):
        return "property is not defined in schema and the schema does not allow additional properties"
    if isinstance(value, list):
        return "type check ('string') failed - got ARRAY"
    why = check_qemu_option(name, str(value))
    if why:
        return why if why.startswith(("type check", "value ")) else f"invalid format - {why}\n"
    return None


def apply_pending(conf: QemuConf) -> None:
    """What qemu-server's ``vmconfig_apply_pending`` does: pending values and deletions become
    the config."""
    for k in conf.pending_delete:
        conf.options.pop(k, None)
        if k == "description":
            conf.description = None
    conf.options.update({k: v for k, v in conf.pending.items() if k != "delete"})
    conf.pending = {}


def vm_view(text: str, current: bool) -> dict[str, Any]:
    """The VM config as GET answers it: pending values merged in unless ``current``."""
    conf = parse_qemu_conf(text)
    opts = dict(conf.options)
    if conf.description:
        opts["description"] = conf.description
    if not current:
        # pve-guest-common AbstractConfig.pm load_current_config: pending values (a pending
        # description too) replace the current ones; a pending delete removes a key whose value
        # is true to Perl
        opts.update({k: v for k, v in conf.pending.items() if k != "delete"})
        for k in conf.pending_delete:
            if opts.get(k) not in (None, "", "0"):
                del opts[k]
    out: dict[str, Any] = {k: _typed(k, v) for k, v in opts.items()}
    out["digest"] = sha1_digest(text)
    return out


def _typed(k: str, v: str) -> Any:
    """A value as parse_vm_config keeps it (check_type: an integer key's digits as a number, a
    boolean as 1 or 0)."""
    if k in _INT_KEYS and v.isdigit():
        return int(v)
    if k in _BOOL_KEYS:
        return 1 if v.lower() in ("1", "yes", "on", "true") else 0
    return v


def pending_items(text: str) -> list[dict[str, Any]]:
    """GET .../qemu/{vmid}/pending (qemu-server src/PVE/API2/Qemu.pm ``vm_pending``, with
    pve-guest-common src/PVE/GuestHelpers.pm ``config_with_pending_array``): one item per key set
    now (``value``, with ``pending`` and ``delete`` when queued; ``digest`` among them, as
    load_config adds it), then one per key set only pending, then one per pending delete of a
    key not set now. ``delete`` is 2 for a forced delete (``!key``); in the last part it is
    always 2, as there the loop tests the parsed ``{force => ...}`` hash, which Perl holds true.
    Perl's hash order is random: each part is sorted here."""
    conf = parse_qemu_conf(text)
    pend = {k: v for k, v in conf.pending.items() if k != "delete"}
    dels = {
        d.lstrip("!"): 2 if d.startswith("!") else 1
        for d in re.split(r"[,;\s]+", conf.pending.get("delete", ""))
        if d
    }
    now = {**conf.options, **({"description": conf.description} if conf.description else {})}
    out: list[dict[str, Any]] = []
    for k in sorted([*now, "digest"]):
        item: dict[str, Any] = {"key": k, "value": sha1_digest(text) if k == "digest" else _typed(k, now[k])}
        if k in pend:
            item["pending"] = _typed(k, pend.pop(k))
        if k in dels:
            item["delete"] = dels.pop(k)
        out.append(item)
    out += [{"key": k, "pending": _typed(k, v)} for k, v in sorted(pend.items())]
    out += [{"key": k, "delete": 2} for k in sorted(dels)]
    return out


class QemuConfigHandlers:
    """VM config handlers of :class:`gputopo.sim.pveapi.PveApiServer` (a mixin)."""

    def h_qemu_get(self, caller: Caller, p: dict) -> Any:
        text = self._load("qemu", p["vmid"])
        if p.get("snapshot"):
            snap = parse_qemu_conf(text).snapshots.get(p["snapshot"])
            if snap is None:
                raise die(f"snapshot '{p['snapshot']}' does not exist")
            return {**snap, "digest": sha1_digest(text)}
        return vm_view(text, bool(p.get("current")))

    def h_qemu_pending(self, caller: Caller, p: dict) -> Any:
        return pending_items(self._load("qemu", p["vmid"]))

    def _check_hostpci_perm(self, caller: Caller | None, key: str, value: str) -> None:
        if caller is None or caller.is_root_pam:
            return
        try:
            props = parse_hostpci(value)
        except PveFormatError:
            return  # the parameter check reports it
        if "host" in props:
            raise die(f"only root can set '{key}' config for non-mapped devices")
        if not self._has_any(caller, ("Mapping.Use",)):
            raise perm_error(f"/mapping/pci/{props['mapping']}, Mapping.Use")

    def _check_modify_perm(self, caller: Caller | None, vmid: int, keys: list[str]) -> None:
        """qemu-server's ``$check_vm_modify_config_perm`` (API2/Qemu.pm line 995): root@pam may
        change anything; for anyone else (``$authuser`` of a token is ``user@realm!name``,
        pve-manager PVE/HTTPServer.pm auth_handler line 86) a key in an option group needs that
        group's privilege, and any other key dies ``only root can set '$opt' config`` (line 1037)."""
        if caller is None or caller.is_root_pam:
            return
        for k in keys:
            if _PERM_ELSEWHERE.match(k) or is_hostpci_key(k):
                continue
            if re.match(r"^numa\d+$", k):
                priv = "VM.Config.CPU"
            elif re.match(r"^(?:net\d+|running-nets-host-mtu)$", k):
                priv = "VM.Config.Network"
            elif re.match(r"^ipconfig\d+$", k):
                priv = "VM.Config.Cloudinit|VM.Config.Network"
            else:
                priv = next((pr for group, pr in _PRIV_OF_GROUP if k in group), None)
            if priv is None:
                raise die(f"only root can set '{k}' config")
            if not self._has_any(caller, tuple(priv.split("|"))):
                raise perm_error(f"/vms/{vmid}, {priv}")

    def h_qemu_put(self, caller: Caller, p: dict) -> Any:
        vmid = p.pop("vmid")
        p.pop("node")
        digest = p.pop("digest", None)
        skiplock = p.pop("skiplock", False)
        deletes = [d.lstrip("!") for d in p.pop("delete", [])]
        reverts = list(p.pop("revert", []))
        sets = {k: str(v) for k, v in p.items()}
        # update_vm_api (API2/Qemu.pm): nothing to set, delete or revert dies first (line 2110)
        if not sets and not deletes and not reverts:
            raise die("no options specified")
        _check_update_keys(sets, deletes, reverts)
        # update_vm_api (API2/Qemu.pm lines 2196-2198): the deletes' keys, then the set ones,
        # before the config is read and its digest compared
        self._check_modify_perm(caller, vmid, deletes)
        self._check_modify_perm(caller, vmid, sorted(sets))
        for k, v in sets.items():
            if is_hostpci_key(k):
                self._check_hostpci_perm(caller, k, v)
        with self._lock:
            text = self._load("qemu", vmid)
            if digest and sha1_digest(text) != digest:
                raise die("checksum mismatch (file change by other user?)")
            conf = parse_qemu_conf(text)
            if conf.options.get("lock") and not skiplock:
                raise die(f"VM is locked ({conf.options['lock']})")
            _queue_update(conf, sets, deletes, reverts)
            if state.guest_status(self.run_dir, "qemu", vmid) != "running":
                apply_pending(conf)
            else:
                for k in [k for k in conf.pending if k in FAST_PLUG]:
                    conf.options[k] = conf.pending.pop(k)
            atomic_write(self.conf_path("qemu", vmid), write_qemu_conf(conf), PMXCFS_MODE)
        return None


def _check_update_keys(sets: dict[str, str], deletes: list[str], reverts: list[str]) -> None:
    """update_vm_api's checks of the keys (API2/Qemu.pm lines 2116-2125, the wording and the
    'delete' key as Proxmox has it): known keys, none both reverted or deleted and set, none
    both deleted and reverted. Raises the API's 400."""
    for k in reverts:
        if not qemu_key_known(k):
            raise param_error({"revert": f"unknown option '{k}'"})
        if k in sets:
            raise param_error({"delete": f"you can't use '-{k}' and -revert {k}' at the same time"})
    for k in deletes:
        if k in reverts:
            raise param_error({"revert": f"you can't use '-delete {k}' and -revert {k}' at the same time"})
    for k in deletes:
        if k in sets:
            raise param_error({"delete": f"you can't use '-{k}' and -delete {k}' at the same time"})
        if not qemu_key_known(k):
            raise param_error({"delete": f"unknown option '{k}'"})


def _queue_update(conf: QemuConf, sets: dict[str, str], deletes: list[str], reverts: list[str]) -> None:
    """Queue the change in ``conf``'s pending section, as update_vm_api writes it."""
    # $load_and_check_config: a reverted key set now is set to its current value (which
    # drops its pending change); one set only pending is deleted (which drops it)
    for k in reverts:
        if k in conf.options:
            sets[k] = conf.options[k]
        elif k in conf.pending:
            deletes.append(k)
    pdel = [d for d in conf.pending_delete if d not in sets]
    for k in deletes:
        if k not in conf.options and k not in conf.pending:
            continue  # "cannot delete '$opt' - not set in current configuration!" (a warning)
        conf.pending.pop(k, None)
        if k in conf.options and k not in pdel:
            pdel.append(k)
    conf.pending.update(sets)
    # cleanup_pending: a pending value equal to the current one is no change
    for k in [k for k, v in conf.pending.items() if k != "delete" and conf.options.get(k) == v]:
        del conf.pending[k]
    if pdel:
        conf.pending["delete"] = ",".join(pdel)
    else:
        conf.pending.pop("delete", None)
