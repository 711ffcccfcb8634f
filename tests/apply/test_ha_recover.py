"""SIGKILL an apply on a host whose guests are HA resources (CT 101 and VM 201, the consumer),
then recover through the real command line, while the simulated HA manager goes on working in
rounds and acts on its own (a resource requested ``started`` whose guest is stopped is started).

Judged: what runs (guests, drivers, the service's command line and GPUs: the fingerprint) and
``ha/resources.cfg``'s requested states, right after recover reported AND after the HA manager
ran several more rounds, so that a request left behind shows."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from gputopo.apply.journal import find_unfinished, list_journals, parse_journal
from gputopo.facts.discover import discover
from gputopo.plan.starter import init_spec
from gputopo.sim import state
from helpers import applysim
from helpers.applysim import template  # noqa: F401 (fixtures)

# how the crash driver names a Proxmox call that changes something in its trace ("POST /nodes/...")
API_METHODS = ("POST", "PUT", "DELETE")

pytestmark = pytest.mark.slow

DRIVER = Path(__file__).resolve().parents[1] / "helpers" / "crashdriver.py"
CRM = 1.0  # the HA manager's delay (s): takes a request after half of it, moves the guest after all
ROUNDS = 4  # how many of its rounds the test lets pass after gputopo reported


def _drive(host, *args: str, at: str | None = None, count: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("GPUTOPO_CRASH_AT", None)
    if at:
        env["GPUTOPO_CRASH_AT"] = at
    if count:
        env["GPUTOPO_CRASH_COUNT"] = str(count)
    return subprocess.run(
        [sys.executable, str(DRIVER), *args, "--sim", str(host.dir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def _ha_host(template, base: Path, crm: float = CRM):
    h = applysim.copy_host(template, base / "sim")
    h.make_ha_managed("ct:101")  # running: requested 'started'
    h.make_ha_managed("vm:201")  # stopped: requested 'stopped'
    state.write_state(h.paths.run, "latencies", {"ha.crm": crm})
    spec = h.dir / "spec.yaml"
    text = init_spec(discover(str(h.paths.root)), container_mapping="pro6000", vm=201)
    spec.write_text(applysim.restarting(text))
    return h, ["apply", "--spec", str(spec), "--yes", "--no-verify", "--timeout", "30"]


def _kill_point(template, pick, crm: float = CRM) -> str:
    """``call:N`` of the first Proxmox call (a POST or PUT) after the journal record ``pick``
    chooses (a step's ``begin``), in a clean run's trace."""
    base = Path(tempfile.mkdtemp(prefix="gputopo-hatrace-", dir=applysim.fast_tmp()))
    h, args = _ha_host(template, base, crm)
    try:
        out = base / "count.json"
        res = _drive(h, *args, count=out)
        assert res.returncode == 0, res.stderr
        records = parse_journal(list_journals(h.paths.root)[-1].read_text())
        n = next(i for i, r in enumerate(records, 1) if pick(r))
        trace = json.loads(out.read_text())["trace"]
        after = [t for t in trace if t[1] >= n and t[0].split(" ", 1)[0] in API_METHODS and t[2] > 0]
        return f"call:{after[0][2]}"
    finally:
        h.stop()
        applysim.cleanup(base)


def _let_the_crm_run(host, crm: float = CRM, rounds: int = ROUNDS) -> None:
    """Serve the host's API and read guest states for ``rounds`` times the HA manager's delay: it
    carries out what is queued and starts what is requested 'started' on its own."""
    ports = host.ports()
    deadline = time.monotonic() + rounds * crm
    while time.monotonic() < deadline:
        ports.proxmox.guest_status("qemu", 201)
        time.sleep(0.1)
    host.stop()


def _requested(host) -> str:
    return (host.paths.pve / "ha/resources.cfg").read_text()


@pytest.fixture
def base():
    b = Path(tempfile.mkdtemp(prefix="gputopo-harec-", dir=applysim.fast_tmp()))
    yield b
    applysim.cleanup(b)


def _is_start_of_vm(r) -> bool:
    return r.type == "begin" and r.action.kind == "start_guest" and r.action.vmid == 201


@pytest.mark.parametrize("late", [False, True], ids=["at-once", "after-the-vm-started"])
def test_recover_after_a_kill_right_after_the_ha_start_of_the_vm_takes_the_request_back(template, base, late):
    """The hastart of VM 201 only wrote 'state started'; the HA manager starts the VM a moment
    later, on the GPUs recover gives back to nvidia. Recover takes the request back (requested
    'stopped' again, as before) and waits until the manager settled (a VM it had started
    meanwhile stopped again) before any GPU moves: exit 0, the host as before, and the manager,
    left to run, starts nothing."""
    at = _kill_point(template, _is_start_of_vm)
    h, args = _ha_host(template, base)
    before = applysim.fingerprint(h)
    requested_before = _requested(h)
    assert "vm: 201\n\tstate stopped\n" in requested_before
    res = _drive(h, *args, at=at)
    assert res.returncode == -signal.SIGKILL, res.stderr
    if late:  # the node's HA manager went on: the VM runs on the vfio-pci GPUs when recover starts
        _let_the_crm_run(h, rounds=2)
        assert state.guest_status(h.paths.run, "qemu", 201) == "running"
    tasks = (state.read_state(h.paths.run, "tasks", {}) or {}).values()
    assert [t for t in tasks if t["vmid"] in (201, "201") and t["action"] == "hastart"], (
        "killed after the hastart"
    )
    rec = _drive(h, "recover")
    assert rec.returncode == 0, rec.stdout + rec.stderr
    assert find_unfinished(h.paths.root) is None
    assert applysim.diff(before, applysim.fingerprint(h)) == []
    assert _requested(h) == requested_before
    _let_the_crm_run(h)
    assert state.guest_status(h.paths.run, "qemu", 201) == "stopped"
    assert applysim.diff(before, applysim.fingerprint(h)) == []
    assert _requested(h) == requested_before


def _is_stop_of_ct(r) -> bool:
    return r.type == "begin" and r.action.kind == "stop_guest" and r.action.vmid == 101


def test_recover_finish_while_the_first_ha_stop_is_under_way_queues_no_late_stop(template, base):
    """The hastop of CT 101 queued 'stop ct:101'; ``--finish`` comes after the HA manager took
    it (requested 'stopped' written) and before the container stopped. Another stop queued then
    would be taken a round later, after --finish's start, and write 'stopped' under the running
    container. --finish waits for the stop under way instead: it ends with both guests running
    and 'started' requested, for good."""
    crm = 16.0  # takes a request after 8 s, the container stops after 16 s
    at = _kill_point(template, _is_stop_of_ct)
    h, args = _ha_host(template, base, crm)
    res = _drive(h, *args, at=at)
    killed = time.monotonic()
    assert res.returncode == -signal.SIGKILL, res.stderr
    time.sleep(max(0.0, killed + 8.3 - time.monotonic()))  # --finish reads 10-15 s after the stop
    rec = _drive(h, "recover", "--finish", "--timeout", "guest=40")
    assert rec.returncode == 0, rec.stdout + rec.stderr
    assert find_unfinished(h.paths.root) is None
    after = applysim.fingerprint(h)
    assert after["guests"]["lxc"]["101"] == "running" and after["guests"]["qemu"]["201"] == "running"
    assert after["service"][0] == "active"
    assert _requested(h) == "ct: 101\n\tstate started\n\nvm: 201\n\tstate started\n\n"
    _let_the_crm_run(h, crm, rounds=3)
    assert applysim.diff(after, applysim.fingerprint(h)) == []
    assert _requested(h) == "ct: 101\n\tstate started\n\nvm: 201\n\tstate started\n\n"
