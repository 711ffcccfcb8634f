"""Apply on a simulated host whose container is an HA resource (``ct: 101`` in
``ha/resources.cfg``): its stop and start are ``hastop``/``hastart`` tasks that end OK before the
HA manager moves it, and the manager writes the requested state back.

What runs is judged: the container's state at the moment each GPU is unbound (read from the
simulator's run state by a sysfs port that wraps the real one), the container running again,
and ``ha/resources.cfg``'s bytes after a rollback."""

from __future__ import annotations

import dataclasses
import tempfile
import time
from pathlib import Path

import pytest

from gputopo.errors import ApplyFailed
from gputopo.plan.spec import parse_spec
from gputopo.sim import state
from gputopo.sim.host import SimHost
from gputopo.sim.kernel import SimKernel
from gputopo.usecases.apply import apply
from gputopo.usecases.readplan import read_and_plan
from helpers import applysim
from helpers.applysim import template  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow  # every test applies on a simulated host (seconds each); the full run only

HA_STARTED = "ct: 101\n\tstate started\n\n"  # SectionConfig write_config ends every section with a blank line


@pytest.fixture
def ha_host(template):
    base = Path(tempfile.mkdtemp(prefix="gputopo-ha-", dir=applysim.fast_tmp()))
    h = applysim.copy_host(template, base / "sim")
    h.make_ha_managed("ct:101")
    # the HA manager takes a request after half a second and moves the guest after one
    state.write_state(h.paths.run, "latencies", {"ha.crm": 1.0})
    yield h
    SimKernel(h.paths.root).clear_faults()
    h.stop()
    applysim.cleanup(base)


class WatchedSysfs:
    """The real sysfs port; each write to a driver's ``unbind`` first records whether CT 101
    runs at that moment (the simulator's own record of its guests)."""

    def __init__(self, inner, run_dir: Path):
        self.inner, self.run_dir, self.seen = inner, run_dir, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def write(self, path: str, value: str) -> None:
        if path.endswith("/unbind"):
            self.seen.append((value.strip(), state.guest_status(self.run_dir, "lxc", 101)))
        self.inner.write(path, value)


def _ports(host):
    ports = host.ports()
    watched = WatchedSysfs(ports.sysfs, host.paths.run)
    return dataclasses.replace(ports, sysfs=watched), watched


def _spec(host):
    return parse_spec(applysim.restarting(applysim.seed_spec_text(host)))


def test_the_gpus_move_only_once_the_ha_managed_container_is_really_stopped(ha_host):
    ports, watched = _ports(ha_host)
    res = apply(_spec(ha_host), ports, root=str(ha_host.paths.root), timeouts=applysim.FAST_TIMEOUTS)
    assert res.status == "applied"
    assert watched.seen, "the plan unbinds GPUs"
    # the hastop task ended OK a second before the HA manager stopped CT 101: not one GPU was
    # unbound while it still ran
    assert [a for a, st in watched.seen if st == "running"] == []
    # hastart: the container runs again, its service on the GPUs it kept, HA asks for it started
    fp = applysim.fingerprint(ha_host)
    assert fp["guests"]["lxc"]["101"] == "running"
    assert fp["service"][0] == "active"
    assert (ha_host.paths.pve / "ha/resources.cfg").read_text() == HA_STARTED


def test_the_plan_says_the_container_is_ha_managed(ha_host):
    _, current, plan = read_and_plan(_spec(ha_host), ha_host.ports(), root=str(ha_host.paths.root))
    assert current.containers[101].ha is not None
    assert current.containers[101].ha.requested == "started"
    assert current.containers[101].ha.state == "started"
    lines = [w for w in plan.warnings if "CT 101 is HA-managed" in w]
    assert len(lines) == 2 and "(ct:101, requested state started)" in lines[0]
    assert "shuts it down without force, so policy.force_stop does not apply to it" in lines[1]


def test_the_plan_promises_no_forced_stop_of_an_ha_container(ha_host):
    """policy.force_stop reaches a container's shutdown only where Proxmox passes it: not for an HA
    resource (pve-container API2/LXC/Status.pm l.364-375); the stop step says so by not offering it."""
    text = applysim.restarting(applysim.seed_spec_text(ha_host))
    assert "  force_stop: false\n" in text
    spec = parse_spec(text.replace("  force_stop: false\n", "  force_stop: true\n", 1))
    _, _, plan = read_and_plan(spec, ha_host.ports(), root=str(ha_host.paths.root))
    stops = [a for a in plan.actions if a.kind == "stop_guest" and a.vmid == 101]
    assert len(stops) == 1 and stops[0].force_stop is False
    assert stops[0].describe() == "stop CT 101"


