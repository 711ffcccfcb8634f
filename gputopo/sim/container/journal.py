"""``journalctl`` in a simulated container: a service's log of its last start.

What the server printed while it started (:mod:`gputopo.sim.container.footprint`: the model
load, the KV cache it allocated, or the traceback's last line when it failed) and, for a failed
start, systemd's own lines (``Main process exited, code=exited, status=1/FAILURE``, ``Failed with
result 'exit-code'``; systemd ``src/core/service.c`` ``service_sigchld_event`` and
``service_enter_dead``). Options: ``-u UNIT`` (also ``-xeu UNIT``, ``--unit=UNIT``), ``-n N``,
``--no-pager``, ``-b``, ``-x``, ``-e``.
"""

from __future__ import annotations

from gputopo.ports import ExecResult
from gputopo.sim.container.lifecycle import Container
from gputopo.sim.container.processes import HOST_PID_BASE
from gputopo.sim.container.shell import result


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


def journalctl(ct: Container, args: list[str]) -> ExecResult:
    """Run ``journalctl ARGS`` in container ``ct`` (a unit's log; the whole journal is not kept)."""
    unit, lines, bad = _parse(args)
    if bad is not None:
        return result(1, err=f"journalctl: invalid option -- '{bad.lstrip('-')}'\n")
    if unit is None:
        return result(0, "-- No entries --\n")
    if not unit.endswith(".service"):
        unit += ".service"
    svc = ct.service(unit)
    out = [f"Started {unit}."] if svc.get("argv") else []
    pid = svc.get("pid") or HOST_PID_BASE + ct.vmid * 100  # a failed start's server had no pid kept
    out += [f"{unit.removesuffix('.service')}[{pid}]: {line}" for line in svc.get("journal", [])]
    if svc.get("state") == "failed":
        out += [
            f"{unit}: Main process exited, code=exited, status={svc.get('code', 1)}/FAILURE",
            f"{unit}: Failed with result '{svc.get('result', 'exit-code')}'.",
        ]
    if not out:
        return result(0, "-- No entries --\n")
    if lines is not None:
        out = out[-lines:] if lines else []
    return result(0, "".join(line + "\n" for line in out))
