"""``systemctl`` in a simulated container: show, is-active, start, stop, restart, daemon-reload,
list-units and list-unit-files.

A start returns once the server is ready, like a Type=notify unit; meanwhile ``is-active``
says ``activating`` and ``show -p Job`` the id of the start job. With ``--no-block`` a start,
stop or restart returns once its job is queued (a server that crashes at start then shows
``failed``). ``show`` prints service properties before unit ones, as systemd does.
The lists print systemd's columns (systemctl(1), list-units: UNIT LOAD ACTIVE SUB DESCRIPTION;
list-unit-files: UNIT FILE, STATE, PRESET), each padded to its widest cell and separated by
one blank, as systemd's table formatter does (src/shared/format-table.c); ``--no-legend``
drops the header and the footer.
"""

from __future__ import annotations

import time

from gputopo.ports import ExecResult
from gputopo.sim.container.lifecycle import Container, service_latency
from gputopo.sim.container.shell import result
from gputopo.sim.container.units import Unit, unit_name


def _exec_start_prop(svc: dict, unit: Unit) -> str:
    argv = unit.argv
    path = argv[0] if argv and argv[0].startswith("/") else f"/usr/bin/{argv[0] if argv else ''}"
    started = svc.get("state") in ("active", "failed")
    start_time = time.strftime("%a %Y-%m-%d %H:%M:%S UTC", time.gmtime(svc["started"])) if started else "n/a"
    if svc.get("state") == "failed":
        code, status = "exited", f"{svc.get('code', 1)}/FAILURE"
    else:
        code, status = "(null)", "0/0"
    return (
        f"{{ path={path} ; argv[]={' '.join(argv)} ; ignore_errors=no ; start_time=[{start_time}] ; "
        f"stop_time=[n/a] ; pid={svc.get('pid', 0)} ; code={code} ; status={status} }}"
    )


# The options the simulator knows, as systemctl(1) spells them. systemctl reads them with
# getopt_long (src/systemctl/systemctl.c systemctl_parse_argv), which takes them before or after
# the verb; one it does not know fails the command with getopt's message.
FLAGS = {"--no-block", "--all", "-a", "--no-legend", "--plain", "--full", "-l", "--quiet", "-q", "--no-pager"}
VALUED = {"-p", "--property", "-t", "--type"}


def _split(args: list[str]) -> tuple[list[str], list[str], str | None]:
    """(the verb and its arguments, the options with their values, getopt's error or None)."""
    words: list[str] = []
    opts: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            words += args[i + 1 :]
            break
        if not a.startswith("-") or a == "-":
            words.append(a)
        elif a in VALUED:
            if i + 1 >= len(args):
                return words, opts, f"systemctl: option '{a}' requires an argument\n"
            opts += [a, args[i + 1]]
            i += 1
        elif a.split("=", 1)[0] in VALUED and a.startswith("--"):
            opts.append(a)
        elif a[:2] in VALUED:  # a short option with its value attached: -pActiveState
            opts += [a[:2], a[2:]]
        elif a in FLAGS:
            opts.append(a)
        elif a.startswith("--"):
            return words, opts, f"systemctl: unrecognized option '{a.split('=', 1)[0]}'\n"
        else:
            return words, opts, f"systemctl: invalid option -- '{a[1:2]}'\n"
        i += 1
    return words, opts, None


def systemctl(ct: Container, args: list[str]) -> ExecResult:
    """Run ``systemctl ARGS`` in container ``ct``."""
    words, opts, bad = _split(args)
    if bad:
        return result(1, err=bad)
    if not words:
        return result(1, err="Too few arguments.\n")
    verb = words[0]
    # the options first (show reads its -p pairs from them), then the units
    rest = opts + [unit_name(w) for w in words[1:]]
    no_block = "--no-block" in opts
    if verb == "daemon-reload":
        ct.daemon_reload()
        return result(0)
    if verb == "show":
        return _show(ct, rest)
    if verb in ("list-units", "list-unit-files"):
        return _list(ct, verb, rest)
    units = [unit_name(w) for w in words[1:]]
    if verb == "is-active":
        states = [_ready_state(ct.service(u)) for u in units]
        rc = 0 if states and all(s == "active" for s in states) else 3
        return result(rc, "".join(s + "\n" for s in states))
    if verb in ("start", "stop", "restart"):
        return _run_jobs(ct, verb, units, no_block)
    return result(1, err=f"Unknown command verb {verb}.\n")


def _show(ct: Container, rest: list[str]) -> ExecResult:
    """``systemctl show [-p PROP]... UNIT...``: the asked properties of each unit."""
    props: list[str] = []
    units: list[str] = []
    i = 0
    while i < len(rest):
        if rest[i] in VALUED and i + 1 < len(rest):
            if rest[i] in ("-p", "--property"):
                props.extend(rest[i + 1].split(","))
            i += 2
            continue
        if rest[i].startswith("--property="):
            props.extend(rest[i].split("=", 1)[1].split(","))
        elif not rest[i].startswith("-"):
            units.append(rest[i])
        i += 1
    out = []
    # systemd prints service properties (MainPID, ExecStart) before unit ones (ActiveState)
    order = ["MainPID", "ExecStart", "Id", "LoadState", "ActiveState", "SubState", "Job", "Result"]
    for name in units:
        values = _unit_properties(ct, name)
        for p in [p for p in order if p in props] + [p for p in props if p not in order]:
            if p in values:
                out.append(f"{p}={values[p]}")
        if len(units) > 1:
            out.append("")
    return result(0, "".join(line + "\n" for line in out))


