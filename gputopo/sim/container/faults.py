"""Faults of a simulated container, set on purpose by tests and rehearsals.

They live in ``<run>/faults.json`` (set with :func:`break_container` /
:meth:`gputopo.sim.container.SimExec.break_`): ``gpu_missing`` (``address=`` or ``index=``;
default the last GPU), ``unbalanced_memory`` (``index=``, ``used_mib=``), ``wrong_answer``
(``answer=``), ``hung_endpoint`` (``seconds=``), ``nvidia_smi_fails`` (``rc=``, ``message=``),
``service_fails`` (``message=``; ``count=`` fails only the next starts; ``tp=`` only a start with
that tensor-parallel size, as a new configuration that does not fit), ``slow_start``
(``seconds=``: how long a start takes until the server is ready, instead of the ``service.start``
latency; ``tp=`` only a start with that tensor-parallel size, as a model that loads slowly).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gputopo.sim import state
from gputopo.sim.container.paths import SimPaths

FAULTS = (
    "gpu_missing",
    "unbalanced_memory",
    "wrong_answer",
    "hung_endpoint",
    "nvidia_smi_fails",
    "service_fails",
    "slow_start",
)


def break_container(sim_dir: str | os.PathLike, vmid: int, what: str, **params: Any) -> None:
    """Break one thing in container ``vmid`` on purpose (see the module docstring for ``what``).

    Raises ValueError for an unknown fault name.
    """
    if what not in FAULTS:
        raise ValueError(f"unknown fault {what!r} (known: {', '.join(FAULTS)})")
    run = SimPaths(Path(sim_dir)).run
    with state.locked(run, "faults"):
        faults = state.read_state(run, "faults", {}) or {}
        faults.setdefault(str(vmid), {})[what] = params
        state.write_state(run, "faults", faults)


def heal_container(sim_dir: str | os.PathLike, vmid: int, what: str | None = None) -> None:
    """Undo fault ``what`` (all faults when None) in container ``vmid``."""
    run = SimPaths(Path(sim_dir)).run
    with state.locked(run, "faults"):
        faults = state.read_state(run, "faults", {}) or {}
        mine = faults.get(str(vmid), {})
        if what is None:
            mine.clear()
        else:
            mine.pop(what, None)
        faults[str(vmid)] = mine
        state.write_state(run, "faults", faults)


def faults_of(sim_dir: str | os.PathLike, vmid: int) -> dict[str, dict]:
    """The active faults of container ``vmid``: {name: params}."""
    faults = state.read_state(SimPaths(Path(sim_dir)).run, "faults", {}) or {}
    return faults.get(str(vmid), {})
