"""The crash matrix's cases as data, and the tally of how its runs ended.

A case is a shape of change (which GPUs move, in which direction, with or without a VM consuming
them, from a host split live or with HA-managed guests), the container's restart policy, the
Proxmox version and a family of runs (SIGKILL at every point of the apply, of its rollback, of a
recover; a failure injected at each step; SIGTERM, SIGINT or SIGHUP while a guest stops). Each run of a
case ends "applied" (what runs is what a clean apply leaves), "before" (what runs is what ran
before) or "other". Every run is recorded as one JSON line in ``$GPUTOPO_MATRIX_RECORDS`` (a
directory the test session makes), so the session can print the runs per direction at its end
(``tests/conftest.py``), with ``pytest-xdist`` workers too.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

RECORDS_ENV = "GPUTOPO_MATRIX_RECORDS"
COUNTS_ENV = "GPUTOPO_MATRIX_COUNTS"  # a file the session writes the counts to (JSON), when set
CASES_ENV = "GPUTOPO_MATRIX_CASES"  # the same per case (and printed per case), when set
OUTCOMES = ("applied", "before", "other")

PVE = {"8": "8.4.1", "9": "9.1.2"}
RESTARTS = ("auto", "always")  # the container keeps running where it can / stops and starts again
FAMILIES = ("kill-apply", "kill-rollback", "kill-recover", "fail-step")
# SIGTERM, SIGINT, SIGHUP in turn at every point where a guest's stop or shutdown task runs (its
# call returned, the task not ended) and at the other kill points of a clean apply
SIGNAL_FAMILY = "signal-stop"
SIGNALS = ("TERM", "INT", "HUP")  # GPUTOPO_CRASH_SIGNAL of tests/helpers/crashdriver.py
SIGNAL_EXIT = {"TERM": 143, "INT": 130, "HUP": 129}  # 128 + the signal's number
# SIGKILL at the kill points of a clean apply (every guest start and stop just queued among them),
# then 'recover --finish': every run must end applied
FINISH_FAMILY = "kill-finish"

NUMA0 = ["0000:01:00.0", "0000:11:00.0", "0000:61:00.0", "0000:71:00.0"]


def _quoted(addresses: list[str]) -> str:
    return "[" + ", ".join(f'"{a}"' for a in addresses) + "]"


def _vm_mapping(selector: str) -> str:
    return f"        - name: pro6000-vm\n          gpus:\n            {selector}\n"


# the VM mapping block of init_spec's text (the one the seed spec and the demo write)
VM_MAPPING_BLOCK = re.compile(
    r"        - name: pro6000-vm\n(?:          #[^\n]*\n)?          gpus:\n            [^\n]*\n"
)
REMOVE = "        - {vmid: 201, mapping: pro6000-vm, when_gpus_leave: remove, start: true}\n"
REPOINT = (
    "        - {vmid: 201, mapping: pro6000-vm, gpus: 2, when_gpus_leave: repoint, repoint_to: pro6000-b,"
    " start: true}\n"
)


def _with(text: str, container: str, mappings: str, consumer: str | None, restart: str) -> str:
    """init_spec's seed text with the container's selector, the VM mappings, VM 201 as consumer
    (``None``: no consumer) and the restart policy."""
    text = text.replace("          numa: [0]\n", f"          {container}\n", 1)
    text, n = VM_MAPPING_BLOCK.subn(mappings, text, count=1)
    assert n == 1, "the seed spec's VM mapping block changed"
    if consumer:
        text = text.replace("      # consumers:\n", "      consumers:\n" + consumer, 1)
    return text.replace("policy:\n", f"policy:\n  container_restart: {restart}\n", 1)


@dataclass(frozen=True)
class Shape:
    """A change from ``start`` (None: the seed host, every GPU in container 101) to ``target``;
    each is a function of (the seed host's init_spec text, restart policy) -> spec text.

    ``spec`` names the change when it is another shape's (the name then says how the start host
    differs); ``live``: the start host is reached by applying its spec with restart ``auto``, not
    ``always`` (on PVE 9 the container keeps running, the removed devN pending); ``ha``: the guests
    that are HA resources (``ct:101``, ``vm:201``), as ``gputopo sim create --ha`` makes them."""

    name: str
    direction: str  # split: GPUs leave the container for VM passthrough; reverse: they come back
    spec: str = ""
    live: bool = False
    ha: tuple[str, ...] = ()

    def specs(self, seed: str, restart: str) -> tuple[str | None, str]:
        split = _vm_mapping("numa: [1]")
        back = _vm_mapping("rest")
        name = self.spec or self.name
        if name == "split":
            return None, _with(seed, "numa: [0]", split, None, restart)
        if name == "split-vm":
            return None, _with(seed, "numa: [0]", split, REMOVE, restart)
        if name == "reverse":
            return _with(seed, "numa: [0]", split, None, restart), _with(
                seed, "numa: [0, 1]", back, None, restart
            )
        if name == "reverse-vm-remove":
            return (
                _with(seed, "numa: [0]", split, REMOVE, restart),
                _with(seed, "numa: [0, 1]", back, REMOVE, restart),
            )
        if name == "reverse-vm-repoint":
            # VM 201 runs on two GPUs of node 0; they go back to the container (two -> four) and its
            # lines name mapping pro6000-b (node 1) instead
            b = "        - name: pro6000-b\n          gpus:\n            numa: [1]\n"
            return (
                _with(
                    seed,
                    f"addresses: {_quoted(NUMA0[:2])}",
                    _vm_mapping(f"addresses: {_quoted(NUMA0[2:])}") + b,
                    REPOINT,
                    restart,
                ),
                _with(seed, "numa: [0]", _vm_mapping("addresses: []") + b, REPOINT, restart),
            )
        raise ValueError(self.name)


SHAPES = (
    Shape("split", "split"),
    Shape("split-vm", "split"),
    Shape("reverse", "reverse"),
    Shape("reverse-vm-remove", "reverse"),
    Shape("reverse-vm-repoint", "reverse"),
)
HA = ("ct:101", "vm:201")
# reverses from a split applied live on PVE 9 (CT 101 running with ``[pve:pending] delete:
# dev4,dev5,dev6,dev7``), and changes of HA-managed guests (the container and the VM consumer)
NEW_SHAPES = (
    Shape("reverse-live", "reverse", spec="reverse", live=True),
    Shape("reverse-vm-remove-live", "reverse", spec="reverse-vm-remove", live=True),
    Shape("split-ha", "split", spec="split", ha=HA),
    Shape("split-vm-ha", "split", spec="split-vm", ha=HA),
    Shape("reverse-vm-remove-ha", "reverse", spec="reverse-vm-remove", ha=HA),
)


@dataclass(frozen=True)
class Case:
    shape: Shape
    restart: str
    pve: str  # "8" or "9"
    family: str

    @property
    def id(self) -> str:
        return f"{self.shape.name}-{self.restart}-pve{self.pve}-{self.family}"

    @property
    def group(self) -> str:
        """The start host it copies (one per xdist worker)."""
        return f"crash-{self.shape.name}-{self.restart}-pve{self.pve}"


CASES = [Case(s, r, v, f) for s in SHAPES for r in RESTARTS for v in PVE for f in FAMILIES]
_BY_NAME = {s.name: s for s in (*SHAPES, *NEW_SHAPES)}
# The new shapes where they mean something, and the signal family where a guest stops. A live
# start host exists on PVE 9 only, and is changed with ``auto``: with ``always`` the apply restarts
# the container, whose start carries out the pending deletions, so no rollback could give back
# the running container's view of /dev with those deletions still pending. An HA container stops
# with ``always`` (the HA VM with either); HA runs on PVE 9 (its rules, PVE 8's groups, are not
# what the matrix changes).
CASES += [
    Case(_BY_NAME[n], "auto", "9", f) for n in ("reverse-live", "reverse-vm-remove-live") for f in FAMILIES
]
CASES += [
    Case(_BY_NAME[n], "always", "9", f)
    for n in ("split-ha", "split-vm-ha", "reverse-vm-remove-ha")
    for f in ("kill-apply", "kill-recover", "fail-step")
]
# the signal and finish families, on the shapes (restart, release) where they mean something
ON_SHAPES = {
    SIGNAL_FAMILY: (
        ("split", "always", "8"),
        ("split-vm", "always", "9"),
        ("reverse-vm-remove", "auto", "9"),
        ("reverse-vm-remove", "always", "8"),
        ("reverse-vm-remove-live", "auto", "9"),
        ("split-ha", "always", "9"),
        ("reverse-vm-remove-ha", "always", "9"),
    ),
    FINISH_FAMILY: (
        ("split", "auto", "8"),
        ("split", "always", "9"),
        ("reverse", "always", "8"),
        ("split-vm", "always", "9"),
        ("reverse-vm-remove", "auto", "9"),
        ("reverse-vm-remove-live", "auto", "9"),
        ("split-ha", "always", "9"),
    ),
}
CASES += [Case(_BY_NAME[n], r, v, f) for f, rows in ON_SHAPES.items() for n, r, v in rows]


def sample(points: list[str], n: int | None) -> list[str]:
    """``n`` of ``points`` spread evenly, first and last included (all when ``n`` is None)."""
    if n is None or len(points) <= n:
        return list(points)
    return [points[round(i * (len(points) - 1) / (n - 1))] for i in range(n)]


def record(case: Case, point: str, outcome: str, detail: str = "") -> None:
    d = os.environ.get(RECORDS_ENV)
    if not d:
        return
    line = {
        "direction": case.shape.direction,
        "case": case.id,
        "point": point,
        "outcome": outcome,
        "detail": detail,
    }
    Path(d).mkdir(parents=True, exist_ok=True)
    with open(Path(d) / f"{os.getpid()}.jsonl", "a") as f:
        f.write(json.dumps(line) + "\n")


def tally(records_dir: Path, key: str = "direction") -> dict[str, dict[str, int]]:
    """direction (or case, ``key``) -> {runs, applied, before, other} over every recorded run."""
    counts: dict[str, Counter] = {}
    for p in sorted(records_dir.glob("*.jsonl")) if records_dir.is_dir() else []:
        for line in p.read_text().splitlines():
            r = json.loads(line)
            c = counts.setdefault(r[key], Counter())
            c["runs"] += 1
            c[r["outcome"]] += 1
    return {d: {k: c[k] for k in ("runs", *OUTCOMES)} for d, c in sorted(counts.items())}


def summary(counts: dict[str, dict[str, int]], key: str = "direction") -> list[str]:
    width = max([10, *(len(d) + 1 for d in counts)])
    lines = [f"{key:<{width}} {'runs':>6} {'applied':>8} {'before':>7} {'other':>6}"]
    for d, c in counts.items():
        lines.append(f"{d:<{width}} {c['runs']:>6} {c['applied']:>8} {c['before']:>7} {c['other']:>6}")
    return lines
