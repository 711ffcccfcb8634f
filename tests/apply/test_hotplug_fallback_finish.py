"""``recover --finish`` after a kill inside the PVE 9 hot-plug fallback (``policy.hotplug_failure:
restart``): Proxmox refused the hot-plug, the step stopped the container to make the change, and
the process died before it started it again. The journal says the step stopped the container, so
finishing ends what the step began (the change made, the container started) and then the rest:
exit 0, history "applied", the host byte for byte as a clean apply leaves it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from gputopo.apply.journal import find_unfinished, list_journals, parse_journal
from gputopo.plan.spec import parse_spec
from gputopo.sim import state
from gputopo.sim.host import SimHost
from gputopo.sim.kernel import SimKernel
from gputopo.sim.pveapi.guest_config import add_hotplug_fault
from gputopo.usecases.apply import apply
from helpers import TESTS, applysim

pytestmark = pytest.mark.slow  # applies on simulated hosts (seconds each)

DRIVER = TESTS / "helpers" / "crashdriver.py"


def _drive(h: SimHost, *args: str, at: str = "", count: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "GPUTOPO_CRASH_AT": at}
    if count is not None:
        env["GPUTOPO_CRASH_COUNT"] = str(count)
    return subprocess.run(
        [sys.executable, str(DRIVER), *args, "--sim", str(h.dir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


@pytest.fixture(scope="module")
def grown(tmp_path_factory):
    """A PVE 9 host split with ``always`` (CT 101 restarted on its NUMA-0 GPUs), every devN
    hot-plug into CT 101 failing (``sim break hotplug-fails``), the grow's spec beside it; and
    the fingerprint a clean apply of that grow ends with."""
    base = Path(tempfile.mkdtemp(prefix="gputopo-fallback-", dir=applysim.fast_tmp()))
    h = SimHost.create(base / "sim", pve_version="9.1.2")
    SimKernel(h.paths.root).configure(time_scale=applysim.SCALE)
    text = applysim.seed_spec_text(h)
    res = apply(
        parse_spec(applysim.restarting(text)),
        h.ports(),
        root=str(h.paths.root),
        timeouts=applysim.FAST_TIMEOUTS,
    )
    assert res.status == "applied"
    h.stop()
    add_hotplug_fault(h.paths.run, 101, count=None)
    (base / "grow.yaml").write_text(applysim.reverse(text))
    clean = applysim.copy_host(h.dir, base / "clean")
    res = _drive(clean, "apply", "--spec", str(base / "grow.yaml"), "--yes", count=base / "count.json")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "could not hot-plug" in res.stdout + res.stderr
    clean.stop()
    trace = json.loads((base / "count.json").read_text())["trace"]
    recs = parse_journal(list_journals(clean.paths.root)[-1].read_text())
    begin = 1 + next(
        n for n, r in enumerate(recs) if r.type == "begin" and r.action.kind == "update_container"
    )
    calls = sorted({c for _, r, c in trace if r >= begin})
    first = min(c for _, r, c in trace if r == begin)
    # the failed PUT is no change (not counted): the step's first counted call is the fallback's
    # shutdown, then the PUT of the change on the stopped container, then its start
    fallback = [c for c in calls if c > first][:3]
    yield h, base, applysim.fingerprint(clean), fallback
    applysim.cleanup(base)


def _stopped(h: SimHost) -> None:
    """Wait for the shutdown task the killed process started: the task is the node's and goes on
    without the process that asked for it (the simulator carries a task out when its status is
    read once it is due)."""
    tasks = state.read_state(h.paths.run, "tasks", {})
    upid = next(u for u, t in tasks.items() if t["action"] == "shutdown" and t["status"] == "running")
    px = h.ports().proxmox
    px.wait_task(upid, 30)
    assert px.guest_status("lxc", 101) == "stopped"
    h.stop()


@pytest.mark.parametrize("where", ["after the shutdown", "before the start"])
def test_finish_after_a_kill_inside_the_fallback_ends_like_a_clean_apply(grown, where, tmp_path):
    template, base, clean, fallback = grown
    h = applysim.copy_host(template.dir, tmp_path / "sim")
    try:
        point = fallback[0] if where == "after the shutdown" else fallback[1]
        res = _drive(h, "apply", "--spec", str(base / "grow.yaml"), "--yes", at=f"call:{point}")
        assert res.returncode == -signal.SIGKILL, res.stdout + res.stderr
        assert find_unfinished(h.paths.root) is not None
        notes = [r for r in parse_journal(list_journals(h.paths.root)[-1].read_text()) if r.type == "note"]
        assert [n.what for n in notes] == ["fallback: container stopped by this step"]
        if where == "after the shutdown":
            _stopped(h)
        res = _drive(h, "recover", "--finish")
        assert res.returncode == 0, res.stdout + res.stderr
        assert "finished" in res.stdout + res.stderr
        assert find_unfinished(h.paths.root) is None
        last = parse_journal(list_journals(h.paths.root)[-1].read_text())[-1]
        assert last.type == "end" and last.result == "applied"
        h.stop()
        assert applysim.diff(clean, applysim.fingerprint(h)) == []
    finally:
        h.stop()
