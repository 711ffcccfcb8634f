"""Container configs ``/etc/pve/lxc/<vmid>.conf`` and their ``devN`` values. Pure, no I/O.

pve-container's ``parse_pct_config`` / ``write_pct_config``: :func:`parse_lxc_conf`,
:func:`write_lxc_conf`, :func:`validate_lxc_conf`, :func:`check_lxc_option`, and the ``devN``
property string (:func:`parse_dev_value`, :func:`format_dev_value`).

The writer produces byte-for-byte what Proxmox's writer produces for the same data, so a file
gputopo writes does not change when Proxmox next rewrites it. The validator encodes the parser
rules of Proxmox (see docs: proxmox.md); it returns one line per problem, empty when Proxmox
would accept the text without a warning.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gputopo.errors import PveFormatError
from gputopo.formats.propstring import (
    BOOL01,
    bool_check,
    decode_text,
    encode_text,
    enum_check,
    int_check,
    number_check,
    split_property_string,
    string_check,
)

# --- devN ---------------------------------------------------------------------------

_DEV_KEYS = ("path", "deny-write", "gid", "mode", "uid")
_MODE_RE = re.compile(r"^0[0-7]{3}$")
_UINT_RE = re.compile(r"^\d+$")


def _check_dev_path(path: str) -> str | None:
    """Why ``path`` is not a valid ``pve-lxc-dev-string``, or None when it is."""
    if not path.startswith("/dev/"):
        return f"{path!r} is not a valid device path (must start with /dev/)"
    if re.search(r"/\.\.?/", path) or re.search(r"/\.\.?$", path):
        return f"{path!r} is not a valid device path (no /./ or /../)"
    return None


def parse_dev_value(text: str) -> dict:
    """Parse a ``devN`` value like ``/dev/nvidia0,gid=44,mode=0666``.

    Returns a dict with ``path`` (str) and, when given, ``uid``/``gid`` (int), ``mode`` (str,
    ``0NNN``) and ``deny-write`` (bool). ``path=`` may be spelled out or left implicit.
    Raises PveFormatError for an unknown key, a bad value or a missing path.
    """
    out: dict = {}
    for key, value in split_property_string(text, "dev"):
        if key is None:
            key = "path"
        if key not in _DEV_KEYS:
            raise PveFormatError(f"dev {key}", "property is not defined in schema")
        if key in out:
            raise PveFormatError(f"dev {key}", "duplicate key in comma-separated list property")
        if key == "path":
            why = _check_dev_path(value)
            if why:
                raise PveFormatError("dev path", why)
            out[key] = value
        elif key == "mode":
            if not _MODE_RE.match(value):
                raise PveFormatError(
                    "dev mode", f"value {value!r} does not match the regex pattern 0[0-7]{{3}}"
                )
            out[key] = value
        elif key in ("uid", "gid"):
            if not _UINT_RE.match(value):
                raise PveFormatError(f"dev {key}", f"type check ('integer') failed - got {value!r}")
            out[key] = int(value)
        else:
            if value not in BOOL01:
                raise PveFormatError("dev deny-write", f"type check ('boolean') failed - got {value!r}")
            out[key] = value == "1"
    if "path" not in out:
        raise PveFormatError("dev", f"no device path in {text!r}")
    return out


def format_dev_value(path: str, **opts) -> str:
    """Format a ``devN`` value in Proxmox's canonical order: the path, then the keys sorted.

    Keyword names may use ``_`` for ``-`` (``deny_write=True``); booleans become 0/1, None
    values are left out. Raises PveFormatError for an invalid path, key or value (the result
    always parses back with :func:`parse_dev_value`).
    """
    why = _check_dev_path(path)
    if why:
        raise PveFormatError("dev path", why)
    parts = [path]
    for key in sorted(k.replace("_", "-") for k in opts):
        value = opts.get(key, opts.get(key.replace("-", "_")))
        if value is None:
            continue
        if key not in _DEV_KEYS or key == "path":
            raise PveFormatError(f"dev {key}", "property is not defined in schema")
        if isinstance(value, bool):
            value = int(value)
        parts.append(f"{key}={value}")
    text = ",".join(parts)
    parse_dev_value(text)
    return text


# --- config files -------------------------------------------------------------------


@dataclass
class LxcSection:
    """One section of a container config: the main one, ``[pve:pending]`` or a snapshot.

    ``options`` keeps the keys in file order (a duplicated key: the last value, first place);
    ``lxc`` the raw ``lxc.*`` lines in order; ``description`` the decoded ``#`` lines and
    ``description:`` values exactly as Proxmox joins them (each ``#`` line ends in ``\\n``).
    """

    options: dict[str, str] = field(default_factory=dict)
    lxc: list[tuple[str, str]] = field(default_factory=list)
    description: str | None = None

    def is_empty(self) -> bool:
        return not self.options and not self.lxc and not self.description


@dataclass
class LxcConf(LxcSection):
    """A parsed container config: the main section plus ``pending`` and ``snapshots``."""

    pending: LxcSection = field(default_factory=LxcSection)
    snapshots: dict[str, LxcSection] = field(default_factory=dict)

    @property
    def pending_delete(self) -> list[str]:
        """Keys queued for deletion in ``[pve:pending]`` (a leading ``!`` = forced is dropped)."""
        raw = self.pending.options.get("delete", "")
        return [k.lstrip("!") for k in re.split(r"[,;\s]+", raw) if k]


_LXC_RAW_RE = re.compile(r"^(lxc\.[a-z0-9_.-]+)(:|\s*=)\s*(.*?)\s*$")
_LXC_KEY_RE = re.compile(r"^([a-z][a-z_]*\d*):\s*(.+?)\s*$")
_PENDING_RE = re.compile(r"^\[pve:pending\]\s*$", re.IGNORECASE)
_SNAP_RE = re.compile(r"^\[([a-z][a-z0-9_-]+)\]\s*$", re.IGNORECASE)
_DESCR_KEY_RE = re.compile(r"^description:\s*(.*\S)\s*$")


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
# the typed keys ``check_type`` converts while parsing: a boolean to 1/0, an integer to int()
_LXC_BOOLEAN_KEYS = frozenset(("onboot", "template", "console", "protection", "unprivileged", "debug"))
_LXC_INTEGER_KEYS = frozenset(("tty", "cores", "cpuunits", "memory", "swap", "snaptime"))


def lxc_raw_key_kept(key: str) -> bool:
    """Whether pve-container's parser keeps the raw ``lxc.*`` line ``key`` (it drops the rest
    with a warning: ``lxc.rootfs.path``, ``lxc.rootfs.options``, unknown keys)."""
    return key in _LXC_RAW_VALID or key in _LXC_RAW_DEPRECATED or key.startswith(_LXC_RAW_PREFIXES)


def _typed_value(key: str, value: str) -> str:
    """``check_type``'s conversion of a boolean or integer key's value; others unchanged (a
    value that fails the check is kept as written, as the non-strict parser keeps it)."""
    if key in _LXC_BOOLEAN_KEYS:
        if value == "1" or re.fullmatch(r"on|yes|true", value, re.IGNORECASE):
            return "1"
        if value == "0" or re.fullmatch(r"off|no|false", value, re.IGNORECASE):
            return "0"
    elif key in _LXC_INTEGER_KEYS and re.fullmatch(r"\d+", value):
        return str(int(value))
    return value


def parse_lxc_conf(text: str) -> LxcConf:
    """Parse a container config the way pve-container's ``parse_pct_config`` does.

    Lenient like Proxmox: lines it cannot parse are skipped (use :func:`validate_lxc_conf` to
    see them), and so are ``lxc.*`` keys Proxmox refuses (:func:`lxc_raw_key_kept`); as Proxmox
    does, ``lxc.environment.runtime`` lines become ``env`` (NUL-separated), boolean and integer
    keys are converted (``yes`` -> ``1``, ``08`` -> ``8``) and the main section's ``snapstate``
    is dropped. Returns the :class:`LxcConf`; raises nothing for any text.
    """
    conf = LxcConf()
    section: LxcSection = conf
    descr = ""

    def close(sec: LxcSection, d: str) -> None:
        if d:
            sec.description = d

    for line in text.split("\n"):
        if re.match(r"^\s*$", line):
            continue
        if _PENDING_RE.match(line):
            close(section, descr)
            descr = ""
            section = conf.pending = LxcSection()
            continue
        m = _SNAP_RE.match(line)
        if m:
            close(section, descr)
            descr = ""
            section = conf.snapshots[m.group(1)] = LxcSection()
            continue
        if line.startswith("#"):
            descr += decode_text(line[1:]) + "\n"
            continue
        m = _LXC_RAW_RE.match(line)
        if m:
            key, value = m.group(1), m.group(3)
            if key == "lxc.environment.runtime":
                # parse_pct_config gathers these into ``env``, NUL-separated
                env = section.options.get("env")
                section.options["env"] = value if env is None else f"{env}\0{value}"
            elif lxc_raw_key_kept(key):
                section.lxc.append((key, value))
            continue
        m = _DESCR_KEY_RE.match(line)
        if m:
            descr += decode_text(m.group(1))
            continue
        m = re.search(r"snapstate:\s*(prepare|delete)\s*$", line)
        if m:
            section.options["snapstate"] = m.group(1)
            continue
        m = _LXC_KEY_RE.match(line)
        if m:
            key = m.group(1)
            if key == "delete" and section is not conf.pending:
                continue  # Proxmox warns and drops it outside [pve:pending]
            section.options[key] = _typed_value(key, m.group(2))
    close(section, descr)
    conf.options.pop("snapstate", None)  # parse_pct_config: delete $res->{snapstate}
    return conf


def _write_section(sec: LxcSection) -> str:
    # Perl's split drops trailing empty fields: "a\n" gives one line, not two
    descr_lines = (sec.description or "").split("\n")
    while descr_lines and descr_lines[-1] == "":
        descr_lines.pop()
    out = ["#" + encode_text(cl) + "\n" for cl in descr_lines]
    for key in sorted(sec.options):
        if key in ("digest", "description", "pending", "snapshots", "snapname", "env", "lxc"):
            continue
        value = sec.options[key]
        if "\n" in str(value):
            raise PveFormatError(key, "detected invalid newline inside property")
        out.append(f"{key}: {value}\n")
    # write_pct_config: ``env`` as lxc.environment.runtime lines, before the other lxc.* lines
    env = re.split("\0+", sec.options.get("env") or "")
    while env and env[-1] == "":
        env.pop()  # Perl's split drops trailing empty fields
    out += [f"lxc.environment.runtime: {v}\n" for v in env]
    for k, v in sec.lxc:
        if k != "lxc.environment.runtime":
            out.append(f"{k}: {v}\n")
    return "".join(out)


def write_lxc_conf(conf: LxcConf) -> str:
    """The text pve-container's ``write_pct_config`` writes for ``conf``.

    Description first as ``#`` lines, then the keys sorted, then ``env`` as
    ``lxc.environment.runtime`` lines, then the raw ``lxc.*`` lines in order; ``[pve:pending]``
    when it holds anything; snapshots sorted by name.
    Raises PveFormatError when a value contains a newline.
    """
    raw = _write_section(conf)
    if not conf.pending.is_empty():
        raw += "\n[pve:pending]\n" + _write_section(conf.pending)
    for name in sorted(conf.snapshots):
        raw += f"\n[{name}]\n" + _write_section(conf.snapshots[name])
    return raw


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
        if _PENDING_RE.match(line) or _SNAP_RE.match(line):
            name = line.strip()[1:-1]
            if name in seen_sections:
                problems.append(f"line {n}: duplicate section [{name}]")
            seen_sections.add(name)
            in_pending = bool(_PENDING_RE.match(line))
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
        m = _LXC_RAW_RE.match(line)
        if m:
            key = m.group(1)
            if any(key == f or key.startswith(f) for f in _LXC_RAW_FORBIDDEN):
                problems.append(f"line {n}: {key}: lxc.* key not allowed (Proxmox sets it itself)")
            elif key.startswith("lxc.cgroup."):
                # cgroup v1 keys do nothing on a cgroup v2 host (PVE >= 7) and warn on PVE 9
                problems.append(f"line {n}: {key}: cgroup v1 key is deprecated; use lxc.cgroup2.*")
            continue
        if line.startswith("lxc"):
            problems.append(f"line {n}: unable to parse config: {line}")
            continue
        if _DESCR_KEY_RE.match(line):
            continue
        m = _LXC_KEY_RE.match(line)
        if not m:
            problems.append(f"line {n}: unable to parse config: {line}")
            continue
        key, value = m.group(1), m.group(2)
        if key == "delete":
            if not in_pending:
                problems.append(f"line {n}: property 'delete' is only allowed in [pve:pending]")
            continue
        why = _check_lxc_key(key, value)
        if why:
            problems.append(f"line {n}: unable to parse value of '{key}' - {why}")
    return problems


def check_lxc_option(key: str, value: str) -> str | None:
    """Why Proxmox would refuse ``key: value`` in a container config (one line), or None.

    Covers the key names (``unknown setting``), the ``devN``/``mpN``/``netN`` index ranges and
    the typed keys; ``lxc.*`` and ``description`` are not handled here.
    """
    return _check_lxc_key(key, value)
