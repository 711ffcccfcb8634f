"""Proxmox VE file and property-string formats: parsers, writers and validators. Pure, no I/O.

Covers what gputopo reads and writes on a Proxmox node:

* container configs ``/etc/pve/lxc/<vmid>.conf`` (pve-container ``parse_pct_config`` /
  ``write_pct_config``): :func:`parse_lxc_conf`, :func:`write_lxc_conf`,
  :func:`validate_lxc_conf`, and the ``devN`` property string (:func:`parse_dev_value`,
  :func:`format_dev_value`);
* PCI resource mappings ``/etc/pve/mapping/pci.cfg`` (pve-common ``SectionConfig`` with the
  mapping plugin's bare-id header): :func:`parse_pci_cfg`, :func:`write_pci_cfg`,
  :func:`validate_pci_cfg`, and the ``map`` property string (:func:`parse_map_entry`,
  :func:`format_map_entry`).

The writers produce byte-for-byte what Proxmox's own writers produce for the same data, so a
file gputopo writes does not change when Proxmox next rewrites it. The validators encode the
parser rules of Proxmox (see docs: proxmox.md); they return one line per problem, empty when
Proxmox would accept the text without a warning.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from urllib.parse import quote, unquote

from gputopo.errors import PveFormatError


def sha1_digest(text: str) -> str:
    """The ``digest`` Proxmox reports for a config file: SHA-1 hex of its raw bytes."""
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


# --- shared property-string helpers ------------------------------------------------------

_CONFIGID_RE = re.compile(r"^[a-z][a-z0-9_-]+$", re.IGNORECASE)
_NODE_RE = re.compile(r"^[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?$")
_BOOL01 = {"0", "1"}


def _split_property_string(text: str, what: str) -> list[tuple[str | None, str]]:
    """Split ``a=b,c=d,plain`` into ``[(key, value)]``; a part without ``=`` has key None.

    Raises PveFormatError on an empty part (``a=1,,b=2``) or an empty key.
    """
    parts: list[tuple[str | None, str]] = []
    for part in text.split(","):
        if part == "":
            raise PveFormatError(what, f"empty element in {text!r}")
        if "=" in part:
            k, v = part.split("=", 1)
            if not k:
                raise PveFormatError(what, f"empty key in {text!r}")
            parts.append((k, v))
        else:
            parts.append((None, part))
    return parts


# --- LXC: devN ---------------------------------------------------------------------------

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
    for key, value in _split_property_string(text, "dev"):
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
                raise PveFormatError("dev mode", f"value {value!r} does not match the regex pattern 0[0-7]{{3}}")
            out[key] = value
        elif key in ("uid", "gid"):
            if not _UINT_RE.match(value):
                raise PveFormatError(f"dev {key}", f"type check ('integer') failed - got {value!r}")
            out[key] = int(value)
        else:
            if value not in _BOOL01:
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


# --- LXC: config files -------------------------------------------------------------------


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


# uri_escape's unsafe set in Proxmox is "^\x20-\x39\x3b-\x7e": printable ASCII but ':' is safe
_TEXT_SAFE = "".join(chr(c) for c in range(0x20, 0x7F) if c != 0x3A)


def decode_text(text: str) -> str:
    """Proxmox's ``decode_text``: URI-unescape (``%3A`` -> ``:``), UTF-8."""
    return unquote(text, encoding="utf-8", errors="replace")


def encode_text(text: str) -> str:
    """Proxmox's ``encode_text``: escape control, non-ASCII and ``:`` characters as ``%XX``."""
    return quote(text, safe=_TEXT_SAFE, encoding="utf-8")


