"""SIGKILL at every point of an apply, of its rollback and of a recover, then recover, and a failure
injected at each step: every run ends fully applied or identical to before, with the service
running what its unit says.

The cases are data (``tests/helpers/crashmatrix.py``): every shape of change (the split, with and
without VM 201 consuming the VM mapping; the reverse, without a VM, with VM 201 running and
``when_gpus_leave: remove``, and a partial reverse that repoints it with ``repoint``), both restart
policies (``auto`` keeps the container running where Proxmox allows it, a hot-plug on PVE 9;
``always`` stops and starts it), PVE 8 and 9, and four families of runs:

* ``kill-apply``: SIGKILL at every kill point of a clean apply, then ``gputopo recover``;
* ``kill-rollback``: the last step fails, then SIGKILL at every point of the rollback, then recover;
* ``kill-recover``: the apply is killed mid-switch, its recover killed at every point, then a
  second recover;
* ``fail-step``: each step of the plan made to fail once (the simulator's faults: the kernel's,
  a Proxmox task's or API call's, the container's service; a read-only host file, a full container
  disk and a cancelled stop job through ``tests/helpers/crashdriver.py``), then recover when the
  journal was left open;
* ``signal-stop``: SIGTERM, SIGINT and SIGHUP in turn, at every point where a guest's stop or
  shutdown task was accepted and has not ended, and at a sample of the other kill points: the
  apply must end rolled back with the signal's exit status (143, 130, 129) or applied with 0
  (recover only where it left the journal open);
* ``kill-finish``: SIGKILL at the kill points of a clean apply (every guest start and stop just
  queued among them), then ``gputopo recover --finish``: every run must end applied, exit 0.

Three shapes more: reverses whose start host is a split applied live on PVE 9 (``reverse-live``,
``reverse-vm-remove-live``: CT 101 running with ``[pve:pending] delete: dev4,...``), and the
split, the split with VM 201 and the reverse that removes VM 201's GPUs with CT 101 and VM 201
HA-managed (``-ha``): their starts and stops go through the simulated HA manager (a second per
request); a kill follows each of those requests, and a run's host is served for a few of the
manager's rounds before it is compared, so a request left behind moves its guest first; the
resources' requested states and the manager's states are compared too.

Kill points are counted, not polled (``crashdriver.py``): right after every journal record
reaches the disk and right after every call that changes the host. The simulated host runs at a
realistic pace where it matters for a rollback: the service stays ``activating`` for a second
after each start and the container takes most of a second to shut down. What is compared is what
runs (``applysim.fingerprint``): drivers and overrides, the nvidia and vfio nodes, the Proxmox
files, host and container files with their modes, which guests run, the service's real command
line and the GPUs its processes hold, the container's view of /dev.

The ``matrix`` marker (the CI run) takes an even sample of each case's points, ``matrix_full``
every point; a few cases of the first shape run with the ``slow`` tests. The session prints
the runs per direction and how they ended (``GPUTOPO_MATRIX_COUNTS=FILE`` keeps them as JSON).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gputopo.apply.journal import find_unfinished, list_journals, parse_journal
from gputopo.plan.spec import parse_spec
from gputopo.sim import state
from gputopo.sim.container import break_container, heal_container
from gputopo.sim.container.modelfiles import SEED_MODEL, SMALL_MODEL
from gputopo.sim.host import SimHost
from gputopo.sim.kernel import SimKernel
from gputopo.usecases.readplan import read_and_plan
from helpers import TESTS, applysim
from helpers.crashmatrix import CASES, FINISH_FAMILY, PVE, SIGNAL_EXIT, SIGNALS, Case, record, sample

DRIVER = TESTS / "helpers" / "crashdriver.py"
WORKERS = 4  # runs of one case at a time: most of a run is the paced host waiting
SAMPLE = 6  # points per case under the matrix marker

# Known bugs not fixed yet: (shape, restart, pve, family) -> which bug. A case listed here is
# expected to fail (strict: it fails as XPASS once the fix lands, and then leaves this table).
# KNOWN holds for the sample and every point; KNOWN_FULL for every point only (a case whose sample
# misses the points that fail).
KNOWN: dict[tuple[str, str, str, str], str] = {}
KNOWN_FULL: dict[tuple[str, str, str, str], str] = {}


def _param(case: Case, marks: list, full: bool = False) -> object:
    key = (case.shape.name, case.restart, case.pve, case.family)
    reason = KNOWN.get(key) or (KNOWN_FULL.get(key) if full else None)
    if reason:
        marks = [*marks, pytest.mark.xfail(strict=True, reason=reason)]
    return pytest.param(case, marks=[*marks, pytest.mark.xdist_group(case.group)], id=case.id)


# --- hosts: one start host per shape, restart policy and Proxmox version, copied per run --------


HA_CRM = 1.0  # the simulated HA manager takes a request after half of it, moves the guest after it


def _pace(sim: Path) -> None:
    """A real server's pace where the rollback logic depends on it: the service stays activating
    for a second after each start, the container takes a while to shut down, and the HA manager
    moves a guest a second after its request (tests/apply/test_ha_guests.py). ``$GPUTOPO_MATRIX_PACE``
    scales it (3: a service activating for 3 s, a container shutdown of 2.4 s, a VM's of 6 s)."""
    scale = os.environ.get("GPUTOPO_MATRIX_PACE")
    k = float(scale or 1)
    latencies = {
        "service.start": 1.0 * k,
        "service.stop": 0.1 * k,
        "vzstart": 0.3 * k,
        "vzshutdown": 0.8 * k,
        "ha.crm": HA_CRM * k,
    }
    if scale:  # a VM's guest OS takes a while to power down too
        latencies["qmshutdown"] = 2.0 * k
    state.write_state(sim / "run", "latencies", latencies)


def _make_ha(h: SimHost, sids: tuple[str, ...]) -> None:
    """The guests ``sids`` HA resources, each with the requested state of what it is doing now (a
    stopped guest asked to be ``started`` would be started by the HA manager on its own)."""
    for sid in sids:
        kind, _, vmid = sid.partition(":")
        running = state.guest_status(h.paths.run, "lxc" if kind == "ct" else "qemu", int(vmid)) == "running"
        h.make_ha_managed(sid, "started" if running else "stopped")


SETTLE_ROUNDS = 3  # HA manager rounds a run's host is served for before it is compared


def _fingerprint(host: SimHost, case: Case, settle: bool = True) -> dict:
    """``applysim.fingerprint`` of the host, stopped; for HA guests after the HA manager settled
    (its queued requests carried out and ``SETTLE_ROUNDS`` rounds served, so that a request left
    behind moves its guest before the comparison), with each resource's requested state and the
    manager's state of it."""
    if not case.shape.ha:
        host.stop()
        return applysim.fingerprint(host)
    ha = _settle(host, case.shape.ha, SETTLE_ROUNDS if settle else 0)
    host.stop()
    return {**applysim.fingerprint(host), "ha": ha}


def _settle(host: SimHost, sids: tuple[str, ...], rounds: int) -> dict[str, tuple[str, str]]:
    """Serve the host for ``rounds`` of the HA manager and until no request is queued (at most
    ten rounds more); then sid -> (the requested state in resources.cfg, the manager's state)."""
    from gputopo.formats.hacfg import parse_section_config

    guests = {sid: ("lxc" if sid.startswith("ct:") else "qemu", int(sid[3:])) for sid in sids}
    if host.api is None:
        host.start()
    t0 = time.monotonic()
    while True:
        status = {sid: host.api.ha_status(*g).get("state", "") for sid, g in guests.items()}
        waited = time.monotonic() - t0
        queued = state.read_state(host.paths.run, "ha-requests", [])
        if waited >= rounds * HA_CRM and (not queued or waited >= (rounds + 10) * HA_CRM):
            break
        time.sleep(0.05)
    cfg = host.paths.pve / "ha/resources.cfg"
    requested = {s.sid: s.props.get("state", "started") for s in parse_section_config(cfg.read_text())}
    return {sid: (requested.get(sid, "-"), status[sid]) for sid in sids}


def _bind_last_address_first(h: SimHost) -> None:
    """Make the GPUs on vfio-pci bind to another driver one after another, the last address
    first (a longer bind latency for a lower one). Bound in parallel, the GPUs coming back to
    nvidia take the free minors in whatever order they happen to bind: in address order each
    takes its old one back, and Proxmox drops the pending devN values equal to the current ones
    (pve-guest-common AbstractConfig.pm cleanup_pending), so the container step and its undo
    make fewer calls, and a kill point counted on one run is not the same point on the next. In
    this order every devN's value differs and waits in [pve:pending] (the other order is
    tests/apply/test_live_rollback_pending.py's)."""
    vfio = h.paths.root / "sys/bus/pci/drivers/vfio-pci"
    gpus = sorted(p.name for p in vfio.iterdir() if p.name.startswith("0000:") and p.name.endswith(".0"))
    # 25, 50, 75, 100 s of the host's time: 0.25 .. 1 s at the tests' time scale, far apart
    # enough for a loaded machine's scheduling
    SimKernel(h.paths.root).configure(
        address_latency={a: {"bind": 25.0 * (i + 1)} for i, a in enumerate(reversed(gpus))}
    )


class Start:
    """The start host of one group of cases: the seed host of its Proxmox version with the shape's
    start spec applied, the spec to apply, and what a clean apply of it leaves."""

    def __init__(self, case: Case, base: Path):
        self.case = case
        sim = base / "sim"
        # the repoint shape starts with the container on two GPUs: a model that fits them
        model = SMALL_MODEL if case.shape.name == "reverse-vm-repoint" else SEED_MODEL
        h = SimHost.create(sim, pve_version=PVE[case.pve], model=model)
        SimKernel(h.paths.root).configure(time_scale=applysim.SCALE)
        _make_ha(h, case.shape.ha)
        # the start spec with restart ``always``: the container runs its configuration, no devN
        # removal pending (a rollback that restarts it applies those, and cannot put them back);
        # a live shape's with ``auto``: on PVE 9 the container keeps running, the removal pending
        restart = "auto" if case.shape.live else "always"
        start, _ = case.shape.specs(applysim.seed_spec_text(h), restart)
        _, target = case.shape.specs(applysim.seed_spec_text(h), case.restart)
        if start is not None:
            (sim / "start.yaml").write_text(start)
            res = _drive(h, "apply", "--spec", str(sim / "start.yaml"), "--yes", "--no-verify")
            assert res.returncode == 0, res.stderr
        if case.shape.live:
            conf = (h.paths.pve / "nodes" / h.node / "lxc/101.conf").read_text()
            pending = conf.split("[pve:pending]\n", 1)[-1]
            assert "delete: dev4,dev5,dev6,dev7" in pending, f"not a live split: {conf}"
            assert state.guest_status(h.paths.run, "lxc", 101) == "running"
            _bind_last_address_first(h)
        (sim / "spec.yaml").write_text(target)
        _pace(sim)
        if case.shape.ha:
            _settle(h, case.shape.ha, 1)
        h.stop()
        self.dir = sim
        host, tmp = self.copy("clean")
        try:
            res = _drive(host, *_apply_args(host))
            assert res.returncode == 0, res.stderr
            self.applied = _fingerprint(host, case)
        finally:
            _discard(host, tmp)

    def copy(self, tag: str) -> tuple[SimHost, Path]:
        tmp = Path(tempfile.mkdtemp(prefix=f"gputopo-crash-{tag}-", dir=applysim.fast_tmp()))
        return applysim.copy_host(self.dir, tmp / "sim"), tmp


def _discard(host: SimHost, tmp: Path) -> None:
    SimKernel(host.paths.root).clear_faults()  # lets any hung writer finish
    host.stop()
    applysim.cleanup(tmp)


@pytest.fixture(scope="session")
def starts():
    made: dict[str, Start] = {}
    bases: list[Path] = []

    def of(case: Case) -> Start:
        if case.group not in made:
            base = Path(tempfile.mkdtemp(prefix=f"gputopo-{case.group}-", dir=applysim.fast_tmp()))
            bases.append(base)
            made[case.group] = Start(case, base)
        return made[case.group]

    yield of
    for b in bases:
        applysim.cleanup(b)


# --- running gputopo in a process of its own ----------------------------------------------------


def _drive(host, *args: str, at: str | None = None, count: Path | None = None, env=None):
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    env.pop("GPUTOPO_CRASH_AT", None)
    if at:
        env["GPUTOPO_CRASH_AT"] = at
    if count:
        env["GPUTOPO_CRASH_COUNT"] = str(count)
    cmd = [sys.executable, str(DRIVER), *args, "--sim", str(host.dir)]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    except subprocess.TimeoutExpired as e:
        # the step it hung in: the end of what it printed, not the start pytest shows
        tail = (e.stdout or b"")[-1500:]
        text = tail.decode(errors="replace") if isinstance(tail, bytes) else tail
        raise AssertionError(
            f"{' '.join(args[:1])} at {at} did not end within 300 s; it printed last:\n{text}"
        ) from None


def _apply_args(host) -> list[str]:
    return ["apply", "--spec", str(host.dir / "spec.yaml"), "--yes", "--no-verify", "--timeout", "30"]


def _probe(host, *args: str, env=None) -> dict:
    out = host.dir.parent / "count.json"
    res = _drive(host, *args, count=out, env=env)
    data = json.loads(out.read_text()) if out.exists() else {"trace": []}
    data["rc"], data["stderr"] = res.returncode, res.stderr
    return data


def _points(trace: list, start_records: int = 0, start_calls: int = 0) -> list[str]:
    """Every kill point after the given counts: record:N and call:N."""
    records = sorted({r for _, r, _ in trace if r > start_records})
    calls = sorted({c for _, _, c in trace if c > start_calls})
    return [f"record:{n}" for n in records] + [f"call:{n}" for n in calls]


# --- a failure at one step ----------------------------------------------------------------------


def _api_fault(host, method: str, path: str, message: str) -> None:
    host.api.inject_api_fault(method, path, message)


def _fail(host: SimHost, a, steps: list) -> dict[str, str]:
    """Make step ``a`` of ``steps`` fail once; returns the environment the apply needs for it (the faults
    ``crashdriver.py`` injects). The host is served meanwhile: the faults are the API server's."""
    lock = "cfs-lock 'file-pci_mapping' error: got lock request timeout"
    kind = a.kind
    if kind in ("write_host_file", "remove_host_file"):
        return {"GPUTOPO_FAIL_FILE": a.path}
    if kind == "write_service_dropin":
        return {"GPUTOPO_FAIL_PUSH": a.path}
    if kind == "stop_service":
        return {"GPUTOPO_FAIL_STOP": a.unit}
    with host:
        if kind in ("set_mapping", "delete_mapping"):
            for method, path in (
                ("POST", r"/cluster/mapping/pci"),
                ("PUT", rf"/cluster/mapping/pci/{a.id}"),
                ("DELETE", rf"/cluster/mapping/pci/{a.id}"),
            ):
                _api_fault(host, method, path, lock)
        elif kind == "update_container":
            _api_fault(host, "PUT", rf"/nodes/[^/]+/lxc/{a.vmid}/config", "CT is locked (backup)")
        elif kind == "update_vm_config":
            for method in ("PUT", "POST"):
                _api_fault(host, method, rf"/nodes/[^/]+/qemu/{a.vmid}/config", "VM is locked (backup)")
        elif kind == "stop_guest":
            host.api.inject_fault(
                "vzshutdown" if a.guest == "lxc" else "qmshutdown",
                a.vmid,
                f"command 'lxc-stop -n {a.vmid} --nokill --timeout 60' failed: exit code 1"
                if a.guest == "lxc"
                else f"VM {a.vmid} qmp command 'system_powerdown' failed - got timeout",
            )
        elif kind == "start_guest":
            host.api.inject_fault(
                "vzstart" if a.guest == "lxc" else "qmstart", a.vmid, f"startup for '{a.vmid}' failed"
            )
        elif kind == "rebind":
            # the new driver's probe binds nothing once: the read-back must notice
            SimKernel(host.paths.root).inject(a.address, "bind", "noop", times=1)
        elif kind == "start_service":
            # the new configuration (the drop-in's tensor-parallel size) does not fit; the old one
            # starts again in the rollback
            tp = next(s.tp for s in steps if s.kind == "write_service_dropin" and s.vmid == a.vmid)
            break_container(
                host.dir, a.vmid, "service_fails", message="RuntimeError: CUDA error: out of memory", tp=tp
            )
        else:
            raise AssertionError(f"no way to make a {kind} step fail")
    return {}


def _heal(host: SimHost) -> None:
    """Whatever was left of an injected fault (one the run never reached)."""
    SimKernel(host.paths.root).clear_faults()
    heal_container(host.dir, 101)
    for name in ("api-faults", "task-faults"):
        state.write_state(host.paths.run, name, [])


def _steps(start: Start) -> list:
    host, tmp = start.copy("plan")
    try:
        spec = parse_spec((host.dir / "spec.yaml").read_text())
        _, _, p = read_and_plan(spec, host.ports(), str(host.paths.root))
        return list(p.actions)
    finally:
        _discard(host, tmp)


# --- the families ---------------------------------------------------------------------------------


def _failed_record(host) -> int:
    recs = parse_journal(list_journals(host.paths.root)[-1].read_text())
    return next(i for i, r in enumerate(recs, 1) if r.type == "failed")


class ProbeFailed(AssertionError):
    pass


def _probed(case: Case, probe: dict, rc: int, what: str) -> None:
    """A probe run (the one that counts the points) must end with ``rc``; one that does not is a
    run of the case that ended neither applied nor as before."""
    if probe["rc"] != rc:
        problem = f"{what} exited {probe['rc']}, not {rc}: {probe['stderr'].strip()[-300:]}"
        record(case, "probe", "other", problem)
        raise ProbeFailed(f"{case.id}: {problem}")


def _clean_probe(case: Case, start: Start) -> dict:
    """The trace of a clean apply on a copy of ``start`` (raises ProbeFailed when it fails)."""
    host, tmp = start.copy("probe")
    try:
        probe = _probe(host, *_apply_args(host))
    finally:
        _discard(host, tmp)
    _probed(case, probe, 0, "the clean apply")
    return probe


def _runs(case: Case, start: Start, n: int | None) -> tuple[list[str], object]:
    """(the points of ``case``, what to do at one point: host, point -> a short outcome)."""
    family = case.family
    if family == "kill-apply":
        probe = _clean_probe(case, start)
        points = _points(probe["trace"])
        assert len(points) > 20, points

        def kill(host, point):
            res = _drive(host, *_apply_args(host), at=point)
            assert res.returncode == -signal.SIGKILL, (point, res.stderr)
            return "killed"

        if case.shape.ha:
            # every point where an HA guest's start or stop was just queued for the HA manager
            queued = _guest_actions(probe["trace"])
            assert queued, f"{case.id}: no guest starts or stops in the apply"
            others = [p for p in points if p not in queued]
            return queued + sample(others, None if n is None else max(2, n - len(queued))), kill
        return sample(points, n), kill

    if family == "kill-rollback":
        steps = _steps(start)
        last = steps[-1]
        host, tmp = start.copy("probe")
        try:
            env = _fail(host, last, steps)
            probe = _probe(host, *_apply_args(host), env=env)
            _probed(case, probe, 1, f"the apply whose step {last.kind} failed")
            failed_at = _failed_record(host)
        finally:
            _discard(host, tmp)
        calls_then = next(c for what, r, c in probe["trace"] if what == "failed" and r == failed_at)
        points = _points(probe["trace"], failed_at, calls_then)
        assert len(points) > 5, points

        def kill(host, point):
            env = _fail(host, last, steps)
            res = _drive(host, *_apply_args(host), at=point, env=env)
            assert res.returncode == -signal.SIGKILL, (point, res.stderr)
            _heal(host)
            return f"step {last.kind} failed, killed in the rollback"

        return sample(points, n), kill

    if family == "kill-recover":
        host, tmp = start.copy("probe")
        try:
            probe = _probe(host, *_apply_args(host))
        finally:
            _discard(host, tmp)
        writes = [c for what, _, c in probe["trace"] if what == "SimKernel"]
        assert len(writes) > 2, probe["trace"]
        switch = f"call:{writes[1]}"  # mid-switch: some GPUs moved and others not

        def kill_apply(host):
            res = _drive(host, *_apply_args(host), at=switch)
            assert res.returncode == -signal.SIGKILL, res.stderr
            assert find_unfinished(host.paths.root) is not None

        host, tmp = start.copy("probe")
        try:
            kill_apply(host)
            probe = _probe(host, "recover")
        finally:
            _discard(host, tmp)
        _probed(case, probe, 0, "recover after a kill mid-switch")
        points = _points(probe["trace"])
        assert len(points) > 5, points

        def kill(host, point):
            kill_apply(host)
            res = _drive(host, "recover", at=point)
            # the apply was killed while its rebinds ran in parallel: how many had begun varies, and
            # so does the number of records its recover writes; one that ends before the point has
            # settled the host, which is judged like any other
            assert res.returncode in (-signal.SIGKILL, 0), (point, res.stderr)
            return "recover killed" if res.returncode else "recover ended before the point"

        return sample(points, n), kill

    if family == "signal-stop":
        return _signal_runs(case, start, n)

    if family == FINISH_FAMILY:
        return _finish_runs(case, start, n)

    assert family == "fail-step"
    steps = _steps(start)
    chosen = sample([str(i) for i in range(len(steps))], n)

    def fail(host, point):
        a = steps[int(point)]
        env = _fail(host, a, steps)
        res = _drive(host, *_apply_args(host), env=env)
        _heal(host)
        return f"step {int(point) + 1} ({a.kind}) failing: exit {res.returncode}"

    return chosen, fail


STOPPING = re.compile(r"^POST .*/status/(shutdown|stop)$")  # a guest's stop task accepted
GUEST_ACTION = re.compile(r"^POST .*/status/(shutdown|stop|start)$")


def _guest_actions(trace: list, what: re.Pattern = GUEST_ACTION) -> list[str]:
    """The kill points right after a guest's start, stop or shutdown task was accepted (``what``)."""
    return [f"call:{c}" for c in sorted({c for w, _, c in trace if what.match(w)})]


def _signal_runs(case: Case, start: Start, n: int | None) -> tuple[list[str], object]:
    """SIGTERM, SIGINT and SIGHUP in turn (``SIGNAL@POINT``) at every point where a guest's stop or
    shutdown task was accepted and not yet ended, and at an even sample of the other kill points
    of a clean apply (all of them when ``n`` is None)."""
    probe = _clean_probe(case, start)
    stops = _guest_actions(probe["trace"], STOPPING)
    assert stops, f"{case.id}: no guest stops in the apply: {probe['trace']}"
    others = [p for p in _points(probe["trace"]) if p not in stops]
    chosen = stops + sample(others, None if n is None else max(2, n - len(stops)))
    points = [f"{SIGNALS[i % len(SIGNALS)]}@{p}" for i, p in enumerate(chosen)]

    def signal_at(host, point):
        name, _, at = point.partition("@")
        res = _drive(host, *_apply_args(host), at=at, env={"GPUTOPO_CRASH_SIGNAL": name})
        code = SIGNAL_EXIT[name]
        last = (res.stderr.strip().splitlines() or [""])[-1]
        what = f"SIG{name}: exit {res.returncode}: {last[-200:]}"  # kept for a run that ends "other"
        if res.returncode not in (0, code):
            return what, f"exit {res.returncode}, not {code} or 0: {res.stderr.strip()[-300:]}", None
        return what, None, "applied" if res.returncode == 0 else "before"

    return points, signal_at


def _finish_runs(case: Case, start: Start, n: int | None) -> tuple[list[str], object]:
    """SIGKILL at the kill points of a clean apply, then ``recover --finish``: the apply is carried
    to its end (what a step began is ended first, an HA request settled), so every run ends
    applied with exit 0, whichever point the kill came at."""
    probe = _clean_probe(case, start)
    queued = _guest_actions(probe["trace"])
    others = [p for p in _points(probe["trace"]) if p not in queued]

    def finish(host, point):
        res = _drive(host, *_apply_args(host), at=point)
        assert res.returncode == -signal.SIGKILL, (point, res.stderr)
        if find_unfinished(host.paths.root) is None:
            return "killed after the journal's end", None, "applied"
        rec = _drive(host, "recover", "--finish")
        last = (rec.stderr.strip().splitlines() or [""])[-1]
        what = f"recover --finish: exit {rec.returncode}: {last[-200:]}"
        if rec.returncode != 0:
            return what, f"recover --finish exited {rec.returncode}: {rec.stderr.strip()[-300:]}", None
        return what, None, "applied"

    return queued + sample(others, None if n is None else max(2, n - len(queued))), finish


def _judge(case: Case, start: Start, point: str, act) -> str | None:
    """One run on a copy of the start host: act, recover while the journal is open, compare.

    ``act`` returns what happened, or (what happened, a problem or None, the outcome the run must
    have or None) where its exit status decides: a signalled apply must end rolled back with the
    signal's exit status, or applied with 0."""
    host, tmp = start.copy(case.family)
    try:
        before = _fingerprint(host, case, settle=False)
        ran = act(host, point)
        outcome, problem, expect = ran if isinstance(ran, tuple) else (ran, None, None)
        if problem is None and find_unfinished(host.paths.root) is not None:
            rec = _drive(host, "recover")
            if rec.returncode != 0:
                problem = f"recover exited {rec.returncode}: {rec.stderr.strip()[-300:]}"
        if problem is None and find_unfinished(host.paths.root) is not None:
            problem = "the journal is still open after recover"
        got = _fingerprint(host, case)
        difference = applysim.diff(before, got)
        ended = "applied" if got == start.applied else "before" if not difference else None
        if problem is None and ended is not None and expect in (None, ended):
            record(case, point, ended)
            return None
        if problem is None and ended is not None:
            problem = f"ended {ended}, not {expect}"
        if problem is None:
            problem = (
                f"neither applied nor as before: {difference[:4]}; "
                f"against applied: {applysim.diff(start.applied, got)[:4]}"
            )
        record(case, point, "other", f"{outcome}: {problem}")
        return f"{point} ({outcome}): {problem}"
    finally:
        _discard(host, tmp)


def _run(case: Case, starts, n: int | None) -> None:
    start = starts(case)
    points, act = _runs(case, start, n)
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        problems = [p for p in pool.map(lambda pt: _judge(case, start, pt, act), points) if p]
    assert not problems, f"{case.id}: {len(problems)} of {len(points)} runs\n" + "\n".join(problems)


QUICK = [c for c in CASES if c.shape.name == "split" and c.restart == "auto" and c.pve == "8"]


@pytest.mark.slow
@pytest.mark.parametrize("case", [_param(c, []) for c in QUICK])
def test_quick(case, starts):
    """Two points of each family on the split (the CI run and ``-m matrix`` run more)."""
    _run(case, starts, 2)


@pytest.mark.parametrize("case", [_param(c, [pytest.mark.matrix]) for c in CASES])
def test_sample(case, starts):
    _run(case, starts, SAMPLE)


@pytest.mark.parametrize("case", [_param(c, [pytest.mark.matrix_full], full=True) for c in CASES])
def test_every_point(case, starts):
    """Every point of the case: selected only when -m names matrix_full (tests/conftest.py)."""
    _run(case, starts, None)


@pytest.mark.matrix
@pytest.mark.parametrize("case", [_param(c, []) for c in QUICK if c.family == "kill-recover"])
def test_recover_finish_ends_byte_for_byte_like_a_clean_apply(case, starts):
    start = starts(case)
    host, tmp = start.copy("finish")
    try:
        probe = _probe(host, *_apply_args(host))
        writes = [c for what, _, c in probe["trace"] if what == "SimKernel"]
    finally:
        _discard(host, tmp)
    host, tmp = start.copy("finish")
    try:
        res = _drive(host, *_apply_args(host), at=f"call:{writes[1]}")  # mid-switch
        assert res.returncode == -signal.SIGKILL, res.stderr
        assert find_unfinished(host.paths.root) is not None
        res = _drive(host, "recover", "--finish")
        assert res.returncode == 0, res.stderr
        assert find_unfinished(host.paths.root) is None
        host.stop()
        assert applysim.diff(start.applied, applysim.fingerprint(host)) == []
    finally:
        _discard(host, tmp)
