"""``container_restart: auto``: where Proxmox allows it, the container keeps running while its GPUs
change, and only its service stops and starts again. Each test reads what runs: when the container
last started (the simulator's record of its boot), the GPUs its own nvidia-smi lists, the command
line of the service's main process, and the devN in its Proxmox config.

* a shrink keeps it running on PVE 8 and 9 (the removed devN wait for its next start);
* a grow hot-plugs the new devN on PVE 9, and restarts the container on PVE 8;
* ``always`` restarts it in every case;
* a live grow that fails rolls back, and the container that saw GPUs hot-plugged is restarted
  (Proxmox cannot unplug a devN); a kill while the new service loads, or a verification that
  fails while the service is restarting, stops the service before its GPUs leave nvidia.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from gputopo.apply import Progress
from gputopo.apply.journal import find_unfinished, list_journals, parse_journal
from gputopo.errors import ApplyFailed
from gputopo.formats.lxcconf import parse_lxc_conf
from gputopo.plan.spec import parse_spec
from gputopo.sim import state
from gputopo.sim.container import Container, SimExec
from gputopo.sim.host import SimHost
from gputopo.sim.kernel import SimKernel
from gputopo.usecases.apply import apply
from helpers import TESTS, applysim
from helpers.applysim import template  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow  # every test applies on a simulated host (seconds each); the full run only

T = applysim.FAST_TIMEOUTS
NUMA0 = ["0000:01:00.0", "0000:11:00.0", "0000:61:00.0", "0000:71:00.0"]
NUMA1 = ["0000:81:00.0", "0000:91:00.0", "0000:e1:00.0", "0000:f1:00.0"]


@pytest.fixture
def new_host(template):
    made = []

    def make(pve_version: str | None = None) -> SimHost:
        base = Path(tempfile.mkdtemp(prefix="gputopo-live-", dir=applysim.fast_tmp()))
        if pve_version is None:
            h = applysim.copy_host(template, base / "sim")
        else:
            h = SimHost.create(base / "sim", pve_version=pve_version)
            SimKernel(h.paths.root).configure(time_scale=applysim.SCALE)
        made.append((h, base))
        return h

    yield make
    for h, base in made:
        h.stop()
        applysim.cleanup(base)


def _seen(host) -> list[str]:
    """The GPUs the container's own nvidia-smi lists (PCI addresses, sorted)."""
    out = (
        SimExec(host.dir)
        .run(101, ["nvidia-smi", "--query-gpu=pci.bus_id", "--format=csv,noheader"], 5)
        .stdout
    )
    return sorted(line.strip()[-12:].lower() for line in out.splitlines())


def _tp(host) -> str | None:
    main, _ = applysim.running_service(host.paths.root, 101, "sglang.service")
    m = re.search(r"--tp (\d+)", main or "")
    return m.group(1) if m else None


def _pending_deletes(host) -> list[str]:
    return sorted(parse_lxc_conf(host.paths.lxc_conf(101).read_text()).pending_delete)


def _apply(host, text: str):
    res = apply(parse_spec(text), host.ports(), root=str(host.paths.root), timeouts=T)
    assert res.status == "applied"
    return [a.kind for a in res.plan.actions]


def _grow(text: str) -> str:
    return applysim.reverse(text)


@pytest.mark.parametrize("version", ["8.4.1", "9.1.2"])
def test_a_shrink_keeps_the_container_running(new_host, version):
    host = new_host(version)
    ct = Container(host.dir, 101)
    booted = ct.booted_at()
    assert booted is not None and _seen(host) == sorted(NUMA0 + NUMA1) and _tp(host) == "8"
    kinds = _apply(host, applysim.seed_spec_text(host))
    assert "stop_guest" not in kinds and "start_guest" not in kinds
    assert kinds.count("stop_service") == 1 and kinds.count("start_service") == 1
    assert ct.booted_at() == booted  # never restarted
    assert _seen(host) == NUMA0 and _tp(host) == "4"
    # Proxmox keeps the removals pending until the container's next start
    assert _pending_deletes(host) == ["dev4", "dev5", "dev6", "dev7"]


def _always(text: str) -> str:
    return applysim.restarting(text)


