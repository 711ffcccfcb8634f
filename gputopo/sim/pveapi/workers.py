"""Who runs a simulated task's effect, and whether it still can.

On a node a task's worker is a process of its own: pve-common RESTEnvironment.pm fork_worker
forks it and detaches it (``POSIX::setsid``), so it runs to its end whatever happens to the
client that asked for it. In the simulator the worker is a thread of the process that serves
the API, often the client itself: a SIGKILL of that process ends the worker mid-effect. The
task then names the process that claimed it (its pid and its start time from
``/proc/<pid>/stat``, so a reused pid is not mistaken for it), and a server started later
takes over a task whose claimer is gone, as the node's detached worker would have gone on:
the effect is run again from its beginning, unless the guest is already where the task leads
(the worker died after its effect, before the task's end was written).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gputopo.sim import state

# the guest's status each kind of task leaves it in (an HA task only asks the manager: none)
GOAL = {"start": "running", "stop": "stopped", "shutdown": "stopped"}


def _start_time(pid: int) -> int | None:
    """Field 22 of ``/proc/<pid>/stat`` (starttime, in clock ticks since boot), None when the
    process is gone. The command name (field 2) may hold spaces: fields count after its ')'."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(text.rpartition(")")[2].split()[19])


def me() -> dict[str, int | None]:
    """This process as a task's claimer."""
    pid = os.getpid()
    return {"pid": pid, "start": _start_time(pid)}


def alive(claim: Any) -> bool:
    """Whether the process that claimed a task still runs (a claim without a pid counts as alive:
    nothing tells it is gone)."""
    if not isinstance(claim, dict) or not isinstance(claim.get("pid"), int):
        return True
    start = _start_time(claim["pid"])
    return start is not None and (claim.get("start") is None or start == claim["start"])


def orphaned(task: dict[str, Any]) -> bool:
    """A running task whose claimer died with its effect unfinished."""
    return task["status"] == "running" and bool(task.get("claimed")) and not alive(task["claimed"])


def reached(run_dir: Any, task: dict[str, Any]) -> bool:
    """Whether the guest is already where ``task`` leads it (its dead worker got that far)."""
    goal = GOAL.get(task["action"])
    return goal is not None and state.guest_status(run_dir, task["kind"], task["vmid"]) == goal
