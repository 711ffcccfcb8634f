"""The journal of a simulated container's services, and ``journalctl`` to read it.

Each start logs systemd's ``Started <unit>.``, what the server printed while it started
(:mod:`gputopo.sim.container.footprint`: the model load, the KV cache it allocated, or the
traceback's last line when it failed) and, for a failed start, systemd's own lines (``Main process exited, code=exited, status=1/FAILURE``, ``Failed with
result 'exit-code'``; systemd ``src/core/service.c`` ``service_sigchld_event`` and
``service_enter_dead``). Options: ``-u UNIT`` (also ``-xeu UNIT``, ``--unit=UNIT``), ``-n N``,
``--no-pager``, ``-b``, ``-x``, ``-e``.
"""

from __future__ import annotations

from pathlib import Path

from gputopo.ports import ExecResult
from gputopo.sim import state

KEEP_LINES = 500  # lines kept per unit (journald keeps far more; tests read the last start or two)


def log(run: Path, vmid: int, unit: str, lines: list[str]) -> None:
    """Append ``lines`` to unit ``unit``'s journal in container ``vmid`` (run dir ``run``)."""
    name = f"journal-{vmid}"
    with state.locked(run, name):
        journal = state.read_state(run, name, {}) or {}
        journal[unit] = (journal.get(unit, []) + list(lines))[-KEEP_LINES:]
        state.write_state(run, name, journal)


def read(run: Path, vmid: int, unit: str) -> list[str]:
    """Unit ``unit``'s journal lines in container ``vmid``, oldest first."""
    return list((state.read_state(run, f"journal-{vmid}", {}) or {}).get(unit, []))


def start_lines(unit: str, pid: int, printed: list[str], failed: bool, code: int = 1) -> list[str]:
    """What a start of ``unit`` logs: systemd's lines around what the server ``printed``."""
    out = [f"Started {unit}."] + [f"{unit.removesuffix('.service')}[{pid}]: {line}" for line in printed]
    if failed:
        out += [
            f"{unit}: Main process exited, code=exited, status={code}/FAILURE",
            f"{unit}: Failed with result 'exit-code'.",
        ]
    return out


def stop_lines(unit: str) -> list[str]:
    """What systemd logs when it stops a running ``unit``."""
    return [f"Stopping {unit}...", f"{unit}: Deactivated successfully.", f"Stopped {unit}."]


def _parse(args: list[str]) -> tuple[str | None, int | None, str | None]:
    """(unit, line count, the option refused) of journalctl's arguments."""
    unit, lines, i = None, None, 0
    while i < len(args):
        a = args[i]
        if a.startswith("--unit="):
            unit = a.split("=", 1)[1]
        elif a in ("-u", "--unit") or (a.startswith("-") and not a.startswith("--") and a.endswith("u")):
            if i + 1 >= len(args) or any(c not in "xeub" for c in a[1:]):
                return None, None, a
            i += 1
            unit = args[i]
        elif a in ("-n", "--lines") and i + 1 < len(args) and args[i + 1].isdigit():
            i += 1
            lines = int(args[i])
        elif a not in ("--no-pager", "-b", "-x", "-e", "-xe", "-q", "--quiet"):
            return None, None, a
        i += 1
    return unit, lines, None


def result(rc: int, out: str = "", err: str = "") -> ExecResult:
    return ExecResult(rc=rc, stdout=out, stderr=err)


def journalctl(run: Path, vmid: int, args: list[str]) -> ExecResult:
    """Run ``journalctl ARGS`` in container ``vmid`` of the host whose run dir is ``run``."""
    unit, lines, bad = _parse(args)
    if bad is not None:
        return result(1, err=f"journalctl: invalid option -- '{bad.lstrip('-')}'\n")
    if unit is None:
        return result(0, "-- No entries --\n")
    if not unit.endswith(".service"):
        unit += ".service"
    out = read(run, vmid, unit)
    if lines is not None:
        out = out[-lines:] if lines else []
    if not out:
        return result(0, "-- No entries --\n")
    return result(0, "".join(line + "\n" for line in out))