def parse_lxc_conf(text: str) -> LxcConf:
    """Parse a container config the way pve-container's ``parse_pct_config`` does.

    Lenient like Proxmox: lines it cannot parse are skipped (use :func:`validate_lxc_conf` to
    see them). Returns the :class:`LxcConf`; raises nothing for any text.
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
            section.lxc.append((m.group(1), m.group(3)))
            continue
        m = _DESCR_KEY_RE.match(line)
        if m:
            descr += decode_text(m.group(1))
            continue
        m = _LXC_KEY_RE.match(line)
        if m:
            key = m.group(1)
            if key == "delete" and section is not conf.pending:
                continue  # Proxmox warns and drops it outside [pve:pending]
            section.options[key] = m.group(2)
    close(section, descr)
    return conf


def _write_section(sec: LxcSection) -> str:
    # Perl's split drops trailing empty fields: "a\n" gives one line, not two
    descr_lines = (sec.description or "").split("\n")
    while descr_lines and descr_lines[-1] == "":
        descr_lines.pop()
    out = ["#" + encode_text(cl) + "\n" for cl in descr_lines]
    for key in sorted(sec.options):
        if key in ("digest", "description", "pending", "snapshots", "snapname", "lxc"):
            continue
        value = sec.options[key]
        if "\n" in str(value):
            raise PveFormatError(key, "detected invalid newline inside property")
        out.append(f"{key}: {value}\n")
    for k, v in sec.lxc:
        out.append(f"{k}: {v}\n")
    return "".join(out)


def write_lxc_conf(conf: LxcConf) -> str:
    """The text pve-container's ``write_pct_config`` writes for ``conf``.

    Description first as ``#`` lines, then the keys sorted, then the raw ``lxc.*`` lines in
    order; ``[pve:pending]`` when it holds anything; snapshots sorted by name.
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
    "debian", "devuan", "ubuntu", "centos", "fedora", "opensuse", "archlinux", "alpine",
    "gentoo", "nixos", "unmanaged",
}
_CMODES = {"shell", "console", "tty"}
_LOCKS = {"backup", "create", "destroyed", "disk", "fstrim", "migrate", "mounted", "rollback", "snapshot", "snapshot-delete"}


_INT_RE = re.compile(r"^[+-]?\d+$")
_NUMBER_RE = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)$")


def _range_check(kind: str, pattern: re.Pattern, lo: float | None, hi: float | None):
    """A checker for JSONSchema's ``integer``/``number`` with optional bounds, worded like Proxmox."""

    def check(v: str) -> str | None:
        if not pattern.match(v):
            return f"type check ('{kind}') failed - got {v!r}"
        n = float(v)
        if lo is not None and n < lo:
            return f"value must have a minimum value of {lo:g}"
        if hi is not None and n > hi:
            return f"value must have a maximum value of {hi:g}"
        return None

    return check


def _int_check(lo: int | None = None, hi: int | None = None):
    return _range_check("integer", _INT_RE, lo, hi)


def _number_check(lo: float | None = None, hi: float | None = None):
    return _range_check("number", _NUMBER_RE, lo, hi)


def _bool_check(v: str) -> str | None:
    # the config parser goes through JSONSchema::parse_boolean
    if v.lower() in ("0", "1", "yes", "no", "on", "off", "true", "false"):
        return None
    return f"type check ('boolean') failed - got {v!r}"


def _enum_check(values: set[str]):
    def check(v: str) -> str | None:
        if v in values:
            return None
        return f"value {v!r} does not have a value in the enumeration {', '.join(sorted(values))!r}"

    return check


def _string_check(v: str) -> str | None:
    return None


def _dev_check(v: str) -> str | None:
    try:
        parse_dev_value(v)
    except PveFormatError as e:
        return str(e)
    return None


