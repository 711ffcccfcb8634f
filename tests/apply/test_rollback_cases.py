"""Rollbacks where a real node is less kind than a quick simulator: a service that is still
``activating`` when the rollback looks at it, a rollback held by a hung write, signals during a
rollback, a failure before anything stopped. Each compares what runs (applysim.fingerprint), not
only the files that describe it.
"""

from __future__ import annotations

import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from gputopo.apply import Progress, Timeouts
from gputopo.apply.journal import Begin, Journal, find_unfinished, list_journals
from gputopo.errors import ApplyFailed, UnfinishedApply
from gputopo.sim import state
from gputopo.sim.container import SimExec, break_container
from gputopo.sim.kernel import SimKernel
from gputopo.usecases.apply import apply
from helpers import applysim
from helpers.applysim import template  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow  # every test applies on a simulated host (seconds each); the full run only

T = applysim.FAST_TIMEOUTS


@pytest.fixture
def host(template):
    base = Path(tempfile.mkdtemp(prefix="gputopo-rb-", dir=applysim.fast_tmp()))
    h = applysim.copy_host(template, base / "sim")
    # the service stays activating for a while after every start, as a real one loading a model
    state.write_state(h.paths.run, "latencies", {"service.start": 0.5})
    yield h
    SimKernel(h.paths.root).clear_faults()
    h.stop()
    applysim.cleanup(base)


def _started(h) -> int:
    """When the service last became active (a restart changes it)."""
    from gputopo.sim.container import SimExec

    out = (
        SimExec(h.dir)
        .run(101, ["systemctl", "show", "-p", "ActiveEnterTimestampMonotonic", "sglang.service"], timeout=5)
        .stdout
    )
    return int(out.strip().split("=", 1)[1])


def _restarting_spec(host):
    """The seed split with ``container_restart: always``: the container stops and starts."""
    from gputopo.plan.spec import parse_spec

    return parse_spec(applysim.restarting(applysim.seed_spec_text(host)))


def test_a_service_that_came_back_activating_with_the_new_dropin_is_restarted(host):
    """The last step fails; the rollback starts the container again before it puts the old
    drop-in back, so the unit starts with the new one (tp 4 on 4 of 8 GPUs) and is still
    activating. The rollback must notice what runs and restart it with the old configuration."""
    spec = _restarting_spec(host)
    before = applysim.fingerprint(host)
    # a model that loads for seconds: the unit is still activating when the rollback looks at it
    # (the outcome is checked, not the timing: on a slower machine it may be active by then)
    state.write_state(host.paths.run, "latencies", {"service.start": 3.0})
    # the new configuration fails only at its explicit start: the container's boot came first
    break_container(
        host.dir, 101, "service_fails", message="RuntimeError: CUDA error: out of memory", count=2
    )
    with pytest.raises(ApplyFailed) as e:
        apply(spec, host.ports(), root=str(host.paths.root), timeouts=T)
    assert e.value.rolled_back and "start sglang.service" in str(e.value)
    after = applysim.fingerprint(host)
    assert applysim.diff(before, after) == []
    active, command, held = after["service"]
    assert active == "active" and "--tp 8" in command and len([n for n in held if n[11:].isdigit()]) == 8


class _StopFails:
    """An ExecPort whose ``systemctl stop`` of the service fails (a stop job cancelled)."""

    def __init__(self, inner):
        self.inner = inner

    def run(self, vmid, argv, timeout, input=None):
        if argv[:2] == ["systemctl", "stop"]:
            from gputopo.ports import ExecResult

            return ExecResult(1, "", f"Job for {argv[2]} canceled.\n")
        return self.inner.run(vmid, argv, timeout, input)

    def push(self, *args, **kw):
        return self.inner.push(*args, **kw)


def test_a_failure_before_the_stop_window_does_not_restart_the_service(host):
    """The stop window never opened (stopping the service fails), but the new drop-in was written
    before: the rollback puts the old one back and leaves the service that ran alone, the same
    process with the same command line, instead of restarting what was never stopped."""
    started = _started(host)
    before = applysim.fingerprint(host)
    ports = host.ports()
    ports.exec = _StopFails(ports.exec)
    with pytest.raises(ApplyFailed) as e:
        apply(applysim.seed_spec(host), ports, root=str(host.paths.root), timeouts=T)
    assert e.value.rolled_back and "stop sglang.service" in str(e.value)
    assert applysim.diff(before, applysim.fingerprint(host)) == []
    assert _started(host) == started  # never restarted


class _HangWhenConfigBegins(Progress):
    """Makes the rollback's rebind of one GPU hang: the hang is injected once the config phase
    begins, after the forward writes of that GPU are done."""

    def __init__(self, root: Path, address: str):
        self.root, self.address, self.fired = root, address, False

    def step_begin(self, index, total, action) -> None:
        if action.phase == "config" and not self.fired:
            self.fired = True
            SimKernel(self.root).inject(self.address, "*", "hang")