def test_a_grow_is_hot_plugged_on_pve9(new_host):
    host = new_host("9.1.2")
    ct = Container(host.dir, 101)
    text = applysim.seed_spec_text(host)
    _apply(host, _always(text))  # the container restarts: its /dev has the NUMA-0 GPUs only
    booted = ct.booted_at()
    assert "/dev/nvidia4" not in ct.devices() and _pending_deletes(host) == []
    kinds = _apply(host, _grow(text))
    assert "stop_guest" not in kinds and "start_guest" not in kinds
    assert ct.booted_at() == booted
    assert {f"/dev/nvidia{m}" for m in range(8)} <= set(ct.devices())  # hot-plugged
    assert _seen(host) == sorted(NUMA0 + NUMA1) and _tp(host) == "8"


def test_a_grow_after_a_live_shrink_cancels_the_pending_removals_on_pve9(new_host):
    host = new_host("9.1.2")
    ct = Container(host.dir, 101)
    text = applysim.seed_spec_text(host)
    _apply(host, text)
    booted = ct.booted_at()
    assert _pending_deletes(host) == ["dev4", "dev5", "dev6", "dev7"]
    kinds = _apply(host, _grow(text))
    assert "stop_guest" not in kinds and ct.booted_at() == booted
    assert _seen(host) == sorted(NUMA0 + NUMA1) and _tp(host) == "8"
    assert _pending_deletes(host) == []  # the GPUs came back: nothing waits for a restart


def test_a_grow_restarts_the_container_on_pve8(new_host):
    host = new_host()
    assert host.ports().proxmox.version()["version"].startswith("8.")
    ct = Container(host.dir, 101)
    text = applysim.seed_spec_text(host)
    _apply(host, text)
    booted = ct.booted_at()
    kinds = _apply(host, _grow(text))
    # pve-container before 6.x cannot hot-plug a devN: the container stops and starts with them
    assert kinds.count("stop_guest") == 1 and kinds.count("start_guest") == 1
    assert ct.booted_at() != booted
    assert _seen(host) == sorted(NUMA0 + NUMA1) and _tp(host) == "8" and _pending_deletes(host) == []


def test_always_restarts_the_container_even_where_it_could_keep_running(new_host):
    host = new_host("9.1.2")
    ct = Container(host.dir, 101)
    booted = ct.booted_at()
    text = _always(applysim.seed_spec_text(host))
    kinds = _apply(host, text)
    assert kinds.count("stop_guest") == 1 and kinds.count("start_guest") == 1
    assert ct.booted_at() != booted
    assert _seen(host) == NUMA0 and _pending_deletes(host) == []  # the restart applied the removals


class _Notes(Progress):
    def __init__(self):
        self.notes: list[str] = []

    def note(self, text: str) -> None:
        self.notes.append(text)


def _live_grow_host(new_host) -> tuple[SimHost, str]:
    """A PVE 9 host split with ``always`` (the container restarted: its /dev holds the NUMA-0
    GPUs only), whose grow back hot-plugs the NUMA-1 GPUs into the running container."""
    host = new_host("9.1.2")
    text = applysim.seed_spec_text(host)
    _apply(host, _always(text))
    return host, text


def test_a_failed_live_grow_rolls_back_and_restarts_the_container_it_hot_plugged(new_host):
    """A hot-plugged devN cannot leave a running container (pve-container's
    vmconfig_hotplug_pending skips every devN delete): once the GPUs are back on vfio-pci the
    rollback restarts the container, so that it sees what it saw before (and its config's
    pending removals apply), and says so."""
    from gputopo.sim.container import break_container
    from gputopo.usecases.verify import verify

    host, text = _live_grow_host(new_host)
    ct = Container(host.dir, 101)
    booted = ct.booted_at()
    before = applysim.fingerprint(host)
    break_container(host.dir, 101, "service_fails", message="CUDA error", tp=8)
    notes = _Notes()
    with pytest.raises(ApplyFailed) as e:
        apply(parse_spec(_grow(text)), host.ports(), root=str(host.paths.root), timeouts=T, progress=notes)
    assert e.value.rolled_back and e.value.exit_code == 1, str(e.value)
    assert applysim.diff(before, applysim.fingerprint(host)) == []
    assert ct.booted_at() != booted
    assert "/dev/nvidia4" not in ct.devices() and _pending_deletes(host) == []
    assert _seen(host) == NUMA0 and _tp(host) == "4"
    said = [n for n in notes.notes if n.startswith("restarted CT 101")]
    assert said and "/dev/nvidia4" in said[0] and "hot-plugged" in said[0], notes.notes
    report = verify(parse_spec(_always(text)), host.ports(), root=str(host.paths.root))
    container = next(c for c in report.checks if c.name == "container")
    assert container.status == "PASS", container


# --- a kill while the new service loads its model, then recover ------------------------------

