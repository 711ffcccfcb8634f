"""Runtime state of a simulated host, shared by its simulators (``<dir>/run``).

Every piece of state is one JSON file, replaced atomically (temp file + rename) so a killed
process, a concurrent reader in another process and the next run all see either the old or the
new content, never half of it. The Proxmox API simulator and the container simulator meet here:
guest status lives in ``guests.json`` as ``{"lxc": {"101": "running"}, "qemu": {...}}``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path
from typing import Any

from gputopo.sim.files import atomic_write

GUESTS = "guests"


def _path(run_dir: str | os.PathLike, name: str) -> Path:
    if "/" in name or name.startswith("."):
        raise ValueError(f"not a state name: {name!r}")
    return Path(run_dir) / f"{name}.json"


def load_json(path: str | os.PathLike, default: Any = None) -> Any:
    """The JSON content of ``path``, or ``default`` when the file does not exist."""
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return default


def save_json(path: str | os.PathLike, data: Any) -> None:
    """Replace ``path`` with ``data`` as JSON atomically (temp file in the same dir, rename)."""
    atomic_write(path, json.dumps(data, indent=1, sort_keys=True) + "\n")


def read_state(run_dir: str | os.PathLike, name: str, default: Any = None) -> Any:
    """The state ``name`` (``<run_dir>/<name>.json``), or ``default`` when not written yet."""
    return load_json(_path(run_dir, name), default)


def write_state(run_dir: str | os.PathLike, name: str, data: Any) -> None:
    """Atomically replace the state ``name`` with ``data`` (JSON-serialisable)."""
    save_json(_path(run_dir, name), data)


def guest_status(run_dir: str | os.PathLike, kind: str, vmid: int | str) -> str:
    """``"running"`` or ``"stopped"`` for guest ``vmid`` of ``kind`` (``lxc``/``qemu``).

    A guest never started is ``"stopped"``.
    """
    guests = read_state(run_dir, GUESTS, {}) or {}
    status = guests.get(kind, {}).get(str(vmid), "stopped")
    return "running" if status == "running" else "stopped"


def set_guest_status(run_dir: str | os.PathLike, kind: str, vmid: int | str, status: str) -> None:
    """Record guest ``vmid`` of ``kind`` as ``status`` (``"running"`` or ``"stopped"``).

    Raises ValueError for any other status or kind.
    """
    if status not in ("running", "stopped"):
        raise ValueError(f"guest status must be running or stopped, not {status!r}")
    if kind not in ("lxc", "qemu"):
        raise ValueError(f"guest kind must be lxc or qemu, not {kind!r}")
    with locked(run_dir, GUESTS):
        guests = read_state(run_dir, GUESTS, {}) or {}
        guests.setdefault(kind, {})[str(vmid)] = status
        write_state(run_dir, GUESTS, guests)


@contextlib.contextmanager
def locked(run_dir: str | os.PathLike, name: str):
    """Hold an exclusive lock on state ``name`` for a read-modify-write across processes."""
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    fd = os.open(Path(run_dir) / f".{name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
