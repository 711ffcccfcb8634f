"""PCI resource mappings ``/etc/pve/mapping/pci.cfg`` and their ``map`` entries. Pure, no I/O.

pve-common's ``SectionConfig`` with the mapping plugin's bare-id header: :func:`parse_pci_cfg`,
:func:`write_pci_cfg`, :func:`validate_pci_cfg`, and the ``map`` property string
(:func:`parse_map_entry`, :func:`format_map_entry`, :func:`map_entry_problems`).

The writer produces byte-for-byte what Proxmox's writer produces for the same data. The
validator encodes the parser rules of Proxmox (see docs: proxmox.md); it returns one line per
problem, empty when Proxmox would accept the text without a warning.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gputopo.errors import PveFormatError
from gputopo.formats.propstring import BOOL01, CONFIGID_RE, NODE_RE, split_property_string

_MAP_KEYS = ("id", "iommugroup", "node", "path", "subsystem-id", "description")
_MAP_REQUIRED = ("id", "node", "path")
# pve-guest-common src/PVE/Mapping/PCI.pm ``$map_fmt``: ``id``/``subsystem-id`` take either case,
# a ``path`` may leave out the function ("the whole device is mapped") and its function digit is
# ``[a-f0-9]``; JSONSchema anchors a pattern at both ends
_HEXID_RE = re.compile(r"^[0-9A-Fa-f]{4}:[0-9A-Fa-f]{4}$")
_PCI_RE = r"[a-f0-9]{4,}:[a-f0-9]{2}:[a-f0-9]{2}(?:\.[a-f0-9])?"
_PCIPATH_RE = re.compile(rf"^(?:{_PCI_RE};)*{_PCI_RE}$")
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
            return f"{key}: value {value!r} is not vvvv:dddd in hex without 0x"
    elif key == "node":
        if not NODE_RE.match(value):
            return f"node: invalid format - value {value!r} does not look like a valid node name"
    elif key == "path":
        if not _PCIPATH_RE.match(value):
            return f"path: value {value!r} is not dddd:bb:dd[.f][;dddd:bb:dd[.f]...] in lowercase with the domain"
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
        parts = split_property_string(text, "map")
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
    kv = dict(split_property_string(text, "map"))
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
        if CONFIGID_RE.match(mp.id):
            result.pop(mp.id, None)
            result[mp.id] = mp
    return list(result.values())


def write_pci_cfg(mappings: list[PciMapping]) -> str:
    """The text Proxmox writes for ``mappings``: a bare id line, tab-indented ``map`` lines
    first, then the other keys sorted, a blank line after every section (the last one too).

    Raises PveFormatError for an invalid id, a mapping without ``map`` or a newline in a value.
    """
    out = []
    for mp in mappings:
        if not CONFIGID_RE.match(mp.id):
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
        # SectionConfig::write_config appends "$data\n" for every section, the last one too
        out.append("\n".join(lines) + "\n\n")
    return "".join(out)


def validate_pci_cfg(text: str) -> list[str]:
    """Check ``mapping/pci.cfg`` text against Proxmox's parser and mapping schema.

    Returns one line per problem (``line N: ...``), empty when Proxmox accepts every section
    as written and a rewrite would keep all of it. Raises nothing.
    """
    problems: list[str] = []
    lines = list(enumerate(text.split("\n"), 1))
    ids: set[str] = set()
    i = 0
    while i < len(lines):
        n, line = lines[i]
        i += 1
        if _is_comment(n, line, problems) or re.match(r"^\s*$", line):
            continue
        end = i
        while end < len(lines) and not re.match(r"^\s*$", lines[end][1]):
            end += 1
        body, i = lines[i:end], end
        m = re.match(r"^(\S+)\s*$", line)
        if m:
            problems += _section_problems(n, m.group(1), body, ids)
        elif re.match(r"^[a-z]+:\s*\S+\s*$", line):
            problems.append(f"line {n}: section header is the bare id, not {line.strip()!r}")
        else:
            # the rest of this bogus section is skipped, as Proxmox does
            problems.append(f"line {n}: expected a section id on its own line, got {line!r}")
    return problems


def _is_comment(n: int, line: str, problems: list[str]) -> bool:
    """Whether line ``n`` is a ``#`` line; one is recorded in ``problems`` (Proxmox's writer
    drops it)."""
    if re.match(r"^\s*#", line):
        problems.append(f"line {n}: '#' line is dropped by Proxmox on the next write")
        return True
    return False


def _section_problems(n: int, sid: str, body: list[tuple[int, str]], ids: set[str]) -> list[str]:
    """The problems of the section ``sid`` headed at line ``n`` with the numbered property
    lines ``body``; ``ids`` holds the ids seen so far and gets ``sid``."""
    problems: list[str] = []
    if not CONFIGID_RE.match(sid):
        problems.append(f"line {n}: invalid configuration ID '{sid}'")
    if sid in ids:
        problems.append(f"line {n}: duplicate section id '{sid}'")
    ids.add(sid)
    seen: set[str] = set()
    for pn, pline in body:
        if _is_comment(pn, pline, problems):
            continue
        if not pline.startswith("\t") or pline.startswith("\t "):
            if pline[:1] in (" ", "\t"):
                problems.append(f"line {pn}: property line must be indented with one tab")
            else:
                problems.append(
                    f"line {pn}: ignored config line (no blank line before a new section?): {pline!r}"
                )
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
        elif key in ("mdev", "live-migration-capable") and value not in BOOL01:
            problems.append(f"line {pn}: {key}: type check ('boolean') failed - got {value!r} (write 0 or 1)")
        elif key == "description" and len(value) > 4096:
            problems.append(f"line {pn}: description: value may only be 4096 characters long")
    if "map" not in seen:
        problems.append(f"line {n}: section '{sid}': missing value for required option 'map'")
    return problems