DRIVER = TESTS / "helpers" / "crashdriver.py"


def _drive(host, *args: str, at: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if at:
        env["GPUTOPO_CRASH_AT"] = at
    return subprocess.run(
        [sys.executable, str(DRIVER), *args, "--sim", str(host.dir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_sigkill_while_the_new_service_starts_then_recover_stops_it_before_the_gpus_leave(new_host):
    """Killed while ``systemctl start`` waits for the ``--tp 8`` server (systemd took the start
    job: its processes hold all eight GPUs, it is ``activating``): recover stops it before
    nvidia lets go of the NUMA-1 GPUs (an unbind of a held GPU blocks until it is released),
    and restarts the container, which still sees the hot-plugged nodes."""
    host, text = _live_grow_host(new_host)
    ct = Container(host.dir, 101)
    booted = ct.booted_at()
    before = applysim.fingerprint(host)
    spec = host.dir / "grow.yaml"
    spec.write_text(_grow(text))
    # the server loads its model for a minute: the kill lands while it is activating
    state.write_state(host.paths.run, "latencies", {"service.start": 60.0})
    res = _drive(host, "apply", "--spec", str(spec), "--yes", "--no-verify", at="job:1")
    assert res.returncode == -signal.SIGKILL, res.stderr
    svc = applysim.fingerprint(host)["service"]
    assert svc[0] == "activating" and "--tp 8" in svc[1] and "/dev/nvidia7" in svc[2], svc
    state.write_state(host.paths.run, "latencies", {})  # the old configuration starts at once
    rec = _drive(host, "recover", "--timeout", "sysfs=5")
    assert rec.returncode == 0, rec.stdout + rec.stderr
    said = rec.stdout + rec.stderr
    assert "stopped sglang.service (it was activating)" in said and "restarted CT 101" in said, said
    assert find_unfinished(host.paths.root) is None
    assert applysim.diff(before, applysim.fingerprint(host)) == []
    assert ct.booted_at() != booted and _tp(host) == "4"


# --- a verification that fails, then a rollback -------------------------------------------------


def _crashed_and_restarting(host, latency: float = 60.0) -> None:
    """The server crashed and systemd is starting it again (``Restart=on-failure``): the unit
    is ``activating`` and its new processes hold their GPUs already."""
    ct = Container(host.dir, 101)
    ct.stop_service("sglang.service")
    state.write_state(host.paths.run, "latencies", {"service.start": latency})
    ct.start_service("sglang.service")
    state.write_state(host.paths.run, "latencies", {})


def test_rollback_on_verify_failure_stops_a_restarting_service_before_the_gpus_leave(new_host):
    from gputopo.sim.container import break_container
    from gputopo.usecases.verify import verify as run_verify

    host, text = _live_grow_host(new_host)
    before = applysim.fingerprint(host)
    spec = parse_spec(_grow(text))
    break_container(host.dir, 101, "wrong_answer", answer="92")

    def verify():
        report = run_verify(spec, host.ports(), root=str(host.paths.root))
        _crashed_and_restarting(host)
        return report

    notes = _Notes()
    res = apply(
        spec,
        host.ports(),
        root=str(host.paths.root),
        timeouts=T,
        progress=notes,
        verify=verify,
        rollback_on_verify_failure=True,
    )
    assert res.status == "rolled-back" and not res.verify.ok
    assert "CT 101: stopped sglang.service (it was activating)" in "\n".join(notes.notes), notes.notes
    assert applysim.diff(before, applysim.fingerprint(host)) == []
    end = parse_journal(list_journals(host.paths.root)[-1].read_text())[-1]
    assert end.type == "end" and end.result == "rolled-back"


def test_rollback_on_verify_failure_that_cannot_complete_says_so(new_host):
    """A process that is not the plan's (a job someone started in the container on a new GPU)
    holds a GPU the rollback takes back: its group stays on nvidia rather than hang in an
    unbind and end with no driver; the apply exits 3 saying it is NOT rolled back, the journal
    stays open, and recover completes once the job is gone."""
    from gputopo.apply import recover
    from gputopo.facts.discover import discover
    from gputopo.sim.container import break_container
    from gputopo.usecases.verify import verify as run_verify

    host, text = _live_grow_host(new_host)
    root = host.paths.root
    before = applysim.fingerprint(host)
    spec = parse_spec(_grow(text))
    break_container(host.dir, 101, "wrong_answer", answer="92")
    held = NUMA1[0]
    job = 4242

    def verify():
        minor = next(g.minor for g in discover(str(root)).gpus if g.address == held)
        applysim.fake_process(
            root,
            job,
            f"/dev/nvidia{minor}",
            argv=("python3", "train.py"),
            cgroup="0::/lxc/101/ns/user.slice/user-0.slice/session-3.scope",
        )
        return run_verify(spec, host.ports(), root=str(root))

    with pytest.raises(ApplyFailed) as e:
        apply(spec, host.ports(), root=str(root), timeouts=T, verify=verify, rollback_on_verify_failure=True)
    err = e.value
    assert err.exit_code == 3 and not err.rolled_back and err.needs_human == [held], str(err)
    assert "NOT fully rolled back" in str(err) and "inference" in str(err) and "\n" not in str(err)
    after = applysim.fingerprint(host)
    assert after[f"pci:{held}"][0] == "nvidia"  # never left without a driver
    assert all(after[f"pci:{a}"] == before[f"pci:{a}"] for a in NUMA1[1:])
    recs = parse_journal(list_journals(root)[-1].read_text())
    assert recs[-1].type == "needs-human" and recs[-1].needs_human == [held]
    incomplete = next(r for r in recs if r.type == "undo-incomplete")
    assert f"PID {job} (python3 train.py) in CT 101 holds /dev/nvidia" in incomplete.what, incomplete.what

    shutil.rmtree(root / "proc" / str(job))  # the job ended
    res = recover(host.ports(), root=str(root), timeouts=T)
    assert res.status == "recovered"
    assert applysim.diff(before, applysim.fingerprint(host)) == []


# --- a hot-plug that Proxmox refuses (PVE 9) ----------------------------------------------------

HOTPLUG_ERROR = "unable to hotplug dev4: move_mount failed: Operation not permitted"


def _rollback_on_hotplug_failure(text: str) -> str:
    return text.replace("policy:\n", "policy:\n  hotplug_failure: rollback\n", 1)


def _hotplug_fails(host) -> None:
    """The next devN hot-plug into CT 101 fails: the first new key (dev4) of the grow's PUT."""
    host.api.inject_hotplug_failure(101, message="move_mount failed: Operation not permitted")


def _pending(host) -> dict[str, str]:
    return parse_lxc_conf(host.paths.lxc_conf(101).read_text()).pending.options


def test_a_refused_hot_plug_restarts_the_container_with_the_change(new_host):
    """Proxmox answers a hot-plug that fails with 400 and writes nothing, but the other new devN
    of that PUT are plugged already (pve-container LXC/Config.pm vmconfig_hotplug_pending goes on
    after an error; API2/LXC/Config.pm update_vm raises before write_config). With
    ``hotplug_failure: restart`` (the default) the step stops the container, makes the change and
    starts it: it ends as a grow with ``container_restart: always`` would, and the step warns once,
    naming the devN and Proxmox's error, in the progress and the journal."""
    host, text = _live_grow_host(new_host)
    twin, _ = _live_grow_host(new_host)
    _apply(twin, _always(_grow(text)))  # the same grow, restarting the container
    ct = Container(host.dir, 101)
    booted = ct.booted_at()
    _hotplug_fails(host)
    notes = _Notes()
    res = apply(parse_spec(_grow(text)), host.ports(), root=str(host.paths.root), timeouts=T, progress=notes)
    assert res.status == "applied"
    kinds = [a.kind for a in res.plan.actions]
    assert "stop_guest" not in kinds and "start_guest" not in kinds  # planned live
    assert ct.booted_at() != booted  # restarted by the fallback
    assert _seen(host) == sorted(NUMA0 + NUMA1) and _tp(host) == "8" and _pending(host) == {}
    # the NUMA-1 GPUs came back to nvidia in parallel, each with the lowest free minor when it
    # bound: the devN lines of the two hosts may name them in another order (_seen: the same GPUs)
    conf = f"pve:{host.paths.lxc_conf(101).relative_to(host.paths.pve)}"
    assert [
        d
        for d in applysim.diff(applysim.fingerprint(twin), applysim.fingerprint(host))
        if not d.startswith(f"{conf}:")
    ] == []
    said = [n for n in notes.notes if "could not hot-plug" in n]
    assert len(said) == 1, notes.notes
    assert re.fullmatch(
        rf"step \d+: warning: CT 101: Proxmox could not hot-plug dev4 \(/dev/nvidia\d+\): {HOTPLUG_ERROR}; "
        r"restarting CT 101 with the change \(policy.hotplug_failure: restart\)",
        said[0],
    ), said
    done = [r for r in parse_journal(list_journals(host.paths.root)[-1].read_text()) if r.type == "done"]
    journaled = [w for r in done for w in r.warnings if "could not hot-plug" in w]
    assert journaled == [said[0].split(": warning: ", 1)[1]]


def test_a_refused_hot_plug_rolls_back_where_the_policy_says_so(new_host):
    """``hotplug_failure: rollback``: the container is not restarted for the change; the apply
    rolls back, and the rollback restarts the container, which still sees the devN Proxmox did
    plug (a hot-plugged device cannot leave a running container), so everything is as before."""
    host, text = _live_grow_host(new_host)
    ct = Container(host.dir, 101)
    booted = ct.booted_at()
    before = applysim.fingerprint(host)
    _hotplug_fails(host)
    notes = _Notes()
    with pytest.raises(ApplyFailed) as e:
        apply(
            parse_spec(_rollback_on_hotplug_failure(_grow(text))),
            host.ports(),
            root=str(host.paths.root),
            timeouts=T,
            progress=notes,
        )
    assert e.value.rolled_back and e.value.exit_code == 1, str(e.value)
    assert f"(dev4: {HOTPLUG_ERROR})" in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert applysim.diff(before, applysim.fingerprint(host)) == []
    assert ct.booted_at() != booted and _pending(host) == {}
    assert _seen(host) == NUMA0 and _tp(host) == "4"
    said = [n for n in notes.notes if n.startswith("restarted CT 101")]
    assert said and "hot-plugged" in said[0], notes.notes
    recs = parse_journal(list_journals(host.paths.root)[-1].read_text())
    failed = next(r for r in recs if r.type == "failed")
    assert f"(dev4: {HOTPLUG_ERROR})" in failed.error
    assert recs[-1].type == "end" and recs[-1].result == "rolled-back"


def test_a_fallback_restart_that_fails_rolls_back(new_host):
    """The container does not start again with the change (its start task fails): the step
    fails and apply rolls back; the rollback puts the config back on the stopped container and
    starts it as it was."""
    host, text = _live_grow_host(new_host)
    before = applysim.fingerprint(host)
    _hotplug_fails(host)
    host.api.inject_fault("vzstart", 101, "startup for container '101' failed")
    with pytest.raises(ApplyFailed) as e:
        apply(parse_spec(_grow(text)), host.ports(), root=str(host.paths.root), timeouts=T)
    assert e.value.rolled_back and e.value.exit_code == 1, str(e.value)
    assert "startup for container '101' failed" in str(e.value), str(e.value)
    assert applysim.diff(before, applysim.fingerprint(host)) == []
    assert _seen(host) == NUMA0 and _tp(host) == "4" and _pending(host) == {}


def test_the_command_line_says_what_a_refused_hot_plug_did(new_host, capsys):
    """Through ``gputopo apply``: the fallback exits 0 with the warning line after the step;
    the rollback exits 1 with one error line quoting Proxmox's error, and ``history`` calls it
    rolled back."""
    from helpers.cli import run

    for policy, code in (("restart", 0), ("rollback", 1)):
        host, text = _live_grow_host(new_host)
        spec = host.dir / "grow.yaml"
        grow = _grow(text)
        spec.write_text(grow if policy == "restart" else _rollback_on_hotplug_failure(grow))
        _hotplug_fails(host)
        got, out, err = run(
            capsys, "apply", "--sim", str(host.dir), "--spec", str(spec), "--yes", "--no-verify"
        )
        assert got == code, (policy, out, err)
        said = [ln for ln in (out + err).splitlines() if "hot-plug" in ln or "hotplug" in ln]
        if policy == "restart":
            assert len(said) == 1 and re.search(
                rf"step \d+: warning: CT 101: Proxmox could not hot-plug dev4 \(/dev/nvidia\d+\): {HOTPLUG_ERROR}; "
                r"restarting CT 101 with the change \(policy.hotplug_failure: restart\)$",
                said[0],
            ), out + err
        else:
            errors = [ln for ln in err.splitlines() if ln.startswith("gputopo: error:")]
            assert len(errors) == 1 and errors[0].startswith("gputopo: error: apply failed at step "), err
            assert errors[0].endswith(
                f": PUT /nodes/pve1/lxc/101/config: 400 Parameter verification failed. (dev4: {HOTPLUG_ERROR}); "
                "rolled back"
            ), errors[0]
            got, out, err = run(capsys, "history", "--sim", str(host.dir), "--json")
            last = json.loads(out)["applies"][-1]
            assert last["outcome"] == "rolled-back", last
