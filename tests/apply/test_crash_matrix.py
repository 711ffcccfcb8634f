"""SIGKILL at every point of an apply, of its rollback and of a recover, then recover: every run
ends fully applied or identical to before, with the service running what its unit says.

Kill points are counted, not polled (``tests/helpers/crashdriver.py``): right after every journal record
reaches the disk and right after every call that changes the host. The simulated host runs at a
realistic pace where it matters for a rollback: the service stays ``activating`` for a second
after each start and the container takes most of a second to shut down. The apply and its
rollback run both with the container kept running (``container_restart: auto``) and with it
stopped and started again (``always``). What is compared is what runs (``applysim.fingerprint``): drivers and overrides,
the nvidia and vfio nodes, the Proxmox files, host and container files with their modes, the
service's real command line and the GPUs its processes hold, the container's view of /dev.

The matrix runs a few hundred short processes; it is marked ``matrix`` and runs with the whole
suite (``-m 'e2e or not e2e'``, as CI does), not with a plain ``pytest``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gputopo.apply.journal import find_unfinished, list_journals, parse_journal
from gputopo.sim import state
from gputopo.sim.container import break_container, heal_container
from gputopo.sim.kernel import SimKernel
from helpers import TESTS, applysim
from helpers.applysim import template  # noqa: F401 (fixtures)

pytestmark = pytest.mark.matrix

DRIVER = TESTS / "helpers" / "crashdriver.py"
WORKERS = 2


RESTARTS = ["auto", "always"]  # the container keeps running / stops and starts again


def _pace(host) -> None:
    """A real server's pace where the rollback logic depends on it: the service stays activating
    for a second after each start, and the container takes a while to shut down."""
    SimKernel(host.paths.root).configure(time_scale=applysim.SCALE)
    state.write_state(
        host.paths.run,
        "latencies",
        {"service.start": 1.0, "service.stop": 0.1, "vzstart": 0.3, "vzshutdown": 0.8},
    )


def _host(template, tag: str, restart: str = "auto"):
    base = Path(tempfile.mkdtemp(prefix=f"gputopo-crash-{tag}-", dir=applysim.fast_tmp()))
    h = applysim.copy_host(template, base / "sim")
    _pace(h)
    text = applysim.seed_spec_text(h)
    (h.dir / "spec.yaml").write_text(
        text.replace("policy:\n", f"policy:\n  container_restart: {restart}\n", 1)
    )
    return h, base


def _probe_copy(
    template, restart: str, args: list[str] | None, rc: int, setup=lambda h: None, inspect=lambda h: None
) -> tuple[dict, object]:
    """Count the kill points of ``gputopo ARGS`` (an apply by default) on a copy of the host after
    ``setup``; returns the counts and what ``inspect(host)`` says once it ended with ``rc``."""
    host, base = _host(template, "probe", restart)
    try:
        setup(host)
        probe = _probe(host, *(args or _apply_args(host)))
        assert probe["rc"] == rc, probe["stderr"]
        return probe, inspect(host)
    finally:
        host.stop()
        applysim.cleanup(base)


def _drive(host, *args: str, at: str | None = None, count: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("GPUTOPO_CRASH_AT", None)
    if at:
        env["GPUTOPO_CRASH_AT"] = at
    if count:
        env["GPUTOPO_CRASH_COUNT"] = str(count)
    cmd = [sys.executable, str(DRIVER), *args, "--sim", str(host.dir)]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


def _apply_args(host) -> list[str]:
    return ["apply", "--spec", str(host.dir / "spec.yaml"), "--yes", "--no-verify", "--timeout", "30"]


def _probe(host, *args: str) -> dict:
    out = host.dir.parent / "count.json"
    res = _drive(host, *args, count=out)
    data = json.loads(out.read_text())
    data["rc"], data["stderr"] = res.returncode, res.stderr
    return data


def _settle(host) -> subprocess.CompletedProcess:
    """``gputopo recover`` in a process of its own, as an operator runs it after a crash."""
    return _drive(host, "recover")


def _points(trace: list, start_records: int = 0, start_calls: int = 0) -> list[str]:
    """Every kill point after the given counts: record:N and call:N."""
    records = sorted({r for _, r, _ in trace if r > start_records})
    calls = sorted({c for _, _, c in trace if c > start_calls})
    return [f"record:{n}" for n in records] + [f"call:{n}" for n in calls]


def _check(tag, template, prepare, points, expect_applied_fp=None, restart: str = "auto"):
    """Run ``prepare(host)`` then kill/recover at each point in parallel; collect problems."""

    def one(point: str) -> str | None:
        host, base = _host(template, tag, restart)
        try:
            before = applysim.fingerprint(host)
            outcome = prepare(host, point)
            if find_unfinished(host.paths.root) is not None:
                rec = _settle(host)
                if rec.returncode != 0:
                    return f"{point}: recover exited {rec.returncode}: {rec.stderr.strip()[-300:]}"
            if find_unfinished(host.paths.root) is not None:
                return f"{point}: the journal is still open after recover"
            host.stop()
            got = applysim.fingerprint(host)
            if expect_applied_fp is not None and got == expect_applied_fp:
                return None
            diff = applysim.diff(before, got)
            if diff:
                return f"{point} ({outcome}): neither applied nor as before: {diff[:4]}"
            return None
        finally:
            SimKernel(host.paths.root).clear_faults()
            host.stop()
            applysim.cleanup(base)

    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        problems = [p for p in pool.map(one, points) if p]
    assert not problems, "\n".join(problems)


@pytest.fixture(scope="module")
def applied_fp(template):
    """restart -> the fingerprint of the seed host after a clean apply, at the same pace."""
    made: dict[str, dict] = {}

    def of(restart: str) -> dict:
        if restart not in made:
            host, base = _host(template, "clean", restart)
            try:
                res = _drive(host, *_apply_args(host))
                assert res.returncode == 0, res.stderr
                host.stop()
                made[restart] = applysim.fingerprint(host)
            finally:
                host.stop()
                applysim.cleanup(base)
        return made[restart]

    return of


@pytest.mark.parametrize("restart", RESTARTS)
def test_sigkill_at_every_point_of_an_apply(template, applied_fp, restart):
    probe, _ = _probe_copy(template, restart, None, 0)
    points = _points(probe["trace"])
    assert len(points) > 40, points

    def prepare(host, point):
        res = _drive(host, *_apply_args(host), at=point)
        assert res.returncode == -signal.SIGKILL, (point, res.stderr)
        return "killed"

    _check("apply", template, prepare, points, applied_fp(restart), restart)


@pytest.mark.parametrize("restart", RESTARTS)
def test_sigkill_at_every_point_of_a_rollback(template, restart):
    """The apply fails at its last step (the service cannot start), then is killed at every
    point of its rollback; recover finishes the rollback."""

    def failing(host):
        # the new configuration (tp 4) does not fit; the old one (tp 8) starts again in the rollback
        break_container(
            host.dir, 101, "service_fails", message="RuntimeError: CUDA error: out of memory", tp=4
        )

    def failed_record(host) -> int:
        recs = parse_journal(list_journals(host.paths.root)[-1].read_text())
        return next(i for i, r in enumerate(recs, 1) if r.type == "failed")

    probe, failed_at = _probe_copy(template, restart, None, 1, failing, failed_record)
    calls_then = next(c for what, r, c in probe["trace"] if what == "failed" and r == failed_at)
    points = _points(probe["trace"], failed_at, calls_then)
    assert len(points) > 15, points

    def prepare(host, point):
        failing(host)
        res = _drive(host, *_apply_args(host), at=point)
        assert res.returncode == -signal.SIGKILL, (point, res.stderr)
        heal_container(host.dir, 101, "service_fails")  # whatever was left of the fault
        return "killed in the rollback"

    _check("rollback", template, prepare, points, restart=restart)


@pytest.fixture(scope="module")
def switch_point(template) -> str:
    """The kill point right after the second sysfs write of a clean apply: mid-switch, some GPUs
    moved and others not (counted from a probe, not assumed from the plan's length)."""
    probe, _ = _probe_copy(template, "auto", None, 0)
    writes = [c for what, _, c in probe["trace"] if what == "SimKernel"]
    assert len(writes) > 2, probe["trace"]
    return f"call:{writes[1]}"


def _kill_apply_in_switch(host, point: str) -> None:
    res = _drive(host, *_apply_args(host), at=point)
    assert res.returncode == -signal.SIGKILL, res.stderr
    assert find_unfinished(host.paths.root) is not None


def test_sigkill_at_every_point_of_a_recover_then_recover_again(template, switch_point):
    """Double crashes: the apply is killed mid-switch, then its recover is killed at every point,
    then a second recover settles it."""
    probe, _ = _probe_copy(template, "auto", ["recover"], 0, lambda h: _kill_apply_in_switch(h, switch_point))
    points = _points(probe["trace"])
    assert len(points) > 15, points

    def prepare(host, point):
        _kill_apply_in_switch(host, switch_point)
        res = _drive(host, "recover", at=point)
        # the apply was killed while its rebinds ran in parallel: how many had begun varies, and
        # so does the number of records its recover writes; one that ends before the point has
        # settled the host, which the check below compares like any other
        assert res.returncode in (-signal.SIGKILL, 0), (point, res.stderr)
        return "recover killed" if res.returncode else "recover ended before the point"

    _check("recover", template, prepare, points)


def test_recover_finish_ends_byte_for_byte_like_a_clean_apply(template, applied_fp, switch_point):
    host, base = _host(template, "finish")
    try:
        _kill_apply_in_switch(host, switch_point)
        res = _drive(host, "recover", "--finish")
        assert res.returncode == 0, res.stderr
        assert find_unfinished(host.paths.root) is None
        host.stop()
        assert applysim.diff(applied_fp("auto"), applysim.fingerprint(host)) == []
    finally:
        host.stop()
        applysim.cleanup(base)
