"""nvidia-smi's distance levels worked out from a host description's ``parent`` links, and the
``nvidia-smi topo -m`` text of a real capture read back: answers the topology code is checked
against, found without it.

A level follows nvidia-smi's legend (``nvidia-smi topo -m``; NVML's nvmlGpuTopologyLevel_t):
PIX when the path between two devices crosses one PCIe switch at most (a switch is an upstream
port with its downstream ports; a root port alone counts as one), PXB when it crosses more
without the host bridge, PHB through their common host bridge, NODE across host bridges of one
NUMA node, SYS across nodes.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml


def _full(addr: str) -> str:
    return addr if addr.count(":") == 2 else "0000:" + addr


class Described:
    """Every device of a host description (``fixtures/hosts/*.yaml`` text or its data) with
    the bridges above it, read from ``parent`` links and preset names alone."""

    def __init__(self, data: str | dict):
        data = yaml.safe_load(data) if isinstance(data, str) else data
        self.devices = {_full(d["addr"]): d for d in data["devices"]}
        self.root_numa = data.get("root_numa", {})

    def chain(self, addr: str) -> list[str]:
        """The bridges above ``addr``, the one under the host bridge first."""
        out, parent = [], self.devices[addr].get("parent")
        while parent:
            out.insert(0, _full(parent))
            parent = self.devices[_full(parent)].get("parent")
        return out

    def host_bridge(self, addr: str) -> str:
        top = (self.chain(addr) or [addr])[0]
        return top[: top.rindex(":")]

    def numa(self, addr: str) -> int | None:
        return self.root_numa.get(self.host_bridge(addr))

    def _switch(self, bridge: str) -> str:
        """The switch a bridge belongs to: a downstream port's is the upstream port above it."""
        if self.devices[bridge]["preset"].endswith("downstream"):
            return _full(self.devices[bridge]["parent"])
        return bridge

    def level(self, a: str, b: str) -> str:
        if a == b:
            return "X"
        if self.host_bridge(a) != self.host_bridge(b):
            same = self.numa(a) is not None and self.numa(a) == self.numa(b)
            return "NODE" if same else "SYS"
        ca, cb = self.chain(a), self.chain(b)
        shared = [x for x, y in zip(ca, cb) if x == y]
        if not shared:
            return "PHB"
        # the path: up from a to the last shared bridge, through it, down to b
        path = set(ca[len(shared) :]) | set(cb[len(shared) :]) | {shared[-1]}
        return "PIX" if len({self._switch(x) for x in path}) == 1 else "PXB"


def capture_matrix(
    path: Path,
) -> tuple[dict[str, dict[str, str]], dict[str, str], dict[str, tuple[str, str]]]:
    """The first ``nvidia-smi topo -m`` table in ``path`` (a capture's text, or gputopo's
    ``topo --matrix`` output): (row name -> column name -> level, NIC legend NICk -> name,
    GPU row -> (CPU affinity, NUMA affinity))."""
    lines = path.read_text().splitlines() if isinstance(path, Path) else str(path).splitlines()
    start = next(i for i, ln in enumerate(lines) if re.match(r"^\s+GPU0\s", ln))
    columns = [c for c in lines[start].split() if re.fullmatch(r"(GPU|NIC)\d+", c)]
    cells: dict[str, dict[str, str]] = {}
    affinity: dict[str, tuple[str, str]] = {}
    for ln in lines[start + 1 :]:
        parts = ln.split()
        if not parts or not re.fullmatch(r"(GPU|NIC)\d+", parts[0]):
            break
        cells[parts[0]] = dict(zip(columns, parts[1 : 1 + len(columns)]))
        rest = parts[1 + len(columns) :]
        if rest:
            affinity[parts[0]] = (rest[0], rest[1])
    legend: dict[str, str] = {}
    if "NIC Legend:" in lines:
        for ln in lines[lines.index("NIC Legend:") + 1 :]:
            m = re.fullmatch(r"\s+(NIC\d+): (\S+)", ln)
            if m:
                legend[m.group(1)] = m.group(2)
            elif legend:
                break
    return cells, legend, affinity
