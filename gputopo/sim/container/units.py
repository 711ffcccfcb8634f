"""systemd units in a container's rootfs, merged as systemd merges them.

Units are files in ``etc/systemd/system``; drop-ins in ``<unit>.d/*.conf`` apply in name order,
an empty ``ExecStart=`` resets the list, and a changed unit needs ``daemon-reload``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from gputopo.sim.container.paths import SimPaths, read_text


@dataclass
class Unit:
    """The effective configuration of a unit: its file plus drop-ins, as systemd merges them."""

    name: str
    exec_start: list[str] = field(default_factory=list)
    service_type: str = "simple"
    wanted_by: list[str] = field(default_factory=list)
    environment: list[str] = field(default_factory=list)
    description: str = ""
    files: list[str] = field(default_factory=list)
    fingerprint: str = ""

    @property
    def argv(self) -> list[str]:
        return shlex.split(self.exec_start[-1].lstrip("-@:+!")) if self.exec_start else []

    def problem(self) -> str | None:
        """Why systemd would refuse the unit (``bad-setting``), or None."""
        if not self.exec_start:
            return f"Service {self.name} has no ExecStart=, ExecStop=, or SuccessAction=. Refusing."
        if len(self.exec_start) > 1 and self.service_type != "oneshot":
            return (
                "Service has more than one ExecStart= setting, which is only allowed for "
                "Type=oneshot services. Refusing."
            )
        return None


def _logical_lines(text: str) -> list[str]:
    lines, buf = [], ""
    for raw in text.splitlines():
        s = raw.strip()
        if not buf and (not s or s[0] in "#;"):
            continue
        if s.endswith("\\"):
            buf += s[:-1] + " "
            continue
        lines.append(buf + s)
        buf = ""
    if buf:
        lines.append(buf)
    return lines


def load_unit(rootfs: Path, name: str) -> Unit | None:
    """Read ``etc/systemd/system/<name>`` and its drop-ins; None when the unit file is missing.

    Drop-ins ``<name>.d/*.conf`` apply in file-name order after the unit file. For list
    settings (``ExecStart=``, ``Environment=``) an empty assignment resets the list.
    """
    base = rootfs / "etc/systemd/system"
    main = base / name
    text = read_text(main)
    if text is None:
        return None
    unit = Unit(name=name)
    sources = [(str(main), text)]
    for drop in sorted((base / f"{name}.d").glob("*.conf")):
        sources.append((str(drop), drop.read_text()))
    for path, body in sources:
        unit.files.append(path)
        section = ""
        for line in _logical_lines(body):
            if line.startswith("[") and line.endswith("]"):
                section = line[1:-1]
                continue
            key, sep, value = line.partition("=")
            if not sep:
                continue
            key, value = key.strip(), value.strip()
            if section == "Service" and key in ("ExecStart", "Environment"):
                target = unit.exec_start if key == "ExecStart" else unit.environment
                if value == "":
                    target.clear()
                else:
                    target.append(value)
            elif section == "Service" and key == "Type":
                unit.service_type = value
            elif section == "Unit" and key == "Description":
                unit.description = value
            elif section == "Install" and key == "WantedBy":
                unit.wanted_by.extend(value.split())
    unit.fingerprint = json.dumps(sources)
    return unit


def write_unit(sim_dir: str | os.PathLike, vmid: int, name: str, text: str, enable: bool = True) -> Path:
    """Install unit ``name`` in container ``vmid``'s rootfs (as a package would), enabled or not.

    Returns the unit file's path.
    """
    base = SimPaths(Path(sim_dir)).rootfs(vmid) / "etc/systemd/system"
    base.mkdir(parents=True, exist_ok=True)
    path = base / name
    path.write_text(text)
    if enable:
        wants = base / "multi-user.target.wants"
        wants.mkdir(exist_ok=True)
        link = wants / name
        if not link.is_symlink():
            link.symlink_to(f"/etc/systemd/system/{name}")
    return path


_UNIT_SUFFIX = re.compile(r"\.(service|socket|target|timer|mount|automount|path|slice|scope|device|swap)$")


def unit_name(name: str) -> str:
    """systemd's ``unit_name_mangle``: a name without a unit type suffix means ``NAME.service``."""
    return name if _UNIT_SUFFIX.search(name) else name + ".service"
