"""The simulated kernel's state, shared by every process using the same root.

Latencies, a global ``time_scale``, injected faults, dynamic ids and what the tree looked like
the first time the simulator saw it live in ``<root>/.gputopo-sim/kernel.json``, replaced
atomically under a lock (thread and ``flock``) so every process using the same root sees them.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gputopo.sim.kernel.faults import DEFAULT_LATENCY
from gputopo.sim.kernel.nvidia import parse_minor
from gputopo.sim.state import save_json

STATE_DIR = ".gputopo-sim"
STATE_FILE = "kernel.json"


class StateFile:
    """The state file of :class:`gputopo.sim.kernel.SimKernel` (a mixin over its tree reader)."""

    @property
    def state_path(self) -> Path:
        return self._root / STATE_DIR / STATE_FILE

    @contextlib.contextmanager
    def _state(self) -> Iterator[dict[str, Any]]:
        """The simulator's state, locked against other threads and processes; saved on exit
        (also when an error leaves the block: tree changes made so far must stay recorded).
        Re-entrant within one thread."""
        held = getattr(self._tls, "state", None)
        if held is not None:
            yield held
            return
        d = self._root / STATE_DIR
        d.mkdir(exist_ok=True)
        with self._lock:
            with open(d / "kernel.lock", "a+") as lk:
                fcntl.flock(lk, fcntl.LOCK_EX)
                try:
                    try:
                        st = json.loads(self.state_path.read_text())
                    except FileNotFoundError:
                        st = self._first_sight()
                    before = json.dumps(st, sort_keys=True)
                    self._tls.state = st
                    try:
                        yield st
                    finally:
                        self._tls.state = None
                        if json.dumps(st, sort_keys=True) != before or not self.state_path.exists():
                            save_json(self.state_path, st)
                finally:
                    fcntl.flock(lk, fcntl.LOCK_UN)

    def _read_state(self) -> dict[str, Any]:
        with self._state() as st:
            return json.loads(json.dumps(st))

    def _first_sight(self) -> dict[str, Any]:
        """Record how the tree looked the first time: the bindings, nvidia minors and texts."""
        original: dict[str, str | None] = {}
        minors: dict[str, int] = {}
        info: dict[str, str] = {}
        for addr in self._addresses():
            drv = self._driver(addr)
            original[addr] = drv
            text = self._read(f"proc/driver/nvidia/gpus/{addr}/information")
            if text is not None:
                info[addr] = text
                m = parse_minor(text)
                if m is not None:
                    minors[addr] = m
        return {
            "version": 1,
            "original": original,
            "minors": minors,  # nvidia minor per bound GPU (or the last one it had)
            "nv_info": info,
            "dynids": {},
            "removed": [],
            "time_scale": 1.0,
            "latency": dict(DEFAULT_LATENCY),
            "address_latency": {},
            "faults": [],
            "next_fault": 1,
        }
