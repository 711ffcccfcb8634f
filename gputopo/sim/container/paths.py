"""Where a simulated host keeps its parts, and paths inside a container.

A simulated host lives in one directory (docs/ARCHITECTURE.md, "Simulated host"): ``root/``
the host root, ``pve/`` the Proxmox files, ``run/`` runtime state (JSON, atomic),
``ct/<vmid>/rootfs/`` each container's files.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gputopo.sim import state


@dataclass
class SimPaths:
    """The directories of a simulated host."""

    dir: Path

    @property
    def root(self) -> Path:
        return self.dir / "root"

    @property
    def pve(self) -> Path:
        return self.dir / "pve"

    @property
    def run(self) -> Path:
        return self.dir / "run"

    def rootfs(self, vmid: int) -> Path:
        return self.dir / "ct" / str(vmid) / "rootfs"

    def node(self) -> str:
        """The node name: recorded in ``run/host.json``, else the only ``pve/nodes/*``."""
        host = state.read_state(self.run, "host", {}) or {}
        if host.get("node"):
            return host["node"]
        nodes = sorted(p.name for p in (self.pve / "nodes").glob("*") if p.is_dir())
        return nodes[0] if nodes else "localhost"

    def lxc_conf(self, vmid: int) -> Path:
        return self.pve / "nodes" / self.node() / "lxc" / f"{vmid}.conf"


def inside(base: Path, path: str) -> Path:
    """``path`` (absolute, inside the container) under ``base``; ValueError when it escapes."""
    rel = path.lstrip("/")
    if ".." in Path(rel).parts:
        raise ValueError(f"path escapes the container: {path}")
    return base / rel


def read_text(path: Path) -> str | None:
    """The text of ``path``; None when it does not exist (or is a directory)."""
    try:
        return path.read_text()
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