def test_a_rollback_after_the_ha_stop_starts_the_container_and_asks_ha_for_started_again(ha_host):
    before = applysim.fingerprint(ha_host)
    # the vfio-pci bind of the first GPU of NUMA 1 fails: the apply rolls back after the stop
    SimKernel(ha_host.paths.root).inject("0000:81:00.0", "bind", "errno", times=1)
    ports, watched = _ports(ha_host)
    with pytest.raises(ApplyFailed):
        apply(_spec(ha_host), ports, root=str(ha_host.paths.root), timeouts=applysim.FAST_TIMEOUTS)
    assert [a for a, st in watched.seen if st == "running"] == []
    # the HA manager had written 'state stopped'; the rollback's start put 'started' back, and the
    # container runs with its service as before, byte for byte
    assert (ha_host.paths.pve / "ha/resources.cfg").read_text() == HA_STARTED
    assert applysim.diff(before, applysim.fingerprint(ha_host)) == []


def test_a_start_the_ha_manager_does_not_finish_in_time_fails_the_step_naming_it_and_rolls_back(ha_host):
    """The start's undo takes the request back ('stopped' again, the container stopped) before
    any GPU moves back, so the HA manager cannot start the container on the new configuration
    meanwhile; the rollback's own start then waits as long as the failed one did, so with the
    same limit it is left to ``recover``, which ends with the host as before."""
    from gputopo.apply.recovery import recover

    before = applysim.fingerprint(ha_host)
    # the manager moves the container 3 s after each request; a start may take 2 s (a shutdown
    # waits at least its own timeout and more: the stop still succeeds)
    state.write_state(ha_host.paths.run, "latencies", {"ha.crm": 3.0})
    timeouts = dataclasses.replace(applysim.FAST_TIMEOUTS, guest=2.0)
    with pytest.raises(ApplyFailed) as e:
        apply(_spec(ha_host), ha_host.ports(), root=str(ha_host.paths.root), timeouts=timeouts)
    assert (
        "(start CT 101): CT 101 start: its task ended OK but CT 101 is still stopped (an HA resource"
        in str(e.value)
    )
    # the GPUs went back while the container stayed stopped; its start (asked again, 'started')
    # was carried out by the manager before the rollback reported, too late for its own wait
    assert "NOT fully rolled back (undo of step(s) 5, 7 not complete; undo 7: CT 101 start:" in str(e.value)
    assert state.guest_status(ha_host.paths.run, "lxc", 101) == "running"
    assert (ha_host.paths.pve / "ha/resources.cfg").read_text() == HA_STARTED
    now = applysim.fingerprint(ha_host)
    assert {k: v for k, v in now.items() if k.startswith("pci:")} == {
        k: v for k, v in before.items() if k.startswith("pci:")
    }
    res = recover(ha_host.ports(), root=str(ha_host.paths.root), timeouts=applysim.FAST_TIMEOUTS)
    assert res.status == "recovered"
    assert applysim.diff(before, applysim.fingerprint(ha_host)) == []
    assert (ha_host.paths.pve / "ha/resources.cfg").read_text() == HA_STARTED


def test_a_stop_undone_before_the_ha_manager_stopped_the_guest_sets_the_requested_state_back(ha_host):
    """An apply that ends (a failed wait, a kill and recover) after the HA manager took the stop
    but before it stopped the container: the undo finds it running with 'state stopped' in
    resources.cfg, which would stop it for good; it sets 'started' back."""
    from gputopo.actions import StopGuest
    from gputopo.apply.progress import Progress
    from gputopo.apply.runner import step_context

    state.write_state(ha_host.paths.run, "latencies", {"ha.crm": 2.0})
    ports = ha_host.ports()
    ctx = step_context(ports, str(ha_host.paths.root), applysim.FAST_TIMEOUTS, Progress())
    step = StopGuest(guest="lxc", vmid=101)
    before = step.before(ctx)
    assert before.status == "running" and before.ha_requested == "started"
    ports.proxmox.guest_action("lxc", 101, "shutdown", 10)  # a hastop: OK at once
    cfg = ha_host.paths.pve / "ha/resources.cfg"
    for _ in range(50):  # the manager takes it after 1 s and writes the requested state
        if "state stopped" in cfg.read_text():
            break
        time.sleep(0.05)
    assert cfg.read_text() == "ct: 101\n\tstate stopped\n\n"
    assert state.guest_status(ha_host.paths.run, "lxc", 101) == "running"
    assert step.undo(before, ctx) == "set HA resource ct:101 back to state started"
    assert cfg.read_text() == HA_STARTED
    # the manager still stops it (it had taken the stop), then starts it again, as asked
    for _ in range(100):
        if not state.read_state(ha_host.paths.run, "ha-requests", []) and (
            state.guest_status(ha_host.paths.run, "lxc", 101) == "running"
        ):
            break
        time.sleep(0.1)
    assert state.guest_status(ha_host.paths.run, "lxc", 101) == "running"
    assert cfg.read_text() == HA_STARTED


