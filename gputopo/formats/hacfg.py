"""The HA manager's section configs under ``/etc/pve/ha/``. Pure, no I/O.

``rules.cfg`` (PVE 9: ``node-affinity`` and ``resource-affinity`` rules), ``groups.cfg`` (PVE 8:
``group`` sections) and ``resources.cfg`` (``vm``/``ct`` sections) are pve-common
``SectionConfig`` files (pve-ha-manager src/PVE/HA/Rules.pm, Groups.pm, Resources.pm):

* a section starts with ``<type>: <id>`` and ends at a blank line; a property line is a tab,
  the key, and the value (a boolean may stand alone: ``\\tdisable``);
* the writer (``SectionConfig::write_config``) puts ``comment`` first (``%XX``-escaped in a rule
  only: Rules.pm has the only ``encode_value`` for it), then a bare ``disable``, then the type's
  required options sorted by name, then the optional ones sorted by name; booleans are
  ``0``/``1``; every section, the last one too, is followed by a blank line;
* a node-affinity rule's ``nodes`` is ``node[:priority]`` joined by ``,`` and sorted
  (``NodeAffinity.pm encode_plugin_value``), ``resources`` the sorted ``vm:<id>`` list.

:func:`parse_section_config` and :func:`write_section_config` read and write them;
:func:`node_list` / :func:`format_node_list` the node lists; :func:`ha_files` the files before
and after the changes of gputopo's HA placement (``gputopo-vm<vmid>`` rules or groups).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gputopo.formats.propstring import decode_text, encode_text
from gputopo.model.state import HaConfig

# the rules and groups gputopo places VMs with: gputopo-vm<vmid>
PREFIX = "gputopo-vm"
RULES_CFG = "pve/ha/rules.cfg"
GROUPS_CFG = "pve/ha/groups.cfg"
RESOURCES_CFG = "pve/ha/resources.cfg"

# type -> (required options, optional options), from each plugin's options()
OPTIONS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "node-affinity": (("nodes", "resources"), ("comment", "disable", "strict")),
    "resource-affinity": (("affinity", "resources"), ("comment", "disable")),
    "group": (("nodes",), ("comment", "nofailback", "restricted")),
    "vm": ((), ("comment", "failback", "group", "max_relocate", "max_restart", "state")),
    "ct": ((), ("comment", "failback", "group", "max_relocate", "max_restart", "state")),
}
# the rule types: only Rules.pm decodes and encodes ``comment`` (decode_text/encode_text);
# Groups.pm and Resources.pm keep it as written
RULES = {"node-affinity", "resource-affinity"}
BOOLEANS = {"disable", "strict", "restricted", "nofailback", "failback"}
_HEADER = re.compile(r"^(\S+):\s*(\S+)\s*$")
_PROP = re.compile(r"^\s+(\S+)(\s+(.*\S))?\s*$")


@dataclass
class Section:
    """One section: its ``type`` (``node-affinity``, ``group``, ``vm``...), ``id`` (the rule or
    group id, or the vmid of a resource) and its properties as written (comment decoded)."""

    type: str
    id: str
    props: dict[str, str] = field(default_factory=dict)

    @property
    def sid(self) -> str:
        """The HA resource id of a resource section (``vm:201``), else the id."""
        return f"{self.type}:{self.id}" if self.type in ("vm", "ct") else self.id


def parse_section_config(text: str) -> list[Section]:
    """The sections of an HA section config, in file order. ``#`` lines are skipped; a
    duplicated key keeps the first value (Proxmox warns and keeps it). Raises nothing."""
    out: list[Section] = []
    current: Section | None = None
    for line in text.split("\n"):
        if re.match(r"^\s*#", line):
            continue
        if not line.strip():
            current = None
            continue
        if current is None:
            m = _HEADER.match(line)
            if m:
                current = Section(type=m.group(1).lower(), id=m.group(2))
                out.append(current)
            continue
        pm = _PROP.match(line)
        if not pm:
            continue
        key, value = pm.group(1), pm.group(3)
        if value is None:
            value = "1" if key in BOOLEANS else ""
        if key in current.props:
            continue
        current.props[key] = decode_text(value) if key == "comment" and current.type in RULES else value
    return out


def write_section_config(sections: list[Section]) -> str:
    """The file Proxmox writes for ``sections`` (see the module docstring). Raises ValueError
    for an unknown type or a value holding a line break."""
    out = []
    for s in sections:
        if s.type not in OPTIONS:
            raise ValueError(f"unknown section type {s.type!r}")
        required, optional = OPTIONS[s.type]
        lines = [f"{s.type}: {s.id}"]
        props = dict(s.props)
        if s.type in RULES:
            # Rules.pm encode_value: the resources are a hash, written sorted and once each;
            # NodeAffinity.pm encode_plugin_value: the nodes sorted by name
            if props.get("resources"):
                props["resources"] = ",".join(sorted(set(resource_list(props["resources"]))))
            if s.type == "node-affinity" and props.get("nodes"):
                props["nodes"] = format_node_list(node_list(props["nodes"]))
        if props.get("comment"):
            comment = props["comment"]
            lines.append(f"\tcomment {encode_text(comment) if s.type in RULES else comment}")
        if props.get("disable") in ("1", "true"):
            lines.append("\tdisable")
        for key in sorted(required) + sorted(k for k in optional if k not in ("comment", "disable")):
            value = props.get(key)
            if value is None or value == "":
                if key in required:
                    raise ValueError(f"section '{s.id}' - missing value for required option '{key}'")
                continue
            if "\n" in value or "\r" in value:
                raise ValueError(f"property '{key}' contains a line feed")
            lines.append(f"\t{key} {value}")
        # SectionConfig::write_config appends "$data\n" for every section, the last one too
        out.append("\n".join(lines) + "\n\n")
    return "".join(out)


def node_list(value: str) -> dict[str, int]:
    """``pve1:2,pve2`` -> ``{"pve1": 2, "pve2": 0}`` (the priority defaults to 0)."""
    out: dict[str, int] = {}
    for part in re.split(r"[,;\s]+", value or ""):
        if not part:
            continue
        name, _, prio = part.partition(":")
        out[name] = int(prio) if prio.isdigit() else 0
    return out


def format_node_list(nodes: dict[str, int]) -> str:
    """The sorted ``node[:priority]`` list Proxmox writes (a priority of 0 is left out)."""
    return ",".join(f"{n}:{p}" if p else n for n, p in sorted(nodes.items()))


def vm_sid(vmid: int) -> str:
    """The HA resource id of VM ``vmid``: ``vm:201``."""
    return f"vm:{vmid}"


def sid_id(sid: str) -> str:
    """The vmid part of a resource id: ``vm:201`` -> ``201``."""
    return sid.split(":", 1)[1]


def resource_list(value: str) -> list[str]:
    """``vm:201,vm:202`` -> the sorted resource ids."""
    return sorted(p for p in re.split(r"[,;\s]+", value or "") if p)


class HaChangeLike(Protocol):
    """What :func:`ha_files` reads of a change (:class:`gputopo.actions.ha.HaChange`): its
    ``op`` (``create-rule``, ``set-group``...), the rule, group or resource ``id``, and the
    ``params`` it sends."""

    op: str
    id: str
    params: dict[str, Any]


def text_value(v: Any) -> str:
    """A property's value as the API lists it and the file holds it (booleans ``0``/``1``)."""
    return str(int(v)) if isinstance(v, bool) else str(v)