_LXC_SCALAR_KEYS = {
    "arch": _enum_check(_ARCHES),
    "cores": _int_check(1, 8192),
    "cpulimit": _number_check(0, 8192),
    "cpuunits": _int_check(0, 500000),
    "memory": _int_check(16),
    "swap": _int_check(0),
    "hostname": lambda v: None if re.match(r"^[a-zA-Z0-9]([a-zA-Z0-9.-]*[a-zA-Z0-9])?$", v) else "invalid format - value does not look like a valid DNS name",
    "ostype": _enum_check(_OSTYPES),
    "rootfs": _string_check,
    "features": _string_check,
    "unprivileged": _bool_check,
    "onboot": _bool_check,
    "startup": _string_check,
    "tags": _string_check,
    "lock": _enum_check(_LOCKS),
    "nameserver": _string_check,
    "searchdomain": _string_check,
    "cmode": _enum_check(_CMODES),
    "console": _bool_check,
    "tty": _int_check(0, 6),
    "protection": _bool_check,
    "template": _bool_check,
    "timezone": _string_check,
    "hookscript": _string_check,
    "entrypoint": _string_check,
    "env": _string_check,
    "debug": _bool_check,
    "parent": _string_check,
    "snaptime": _int_check(0),
    "vmstatestorage": _string_check,
}
_LXC_INDEXED_KEYS = {"mp": (256, _string_check), "net": (32, _string_check), "dev": (256, _dev_check), "unused": (256, _string_check)}


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
                problems.append(f"line {n}: '#' line becomes the container's description; Proxmox keeps no comments")
            elif seen_key:
                problems.append(f"line {n}: '#' line after settings is not a comment: Proxmox moves it into the description at the top")
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


# --- PCI mappings ------------------------------------------------------------------------

_MAP_KEYS = ("id", "iommugroup", "node", "path", "subsystem-id", "description")
_MAP_REQUIRED = ("id", "node", "path")
_HEXID_RE = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{4}$")
_PCIPATH_RE = re.compile(r"^[0-9a-f]{4,}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7](?:;[0-9a-f]{4,}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7])*$")
_PCI_SECTION_KEYS = ("map", "description", "mdev", "live-migration-capable")


@dataclass
class MapEntry:
    """One ``map`` property string of a PCI mapping: one alternative device on one node.

    ``path`` may join several functions with ``;`` (passed through together).
    """

    id: str
    node: str
    path: str
    iommugroup: int | None = None
    subsystem_id: str | None = None
    description: str | None = None

    @property
    def paths(self) -> list[str]:
        return self.path.split(";")


@dataclass
class PciMapping:
    """One section of ``mapping/pci.cfg``. ``maps`` holds the raw ``map`` strings in order;
    ``extra`` any other property the file had (kept so a rewrite does not lose it)."""

    id: str
    maps: list[str] = field(default_factory=list)
    description: str | None = None
    mdev: bool | None = None
    live_migration_capable: bool | None = None
    extra: dict[str, str] = field(default_factory=dict)

    def entries(self) -> list[MapEntry]:
        """The ``maps`` parsed; raises PveFormatError naming the bad one."""
        return [parse_map_entry(m) for m in self.maps]


def _map_value_problem(key: str, value: str) -> str | None:
    if key in ("id", "subsystem-id"):
        if not _HEXID_RE.match(value):
            return f"{key}: value {value!r} is not vvvv:dddd in lowercase hex without 0x"
    elif key == "node":
        if not _NODE_RE.match(value):
            return f"node: invalid format - value {value!r} does not look like a valid node name"
    elif key == "path":
        if not _PCIPATH_RE.match(value):
            return f"path: value {value!r} is not dddd:bb:dd.f[;dddd:bb:dd.f...] in lowercase with the domain"
    elif key == "iommugroup":
        if not re.match(r"^\d+$", value):
            return f"iommugroup: type check ('integer') failed - got {value!r}"
    elif key == "description":
        if len(value) > 4096:
            return "description: value may only be 4096 characters long"
    return None


def map_entry_problems(text: str) -> list[str]:
    """Every reason ``text`` is not a valid ``map`` property string (empty when it is)."""
    try:
        parts = _split_property_string(text, "map")
    except PveFormatError as e:
        return [e.reason]
    problems = []
    seen = set()
    for key, value in parts:
        if key is None:
            problems.append(f"value without a key: {value!r}")
            continue
        if key not in _MAP_KEYS:
            problems.append(f"{key}: property is not defined in schema")
            continue
        if key in seen:
            problems.append(f"{key}: duplicate key in comma-separated list property")
        seen.add(key)
        why = _map_value_problem(key, value)
        if why:
            problems.append(why)
    for key in _MAP_REQUIRED:
        if key not in seen:
            problems.append(f"{key}: property is missing and it is not optional")
    return problems


