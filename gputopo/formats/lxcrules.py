"""What pve-container accepts in a container config ``/etc/pve/lxc/<vmid>.conf``: the line
grammar, the raw ``lxc.*`` keys its parser keeps, a checker per key, and the validator. Pure.

:func:`validate_lxc_conf` encodes the parser rules of Proxmox (see docs: proxmox.md); it returns
one line per problem, empty when Proxmox would accept the text without a warning.
:func:`check_lxc_option` checks one ``key: value``.
"""

from __future__ import annotations

import re

from gputopo.errors import PveFormatError
from gputopo.formats.lxcdev import parse_dev_value
from gputopo.formats.propstring import (
    bool_check,
    enum_check,
    int_check,
    number_check,
    string_check,
)

# the lines of a config: a raw ``lxc.*`` line, a ``key: value`` line, the section headers, and a
# ``description:`` line
LXC_RAW_RE = re.compile(r"^(lxc\.[a-z0-9_.-]+)(:|\s*=)\s*(.*?)\s*$")
LXC_KEY_RE = re.compile(r"^([a-z][a-z_]*\d*):\s*(.+?)\s*$")
PENDING_RE = re.compile(r"^\[pve:pending\]\s*$", re.IGNORECASE)
SNAP_RE = re.compile(r"^\[([a-z][a-z0-9_-]+)\]\s*$", re.IGNORECASE)
DESCR_KEY_RE = re.compile(r"^description:\s*(.*\S)\s*$")


# pve-container src/PVE/LXC/Config.pm ``is_valid_lxc_conf_key``: the raw keys parse_pct_config
# keeps (``$valid_lxc_conf_keys`` entries valued 1, the ``$deprecated_lxc_conf_keys`` it renames
# with a warning only, and four prefixes); any other ``lxc.*`` line is warned about and dropped
_LXC_RAW_VALID = frozenset(
    (
        "lxc.apparmor.profile",
        "lxc.apparmor.allow_incomplete",
        "lxc.apparmor.allow_nesting",
        "lxc.apparmor.raw",
        "lxc.selinux.context",
        "lxc.include",
        "lxc.arch",
        "lxc.uts.name",
        "lxc.signal.halt",
        "lxc.signal.reboot",
        "lxc.signal.stop",
        "lxc.init.cmd",
        "lxc.init.cwd",
        "lxc.init.uid",
        "lxc.init.gid",
        "lxc.init.groups",
        "lxc.pty.max",
        "lxc.console.logfile",
        "lxc.console.path",
        "lxc.tty.max",
        "lxc.devtty.dir",
        "lxc.hook.autodev",
        "lxc.autodev",
        "lxc.kmsg",
        "lxc.mount.fstab",
        "lxc.mount.entry",
        "lxc.mount.auto",
        "lxc.rootfs.mount",
        "lxc.cap.drop",
        "lxc.cap.keep",
        "lxc.seccomp.profile",
        "lxc.seccomp.notify.proxy",
        "lxc.seccomp.notify.cookie",
        "lxc.idmap",
        "lxc.hook.pre-start",
        "lxc.hook.pre-mount",
        "lxc.hook.mount",
        "lxc.hook.start",
        "lxc.hook.stop",
        "lxc.hook.post-stop",
        "lxc.hook.clone",
        "lxc.hook.destroy",
        "lxc.hook.version",
        "lxc.log.level",
        "lxc.log.file",
        "lxc.start.auto",
        "lxc.start.delay",
        "lxc.start.order",
        "lxc.group",
        "lxc.environment",
        "lxc.environment.runtime",
        "lxc.environment.hooks",
        "lxc.sysctl.fs.mqueue",
        "lxc.sysctl.kernel.msgmax",
        "lxc.sysctl.kernel.msgmnb",
        "lxc.sysctl.kernel.msgmni",
        "lxc.sysctl.kernel.sem",
        "lxc.sysctl.kernel.shmall",
        "lxc.sysctl.kernel.shmmax",
        "lxc.sysctl.kernel.shmmni",
        "lxc.sysctl.kernel.shm_rmid_forced",
    )
)
_LXC_RAW_DEPRECATED = frozenset(
    (
        "lxc.aa_profile",
        "lxc.aa_allow_incomplete",
        "lxc.console",
        "lxc.devttydir",
        "lxc.haltsignal",
        "lxc.rebootsignal",
        "lxc.stopsignal",
        "lxc.id_map",
        "lxc.init_cmd",
        "lxc.loglevel",
        "lxc.logfile",
        "lxc.mount",
        "lxc.network.type",
        "lxc.network.flags",
        "lxc.network.link",
        "lxc.network.mtu",
        "lxc.network.name",
        "lxc.network.hwaddr",
        "lxc.network.ipv4",
        "lxc.network.ipv4.gateway",
        "lxc.network.ipv6",
        "lxc.network.ipv6.gateway",
        "lxc.network.script.up",
        "lxc.network.script.down",
        "lxc.pts",
        "lxc.se_context",
        "lxc.seccomp",
        "lxc.tty",
        "lxc.utsname",
    )
)
_LXC_RAW_PREFIXES = ("lxc.limit.", "lxc.cgroup.", "lxc.cgroup2.", "lxc.prlimit.", "lxc.net.")