def _sections(items: list[dict[str, Any]], type_key: str, id_key: str) -> list[Section]:
    out = []
    for it in items:
        props = {
            k: text_value(v)
            for k, v in it.items()
            if k not in (type_key, id_key, "digest", "order", "errors", "sid") and v is not None
        }
        out.append(Section(type=str(it.get(type_key, "group")), id=str(it[id_key]), props=props))
    return out


def _copy(sections: list[Section]) -> dict[str, Section]:
    return {s.sid: Section(s.type, s.id, dict(s.props)) for s in sections}


def _rules_files(
    state: HaConfig, changes: Sequence[HaChangeLike]
) -> dict[str, tuple[str | None, str | None]]:
    before = _sections(state.rules, "type", "rule")
    after = _copy(before)
    for c in changes:
        if c.op == "delete-rule":
            after.pop(c.id, None)
        else:
            s = after.setdefault(c.id, Section(type="node-affinity", id=c.id))
            s.props.update({k: text_value(v) for k, v in c.params.items() if k != "type"})
    return {
        RULES_CFG: (write_section_config(before) or None, write_section_config(list(after.values())) or None)
    }


def _groups_files(
    state: HaConfig, changes: Sequence[HaChangeLike]
) -> dict[str, tuple[str | None, str | None]]:
    groups = _sections([dict(g, type="group") for g in state.groups], "type", "group")
    gafter = _copy(groups)
    res = [
        Section(
            type=r.get("type", "vm"),
            id=sid_id(sid),
            props={k: str(v) for k, v in r.items() if k not in ("sid", "type", "digest")},
        )
        for sid, r in state.resources.items()
    ]
    rafter = _copy(res)
    for c in changes:
        if c.op == "delete-group":
            gafter.pop(c.id, None)
        elif c.op in ("create-group", "update-group"):
            g = gafter.setdefault(c.id, Section(type="group", id=c.id))
            g.props.update({k: text_value(v) for k, v in c.params.items()})
        elif c.op == "set-group":
            rafter[c.id].props["group"] = c.params["group"]
        elif c.op == "unset-group":
            rafter[c.id].props.pop("group", None)
    return {
        GROUPS_CFG: (
            write_section_config(groups) or None,
            write_section_config(list(gafter.values())) or None,
        ),
        RESOURCES_CFG: (
            write_section_config(res) or None,
            write_section_config(list(rafter.values())) or None,
        ),
    }


def ha_files(state: HaConfig, changes: Sequence[HaChangeLike]) -> dict[str, tuple[str | None, str | None]]:
    """path -> (before, after) of the HA files ``changes`` touch, as Proxmox writes them: the
    rules on PVE 9, the groups and resources on PVE 8. Raises ValueError like
    :func:`write_section_config`."""
    if not changes:
        return {}
    return _rules_files(state, changes) if state.uses_rules else _groups_files(state, changes)