def parse_map_entry(text: str) -> MapEntry:
    """Parse ``id=10de:2bb5,iommugroup=40,node=pve1,path=0000:81:00.0,subsystem-id=10de:204e``.

    Returns the :class:`MapEntry`. Raises PveFormatError naming the first problem.
    """
    problems = map_entry_problems(text)
    if problems:
        raise PveFormatError(f"map {text!r}", problems[0])
    kv = dict(_split_property_string(text, "map"))
    return MapEntry(
        id=kv["id"],
        node=kv["node"],
        path=kv["path"],
        iommugroup=int(kv["iommugroup"]) if "iommugroup" in kv else None,
        subsystem_id=kv.get("subsystem-id"),
        description=kv.get("description"),
    )


def format_map_entry(entry: MapEntry) -> str:
    """Format ``entry`` as a ``map`` string: id, iommugroup, node, path, subsystem-id,
    description (unset ones left out). Raises PveFormatError when a value is invalid or a
    description holds ``,`` (it would split the property string)."""
    values = {
        "id": entry.id,
        "iommugroup": None if entry.iommugroup is None else str(entry.iommugroup),
        "node": entry.node,
        "path": entry.path,
        "subsystem-id": entry.subsystem_id,
        "description": entry.description,
    }
    parts = []
    for key in _MAP_KEYS:
        v = values[key]
        if v is None:
            continue
        if "," in v or "=" in v and key != "description":
            raise PveFormatError(f"map {key}", f"value {v!r} would break the property string")
        parts.append(f"{key}={v}")
    text = ",".join(parts)
    problems = map_entry_problems(text)
    if problems:
        raise PveFormatError(f"map {text!r}", problems[0])
    return text


_PROP_LINE_RE = re.compile(r"^\s+(\S+)(\s+(.*\S))?\s*$")


def parse_pci_cfg(text: str) -> list[PciMapping]:
    """Parse ``mapping/pci.cfg`` the way pve-common's SectionConfig does for mappings.

    ``#`` lines are skipped anywhere; a blank line ends a section; lines Proxmox would ignore
    are ignored. Returns the mappings in file order (a duplicated id: the last one wins).
    Raises nothing for any text.
    """
    result: dict[str, PciMapping] = {}
    lines = [ln for ln in text.split("\n") if not re.match(r"^\s*#", ln)]
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if re.match(r"^\s*$", line):
            continue
        m = re.match(r"^(\S+)\s*$", line)
        if not m:
            continue
        mp = PciMapping(id=m.group(1))
        while i < len(lines) and not re.match(r"^\s*$", lines[i]):
            pm = _PROP_LINE_RE.match(lines[i].rstrip())
            i += 1
            if not pm:
                continue
            key, value = pm.group(1), pm.group(3) or ""
            if key == "map":
                mp.maps.append(value)
            elif key == "description":
                mp.description = value
            elif key == "mdev":
                mp.mdev = value == "1"
            elif key == "live-migration-capable":
                mp.live_migration_capable = value == "1"
            else:
                mp.extra[key] = value
        if _CONFIGID_RE.match(mp.id):
            result.pop(mp.id, None)
            result[mp.id] = mp
    return list(result.values())


def write_pci_cfg(mappings: list[PciMapping]) -> str:
    """The text Proxmox writes for ``mappings``: a bare id line, tab-indented ``map`` lines
    first, then the other keys sorted, a blank line between sections.

    Raises PveFormatError for an invalid id, a mapping without ``map`` or a newline in a value.
    """
    out = []
    for mp in mappings:
        if not _CONFIGID_RE.match(mp.id):
            raise PveFormatError(f"mapping {mp.id!r}", "invalid configuration ID")
        if not mp.maps:
            raise PveFormatError(f"mapping {mp.id}", "missing value for required option 'map'")
        props: dict[str, str] = dict(mp.extra)
        if mp.description is not None:
            props["description"] = mp.description
        if mp.mdev is not None:
            props["mdev"] = "1" if mp.mdev else "0"
        if mp.live_migration_capable is not None:
            props["live-migration-capable"] = "1" if mp.live_migration_capable else "0"
        lines = [mp.id]
        lines += [f"\tmap {m}" for m in mp.maps]
        lines += [f"\t{k} {props[k]}" for k in sorted(props)]
        for ln in lines:
            if "\n" in ln:
                raise PveFormatError(f"mapping {mp.id}", "value contains a newline")
        out.append("\n".join(lines) + "\n")
    return "\n".join(out)


