"""Fixtures: the shipped host descriptions, and a real-layout root built from one."""

from __future__ import annotations

from pathlib import Path


def fixtures() -> list[tuple[str, str]]:
    """(name, description) of every shipped host description."""
    from gputopo.sim.hostroot import list_hosts, load_host

    return [(name, load_host(name).description) for name in list_hosts()]


def build(name: str, dest: str) -> Path:
    """Build host ``name`` (or a .yaml path) as a root under ``dest``; returns the root."""
    from gputopo.sim.hostroot import materialize

    return materialize(name, Path(dest))