def lxc_raw_key_kept(key: str) -> bool:
    """Whether pve-container's parser keeps the raw ``lxc.*`` line ``key`` (it drops the rest
    with a warning: ``lxc.rootfs.path``, ``lxc.rootfs.options``, unknown keys)."""
    return key in _LXC_RAW_VALID or key in _LXC_RAW_DEPRECATED or key.startswith(_LXC_RAW_PREFIXES)


# The container keys Proxmox knows, with a checker per type. Indexed keys have their range.
_ARCHES = {"amd64", "i386", "arm64", "armhf", "riscv32", "riscv64"}
_OSTYPES = {
    "debian",
    "devuan",
    "ubuntu",
    "centos",
    "fedora",
    "opensuse",
    "archlinux",
    "alpine",
    "gentoo",
    "nixos",
    "unmanaged",
}
_CMODES = {"shell", "console", "tty"}
_LOCKS = {
    "backup",
    "create",
    "destroyed",
    "disk",
    "fstrim",
    "migrate",
    "mounted",
    "rollback",
    "snapshot",
    "snapshot-delete",
}


def _dev_check(v: str) -> str | None:
    try:
        parse_dev_value(v)
    except PveFormatError as e:
        return str(e)
    return None


_LXC_SCALAR_KEYS = {
    "arch": enum_check(_ARCHES),
    "cores": int_check(1, 8192),
    "cpulimit": number_check(0, 8192),
    "cpuunits": int_check(0, 500000),
    "memory": int_check(16),
    "swap": int_check(0),
    "hostname": lambda v: (
        None
        if re.match(r"^[a-zA-Z0-9]([a-zA-Z0-9.-]*[a-zA-Z0-9])?$", v)
        else "invalid format - value does not look like a valid DNS name"
    ),
    "ostype": enum_check(_OSTYPES),
    "rootfs": string_check,
    "features": string_check,
    "unprivileged": bool_check,
    "onboot": bool_check,
    "startup": string_check,
    "tags": string_check,
    "lock": enum_check(_LOCKS),
    "nameserver": string_check,
    "searchdomain": string_check,
    "cmode": enum_check(_CMODES),
    "console": bool_check,
    "tty": int_check(0, 6),
    "protection": bool_check,
    "template": bool_check,
    "timezone": string_check,
    "hookscript": string_check,
    "entrypoint": string_check,
    "env": string_check,
    "debug": bool_check,
    "parent": string_check,
    "snaptime": int_check(0),
    "vmstatestorage": string_check,
}
_LXC_INDEXED_KEYS = {
    "mp": (256, string_check),
    "net": (32, string_check),
    "dev": (256, _dev_check),
    "unused": (256, string_check),
}