def validate_pci_cfg(text: str) -> list[str]:
    """Check ``mapping/pci.cfg`` text against Proxmox's parser and mapping schema.

    Returns one line per problem (``line N: ...``), empty when Proxmox accepts every section
    as written and a rewrite would keep all of it. Raises nothing.
    """
    problems: list[str] = []
    lines = text.split("\n")
    ids: set[str] = set()
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        n = i
        if re.match(r"^\s*#", line):
            problems.append(f"line {n}: '#' line is dropped by Proxmox on the next write")
            continue
        if re.match(r"^\s*$", line):
            continue
        m = re.match(r"^(\S+)\s*$", line)
        if not m:
            if re.match(r"^[a-z]+:\s*\S+\s*$", line):
                problems.append(f"line {n}: section header is the bare id, not {line.strip()!r}")
            else:
                problems.append(f"line {n}: expected a section id on its own line, got {line!r}")
            # skip the rest of this bogus section, as Proxmox does
            while i < len(lines) and not re.match(r"^\s*$", lines[i]):
                i += 1
            continue
        sid = m.group(1)
        if not _CONFIGID_RE.match(sid):
            problems.append(f"line {n}: invalid configuration ID '{sid}'")
        if sid in ids:
            problems.append(f"line {n}: duplicate section id '{sid}'")
        ids.add(sid)
        seen: set[str] = set()
        while i < len(lines) and not re.match(r"^\s*$", lines[i]):
            pline = lines[i]
            i += 1
            pn = i
            if re.match(r"^\s*#", pline):
                problems.append(f"line {pn}: '#' line is dropped by Proxmox on the next write")
                continue
            if not pline.startswith("\t") or pline.startswith("\t "):
                if pline[:1] in (" ", "\t"):
                    problems.append(f"line {pn}: property line must be indented with one tab")
                else:
                    problems.append(f"line {pn}: ignored config line (no blank line before a new section?): {pline!r}")
                    continue
            pm = _PROP_LINE_RE.match(pline.rstrip())
            if not pm or pm.group(3) is None:
                problems.append(f"line {pn}: property line without a value: {pline.strip()!r}")
                continue
            key, value = pm.group(1), pm.group(3)
            if key not in _PCI_SECTION_KEYS:
                problems.append(f"line {pn}: {key}: property is not defined in schema")
                continue
            if key != "map" and key in seen:
                problems.append(f"line {pn}: {key}: duplicate attribute")
            seen.add(key)
            if key == "map":
                problems += [f"line {pn}: map: {p}" for p in map_entry_problems(value)]
            elif key in ("mdev", "live-migration-capable") and value not in _BOOL01:
                problems.append(f"line {pn}: {key}: type check ('boolean') failed - got {value!r} (write 0 or 1)")
            elif key == "description" and len(value) > 4096:
                problems.append(f"line {pn}: description: value may only be 4096 characters long")
        if "map" not in seen:
            problems.append(f"line {n}: section '{sid}': missing value for required option 'map'")
    return problems


def check_lxc_option(key: str, value: str) -> str | None:
    """Why Proxmox would refuse ``key: value`` in a container config (one line), or None.

    Covers the key names (``unknown setting``), the ``devN``/``mpN``/``netN`` index ranges and
    the typed keys; ``lxc.*`` and ``description`` are not handled here.
    """
    return _check_lxc_key(key, value)