def test_the_switch_refuses_while_a_guest_the_plan_stopped_still_runs(ha_host):
    """The rebind step checks the running state itself: a guest of the plan's stops that still
    runs (whatever its stop task said) leaves every GPU where it is."""
    from gputopo.actions import Rebind
    from gputopo.apply.progress import Progress
    from gputopo.apply.runner import step_context

    before = applysim.fingerprint(ha_host)
    ctx = step_context(ha_host.ports(), str(ha_host.paths.root), applysim.FAST_TIMEOUTS, Progress())
    ctx.stopped_guests = {("lxc", 101)}
    step = Rebind(
        address="0000:81:00.0",
        members=["0000:81:00.0"],
        from_drivers={"0000:81:00.0": "nvidia"},
        to_driver="vfio-pci",
    )
    with pytest.raises(Exception, match="CT 101 still running although the plan stopped it"):
        step.do(ctx)
    assert applysim.diff(before, applysim.fingerprint(ha_host)) == []


def test_preflight_refuses_a_container_in_the_ha_managers_error_state(ha_host):
    """The manager neither stops nor starts a service in 'error' (Manager.pm next_state_error):
    apply would wait out its timeout with the container running; preflight refuses, naming the
    fix, and nothing changes."""
    from gputopo.errors import PreflightFailed

    state.write_state(ha_host.paths.run, "ha-service-states", {"ct:101": "error"})
    before = applysim.fingerprint(ha_host)
    with pytest.raises(PreflightFailed) as e:
        apply(_spec(ha_host), ha_host.ports(), root=str(ha_host.paths.root), timeouts=applysim.FAST_TIMEOUTS)
    text = str(e.value)
    assert "CT 101 is HA-managed (ct:101) and in the HA manager's error state" in text
    assert text.count("HA manager's error state") == 1
    assert "ha-manager set ct:101 --state disabled" in text
    assert applysim.diff(before, applysim.fingerprint(ha_host)) == []


def test_an_ha_managed_vm_the_plan_starts_runs_when_apply_returns(ha_host):
    """The VM side: VM 201 is an HA resource asked to stay stopped; the plan gives it the NUMA-1
    GPUs and starts it. Its start is a hastart ('ha-manager set vm:201 --state started'), the
    VM runs a second later: apply returns only once it does."""
    from gputopo.facts.discover import discover
    from gputopo.plan.starter import init_spec

    ha_host.make_ha_managed("vm:201", "stopped")
    spec = parse_spec(init_spec(discover(str(ha_host.paths.root)), container_mapping="pro6000", vm=201))
    res = apply(spec, ha_host.ports(), root=str(ha_host.paths.root), timeouts=applysim.FAST_TIMEOUTS)
    assert res.status == "applied"
    assert state.guest_status(ha_host.paths.run, "qemu", 201) == "running"
    assert [
        w for w in res.plan.warnings if w.startswith("VM 201 is HA-managed (vm:201, requested state stopped)")
    ]
    assert (ha_host.paths.pve / "ha/resources.cfg").read_text() == HA_STARTED + "vm: 201\n\tstate started\n\n"