def test_a_hang_during_the_rollback_then_recover_gives_the_container_all_its_gpus(host):
    """A GPU's undo hangs: the rollback leaves it, cannot restore the container's devN for it,
    starts the container with half its GPUs and the service cannot serve with tp 8. Once the
    device is free, recover rebinds it, restores the config, restarts the container so that it
    sees every GPU again, and restarts the service: the host is as before."""
    stuck = "0000:91:00.0"
    before = applysim.fingerprint(host)
    break_container(host.dir, 101, "service_fails", message="RuntimeError: CUDA error: out of memory", tp=4)
    with pytest.raises(ApplyFailed) as e:
        apply(
            applysim.seed_spec(host),
            host.ports(),
            root=str(host.paths.root),
            timeouts=Timeouts(sysfs=0.5, guest=30.0, exec=10.0, service=20.0, poll=0.02),
            progress=_HangWhenConfigBegins(host.paths.root, stuck),
        )
    assert e.value.exit_code == 3 and stuck in e.value.needs_human, str(e.value)
    j = find_unfinished(host.paths.root)
    assert j is not None and j.needs_human is not None
    with pytest.raises(UnfinishedApply) as again:
        apply(applysim.seed_spec(host), host.ports(), root=str(host.paths.root), timeouts=T)
    assert stuck in str(again.value) and "gputopo recover" in str(again.value)

    # a human frees the device; recover completes the rollback and the container's view
    SimKernel(host.paths.root).clear_faults()
    from gputopo.cli import main

    try:
        main(["recover", "--sim", str(host.dir), "--timeout", "5"])
    except SystemExit as ex:
        assert ex.code in (None, 0)
    assert find_unfinished(host.paths.root) is None
    host.stop()
    after = applysim.fingerprint(host)
    # the GPUs came back in another order (91:00.0 last: the others took the lowest free minors,
    # nvidia remembers none), so CT 101's devN lines differ; each reaches the GPU it did before
    conf = f"pve:{host.paths.lxc_conf(101).relative_to(host.paths.pve)}"
    assert [d for d in applysim.diff(before, after) if not d.startswith(f"{conf}:")] == []
    seen = SimExec(host.dir).run(
        101, ["nvidia-smi", "--query-gpu=pci.bus_id", "--format=csv,noheader"], timeout=5
    )
    assert sorted(line.strip()[-12:].lower() for line in seen.stdout.splitlines()) == [
        f"0000:{bus}:00.0" for bus in ("01", "11", "61", "71", "81", "91", "e1", "f1")
    ]
    assert "nvidia5" in after["ct:/dev"]


def test_signals_during_a_rollback_wait_until_it_ends(host):
    """Ctrl-C starts a rollback; a second and a third Ctrl-C during it do not abort it: the
    terminal says so, the rollback ends, the host is as before and the journal closed."""
    before = applysim.fingerprint(host)
    # held in the switch phase by an unbind that blocks until released: the first signal lands
    # there; the rollback's write to another group then blocks (a second hang) while two more arrive
    kernel, proc = applysim.held_apply(host, stderr=subprocess.STDOUT)

    def journal_has(pred) -> bool:
        js = list_journals(host.paths.root)
        return bool(js) and any(pred(r) for r in Journal.load(js[-1]).records)

    def wait_for(pred) -> None:
        deadline = time.monotonic() + 120  # a bound on a broken test, not a measured window
        while not journal_has(pred) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert proc.poll() is None, proc.stdout.read()

    def steps_of(kind: str) -> dict[str, int]:
        js = list_journals(host.paths.root)
        recs = Journal.load(js[-1]).records if js else []
        return {r.action.address: r.step for r in recs if isinstance(r, Begin) and r.action.kind == kind}

    def done(step: int) -> bool:
        return journal_has(lambda r: r.type == "done" and r.step == step)

    try:
        # every group but the held one is through the switch: its next writes are the rollback's
        wait_for(
            lambda r: (
                len(steps_of("rebind")) == 4
                and all(done(s) for a, s in steps_of("rebind").items() if a != "0000:81:00.0")
            )
        )
        held = steps_of("rebind")["0000:e1:00.0"]
        kernel.inject("0000:e1:00.0", "override", "hang", times=1)
        proc.send_signal(signal.SIGINT)
        kernel.release("0000:81:00.0")
        wait_for(lambda r: r.type == "undo-begin" and r.step == held)
        proc.send_signal(signal.SIGINT)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)  # both are handled while the rollback is held in that write
        assert proc.poll() is None
        kernel.release()
        out, _ = proc.communicate(timeout=120)
    finally:
        kernel.release()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out
    assert "the rollback continues" in out and "rolled back" in out, out
    assert find_unfinished(host.paths.root) is None
    host.stop()
    assert applysim.diff(before, applysim.fingerprint(host)) == []
