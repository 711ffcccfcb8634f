"""The guest inside a simulated VM and its QEMU guest agent, as qemu-server reaches it.

qemu-server's agent endpoints (``PVE/API2/Qemu/Agent.pm``, ``PVE/QemuServer/Agent.pm``) first
run ``assert_agent_available``: ``No QEMU guest agent configured`` without an ``agent`` key,
``VM <vmid> is not running``, and ``QEMU guest agent is not running`` when ``guest-ping`` gets
no answer within 3 s (an agent that never answers, or a guest still booting). ``exec`` answers
``{pid}``; ``exec-status`` answers ``exited`` (0/1) and, once exited, ``exitcode``,
``out-data`` and ``err-data`` (decoded from the agent's base64 by qemu-server); a program the
guest does not have is an ``Agent error``.

The guest boots ``agent.boot`` seconds (run-state ``latencies``) after the VM starts; the agent
then answers unless a fault says it never does (:func:`hang_agent`). Its ``nvidia-smi`` lists
the passed-through NVIDIA GPUs that the firmware gave their BARs, at their guest addresses.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from gputopo.ports import ExecResult
from gputopo.sim import state
from gputopo.sim.container.gpus import DEFAULT_TOTAL_MIB, IDLE_MIB, MEMORY_TOTAL_MIB
from gputopo.sim.container.nvidia_smi import NVSMI_NO_DEVICES, answer
from gputopo.sim.qemu.runtime import runtime_of

AGENT_FAULTS = "qemu-agent-faults"
EXECS = "qemu-agent-exec"
BOOT_S, PING_TIMEOUT_S = 0.05, 3.0  # defaults; "agent.boot" and "agent.timeout" in latencies
DRIVER = "570.133.20"


class AgentError(Exception):
    """qemu-server's die message for an agent call (the API answers 500 with it)."""


def hang_agent(run_dir: Path, vmid: int, hung: bool = True) -> None:
    """Make VM ``vmid``'s guest agent never answer (or answer again)."""
    with state.locked(run_dir, AGENT_FAULTS):
        faults = state.read_state(run_dir, AGENT_FAULTS, {}) or {}
        faults[str(vmid)] = hung
        state.write_state(run_dir, AGENT_FAULTS, faults)


def _latency(run_dir: Path, name: str, default: float) -> float:
    return float((state.read_state(run_dir, "latencies", {}) or {}).get(name, default))


def assert_agent(run_dir: Path, vmid: int, config: dict[str, str]) -> dict[str, Any]:
    """The running VM's runtime once its agent answers. Raises AgentError as qemu-server dies
    (after the 3 s ``guest-ping`` timeout when the agent does not answer)."""
    if "agent" not in config:
        raise AgentError("No QEMU guest agent configured")
    rt = runtime_of(run_dir, vmid)
    if rt is None:
        raise AgentError(f"VM {vmid} is not running")
    hung = (state.read_state(run_dir, AGENT_FAULTS, {}) or {}).get(str(vmid), False)
    enabled = config["agent"].split(",")[0].removeprefix("enabled=") in ("1", "on", "yes", "true")
    booting = time.time() < rt["started"] + _latency(run_dir, "agent.boot", BOOT_S)
    if hung or booting or not enabled:
        time.sleep(_latency(run_dir, "agent.timeout", PING_TIMEOUT_S))
        raise AgentError("QEMU guest agent is not running")
    return rt


def exec_command(run_dir: Path, vmid: int, config: dict[str, str], argv: list[str]) -> dict[str, int]:
    """``guest-exec`` of ``argv``: ``{"pid": N}``. Raises AgentError."""
    rt = assert_agent(run_dir, vmid, config)
    if not argv:
        raise AgentError("command or input-data (or both) required")
    res = _run(rt, argv)
    with state.locked(run_dir, EXECS):
        execs = state.read_state(run_dir, EXECS, {}) or {}
        mine = execs.setdefault(str(vmid), {})
        pid = 1000 + len(mine)
        mine[str(pid)] = {"exitcode": res.rc, "out": res.stdout, "err": res.stderr}
        state.write_state(run_dir, EXECS, execs)
    return {"pid": pid}


def exec_status(run_dir: Path, vmid: int, config: dict[str, str], pid: int) -> dict[str, Any]:
    """``guest-exec-status`` of ``pid``. Raises AgentError for a pid the agent does not know."""
    assert_agent(run_dir, vmid, config)
    got = ((state.read_state(run_dir, EXECS, {}) or {}).get(str(vmid)) or {}).get(str(pid))
    if got is None:
        raise AgentError("Agent error: Invalid parameter 'pid'")
    out: dict[str, Any] = {"exited": 1, "exitcode": got["exitcode"]}
    if got["out"]:
        out["out-data"] = got["out"]
    if got["err"]:
        out["err-data"] = got["err"]
    return out


def _run(rt: dict[str, Any], argv: list[str]) -> ExecResult:
    prog = argv[0].rsplit("/", 1)[-1]
    if prog == "nvidia-smi":
        return nvidia_smi(rt, argv[1:])
    if prog == "true":
        return ExecResult(0)
    raise AgentError(
        f"Agent error: Guest agent command failed, error was 'Failed to execute child process "
        f'"{argv[0]}" (No such file or directory)\''
    )


def nvidia_smi(rt: dict[str, Any], args: list[str]) -> ExecResult:
    """``nvidia-smi`` in the guest: the GPUs that got their BARs, at their guest addresses."""
    rows = []
    for dev in sorted(
        (d for d in rt["devices"] if d["bars"] and d.get("gpu", True)), key=lambda d: d["guest"]
    ):
        device_id = dev.get("device_id") or "0x2bb5"
        total = MEMORY_TOTAL_MIB.get(device_id, DEFAULT_TOTAL_MIB)
        dom, bus, rest = dev["guest"].split(":")
        rows.append(
            {
                "pci.bus_id": f"{int(dom, 16):08X}:{bus.upper()}:{rest.upper()}",
                "name": dev.get("name", "NVIDIA GPU"),
                "memory.used": IDLE_MIB,
                "memory.total": total,
                "memory.free": total - IDLE_MIB,
                "utilization.gpu": 0,
                "uuid": dev.get("uuid", ""),
                "minor_number": len(rows),
                "driver_version": DRIVER,
            }
        )
    if not rows:
        return ExecResult(6, NVSMI_NO_DEVICES)
    for i, r in enumerate(rows):
        r.update(index=i, count=len(rows))
    return answer(args, rows)