def test_plan_commands_set_the_requested_ha_state_back_in_the_undo(ha_host, tmp_path, capsys):
    """What ``plan --commands`` prints for the undo of an HA-managed container's stop: its start
    and ``ha-manager set ct:101 --state started``, as the rollback does through the API."""
    from helpers.cli import run

    spec = tmp_path / "spec.yaml"
    spec.write_text(applysim.restarting(applysim.seed_spec_text(ha_host)))
    code, out, err = run(capsys, "plan", "--sim", str(ha_host.dir), "--spec", str(spec), "--commands")
    assert code == 0, err
    forward, undo = out.split("\n# undo", 1) if "\n# undo" in out else (out, "")
    assert "pct shutdown 101" in forward and "ha-manager" not in forward, out
    assert "pct start 101" in undo and "ha-manager set ct:101 --state started" in undo, out


def test_an_ha_container_that_outlasts_its_shutdown_stops_apply_with_the_way_out(ha_host, tmp_path, capsys):
    """The HA manager shuts an HA container down without force (pve-ha-manager PVECT.pm
    l.85-105), whatever policy.force_stop says; one that outlasts the timeout puts ct:101 in the
    manager's error state while it keeps running (Manager.pm l.1199-1217), and every
    'ha-manager set' then dies. The plan says so; apply ends exit 3 with one line naming the way
    out, and no GPU was moved under the running container."""
    from helpers.cli import run

    # one of Proxmox's seconds lasts 10 ms: CT 101 needs 5 s, more than 2 x 60 + 5 of them
    state.write_state(ha_host.paths.run, "latencies", {"ha.crm": 1.0, "second": 0.01, "vzshutdown:101": 5.0})
    spec = tmp_path / "spec.yaml"
    text = applysim.restarting(applysim.seed_spec_text(ha_host))
    assert "  force_stop: false\n" in text
    spec.write_text(text.replace("  force_stop: false\n", "  force_stop: true\n", 1))
    before = applysim.fingerprint(ha_host)
    code, out, err = run(capsys, "plan", "--sim", str(ha_host.dir), "--spec", str(spec))
    assert code == 0, err
    assert "CT 101 is HA-managed (ct:101): the HA manager shuts it down without force, so " in out + err
    assert "policy.force_stop does not apply to it" in out + err
    code, out, err = run(capsys, "apply", "--sim", str(ha_host.dir), "--spec", str(spec), "--yes")
    assert code == 3, out + err
    line = (
        "CT 101 did not shut down within 60 s and the HA manager put ct:101 in its error state; it still "
        "runs (an HA container's stop has no force: policy.force_stop does not apply): stop what keeps it "
        "up, run 'ha-manager set ct:101 --state disabled', then 'ha-manager set ct:101 --state started', "
        "then 'gputopo recover'"
    )
    assert line in err, err
    assert state.guest_status(ha_host.paths.run, "lxc", 101) == "running"
    after = applysim.fingerprint(ha_host)
    assert [k for k in applysim.diff(before, after) if k.startswith("pci:")] == []
    assert after["service"] == before["service"]


@pytest.fixture
def ha_pve9():
    base = Path(tempfile.mkdtemp(prefix="gputopo-ha9-", dir=applysim.fast_tmp()))
    h = SimHost.create(base / "sim", pve_version="9.1.2")
    SimKernel(h.paths.root).configure(time_scale=applysim.SCALE)
    h.make_ha_managed("ct:101")
    state.write_state(h.paths.run, "latencies", {"ha.crm": 1.0})
    yield h
    h.stop()
    applysim.cleanup(base)


def test_the_hotplug_fallback_of_an_ha_container_is_not_forced_either(ha_pve9):
    """The restart a refused hot-plug falls back to (PVE 9, a container that gains GPUs live) is
    a shutdown through the HA manager too: it carries no force for an HA container, whatever
    policy.force_stop says."""
    h = ha_pve9
    text = applysim.seed_spec_text(h)  # container_restart auto: the split keeps CT 101 running
    res = apply(parse_spec(text), h.ports(), root=str(h.paths.root), timeouts=applysim.FAST_TIMEOUTS)
    assert res.status == "applied"
    back = applysim.reverse(text)
    assert "  force_stop: false\n" in back
    spec = parse_spec(back.replace("  force_stop: false\n", "  force_stop: true\n", 1))
    _, _, plan = read_and_plan(spec, h.ports(), root=str(h.paths.root))
    updates = [a for a in plan.actions if a.kind == "update_container" and a.vmid == 101]
    assert len(updates) == 1 and updates[0].live, [a.describe() for a in plan.actions]
    assert updates[0].fallback is not None and updates[0].fallback.force_stop is False