def _check_lxc_key(key: str, value: str) -> str | None:
    """Why ``key: value`` is not accepted, or None."""
    check = _LXC_SCALAR_KEYS.get(key)
    if check is None:
        m = re.match(r"^([a-z]+)(\d+)$", key)
        if m and m.group(1) in _LXC_INDEXED_KEYS and str(int(m.group(2))) == m.group(2):
            limit, check = _LXC_INDEXED_KEYS[m.group(1)]
            if int(m.group(2)) >= limit:
                return f"unknown setting '{key}' ({m.group(1)}N takes N = 0..{limit - 1})"
        else:
            return f"unknown setting '{key}'"
    return check(value)


_LXC_RAW_FORBIDDEN = ("lxc.rootfs", "lxc.idmap.", "lxc.uts.name")


def validate_lxc_conf(text: str, *, allow_description: bool = True) -> list[str]:
    """Check a container config against pve-container's parser rules.

    Returns one line per problem (``line N: ...``); empty when Proxmox parses the file
    without a warning and would write it back with the same meaning. ``#`` lines are the
    container's notes to Proxmox, so they are accepted only at the top of a section (where
    Proxmox's writer puts them), and not at all with ``allow_description=False``.
    Raises nothing.
    """
    problems: list[str] = []
    in_pending = False
    seen_key = False
    seen_sections: set[str] = set()
    for n, line in enumerate(text.split("\n"), 1):
        if re.match(r"^\s*$", line):
            continue
        if PENDING_RE.match(line) or SNAP_RE.match(line):
            name = line.strip()[1:-1]
            if name in seen_sections:
                problems.append(f"line {n}: duplicate section [{name}]")
            seen_sections.add(name)
            in_pending = bool(PENDING_RE.match(line))
            seen_key = False
            continue
        if line.startswith("["):
            problems.append(f"line {n}: invalid section header {line!r}")
            continue
        if line.startswith("#"):
            if not allow_description:
                problems.append(
                    f"line {n}: '#' line becomes the container's description; Proxmox keeps no comments"
                )
            elif seen_key:
                problems.append(
                    f"line {n}: '#' line after settings is not a comment: Proxmox moves it into the description at the top"
                )
            continue
        seen_key = True
        why = _setting_problem(line, in_pending)
        if why:
            problems.append(f"line {n}: {why}")
    return problems


def _setting_problem(line: str, in_pending: bool) -> str | None:
    """Why Proxmox would not take the setting ``line`` (a raw ``lxc.*`` line, ``description:`` or
    ``key: value``) as written, or None. ``in_pending``: the line is in ``[pve:pending]``."""
    m = LXC_RAW_RE.match(line)
    if m:
        key = m.group(1)
        if any(key == f or key.startswith(f) for f in _LXC_RAW_FORBIDDEN):
            return f"{key}: lxc.* key not allowed (Proxmox sets it itself)"
        if key.startswith("lxc.cgroup."):
            # cgroup v1 keys do nothing on a cgroup v2 host (PVE >= 7) and warn on PVE 9
            return f"{key}: cgroup v1 key is deprecated; use lxc.cgroup2.*"
        return None
    if DESCR_KEY_RE.match(line):
        return None
    m = LXC_KEY_RE.match(line)
    if line.startswith("lxc") or not m:
        return f"unable to parse config: {line}"
    key, value = m.group(1), m.group(2)
    if key == "delete":
        return None if in_pending else "property 'delete' is only allowed in [pve:pending]"
    why = _check_lxc_key(key, value)
    return f"unable to parse value of '{key}' - {why}" if why else None


def check_lxc_option(key: str, value: str) -> str | None:
    """Why Proxmox would refuse ``key: value`` in a container config (one line), or None.

    Covers the key names (``unknown setting``), the ``devN``/``mpN``/``netN`` index ranges and
    the typed keys; ``lxc.*`` and ``description`` are not handled here.
    """
    return _check_lxc_key(key, value)