def _unit_properties(ct: Container, name: str) -> dict[str, str]:
    """The properties ``systemctl show`` knows of unit ``name``."""
    unit, _ = ct.effective_unit(name)
    svc = ct.service(name)
    active = _ready_state(svc)  # activating until the server is ready, as is-active says
    return {
        "MainPID": str(svc.get("pid", 0)),
        "Id": name,
        "ExecStart": _exec_start_prop(svc, unit) if unit and unit.exec_start else "",
        "LoadState": "loaded" if unit else "not-found",
        "ActiveState": active,
        "SubState": _SUB.get(active, "dead"),
        "Result": svc.get("result", "success"),
        # the job queued for the unit: its id while a start runs (until the server is
        # ready), else empty (src/systemctl/systemctl-show.c print_property, "Job")
        "Job": str(svc.get("job", "")) if active == "activating" else "",
        # when it last became active: a restart changes it (the simulator's clock is
        # wall time in microseconds, systemd's is CLOCK_MONOTONIC; both only grow)
        "ActiveEnterTimestampMonotonic": str(int(svc.get("started", 0) * 1_000_000)),
        # systemd joins every Environment= assignment of the unit and its drop-ins
        "Environment": " ".join(unit.environment) if unit else "",
    }


def _run_jobs(ct: Container, verb: str, units: list[str], no_block: bool) -> ExecResult:
    """``systemctl start|stop|restart UNIT...``. With --no-block (systemctl(1)) the job is only
    verified and enqueued, and the command returns; without it, it waits until the job is done
    (a start: the server is ready)."""
    err = ""
    for name in units:
        stopping = 0.0
        if verb in ("stop", "restart"):
            if ct.service(name).get("state") == "active":
                stopping = service_latency(ct.sim_dir, "stop")
                if not no_block:
                    time.sleep(stopping)
            rc, e = ct.stop_service(name)
            if rc and verb == "stop":
                return result(rc, err=err + e)
        if verb in ("start", "restart"):
            rc, e = ct.start_service(name, verb, block=not no_block, after=stopping if no_block else 0.0)
            err += e
            if rc:
                return result(rc, err=err)
            if not no_block:
                # like a Type=notify unit: start returns once the server says it is ready
                time.sleep(max(0.0, float(ct.service(name).get("ready_at", 0.0)) - time.time()))
    return result(0, err=err)


_SUB = {"active": "running", "activating": "start", "failed": "failed"}


def _table(rows: list[list[str]], header: list[str] | None) -> str:
    """Columns padded to their widest cell, one blank apart; the last column is not padded."""
    table = ([header] if header else []) + rows
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))] if table else []
    return "".join(" ".join(c.ljust(w) for c, w in zip(r[:-1], widths)) + " " + r[-1] + "\n" for r in table)


def _list(ct: Container, verb: str, opts: list[str]) -> ExecResult:
    legend = "--no-legend" not in opts
    types = [o.split("=", 1)[1] for o in opts if o.startswith("--type=")]
    if types and types != ["service"]:
        return result(0, "" if not legend else "0 loaded units listed.\n")
    base = ct.rootfs / "etc/systemd/system"
    files = sorted(p.name for p in base.glob("*.service")) if base.is_dir() else []
    enabled = set(ct.enabled_units())
    if verb == "list-unit-files":
        rows = [
            [
                n,
                "enabled"
                if n in enabled
                else "disabled"
                if (ct.unit(n) and ct.unit(n).wanted_by)
                else "static",
                "enabled",
            ]
            for n in files
        ]
        out = _table(rows, ["UNIT FILE", "STATE", "PRESET"] if legend else None)
        return result(0, out + (f"\n{len(rows)} unit files listed.\n" if legend else ""))
    # loaded units: the enabled ones and every one that was started since boot
    names = sorted(enabled | set(ct._state().get("services", {})))
    rows = []
    for n in names:
        unit = ct.unit(n)
        state = _ready_state(ct.service(n))
        if state == "inactive" and "--all" not in opts:
            continue
        rows.append(
            [
                n,
                "loaded" if unit else "not-found",
                state,
                _SUB.get(state, "dead"),
                (unit.description if unit and unit.description else n),
            ]
        )
    out = _table(rows, ["UNIT", "LOAD", "ACTIVE", "SUB", "DESCRIPTION"] if legend else None)
    return result(0, out + (f"\n{len(rows)} loaded units listed.\n" if legend else ""))


def _ready_state(svc: dict) -> str:
    if svc.get("state") == "active" and float(svc.get("ready_at", 0.0)) > time.time():
        return "activating"
    return svc["state"]
