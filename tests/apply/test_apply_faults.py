"""Apply under failure on the simulated seed host: every step of the plan made to fail once, a
hanging sysfs write, and SIGKILL mid-apply followed by ``gputopo recover``.

The steps come from the plan itself, so a new step is covered as soon as the planner makes it;
an action kind without a way to make it fail here fails the test.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from gputopo.apply import Progress, Timeouts
from gputopo.apply.journal import find_unfinished, list_journals, parse_journal
from gputopo.errors import ApplyFailed, ExecError, UnfinishedApply
from gputopo.ports import ExecResult
from gputopo.sim import state
from gputopo.sim.container import break_container
from gputopo.sim.kernel import SimKernel
from gputopo.sim.pveapi import PveApiServer
from gputopo.usecases.apply import apply
from gputopo.usecases.readplan import read_and_plan
from helpers import TESTS, applysim
from helpers.applysim import template  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow  # every test applies on a simulated host (seconds each); the full run only


@pytest.fixture
def new_host(template):
    made = []

    def make():
        base = Path(tempfile.mkdtemp(prefix="gputopo-fault-", dir=applysim.fast_tmp()))
        h = applysim.copy_host(template, base / "sim")
        # a service that is activating for a while after each start, as a real one loading a model
        state.write_state(h.paths.run, "latencies", {"service.start": 0.3})
        made.append((h, base))
        return h

    yield make
    for h, base in made:
        SimKernel(h.paths.root).clear_faults()  # lets any hung worker thread finish
        h.stop()
        applysim.cleanup(base)


# --- ways to make one step fail, through the simulator or a failing port --------------------


class ReadOnlyFiles:
    """A HostFilesPort whose directory of ``path`` is on a read-only filesystem."""

    def __init__(self, inner, path: str):
        self.inner, self.path, self.root = inner, path, inner.root

    def __getattr__(self, name):  # reads go to the real files
        return getattr(self.inner, name)

    def write(self, path, content, mode=0o644, owner=None):
        if path == self.path:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)
        self.inner.write(path, content, mode, owner)

    def remove(self, path):
        if path == self.path:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)
        self.inner.remove(path)


class FailingExec:
    """An ExecPort where ``pct push`` to ``push_path`` fails (disk full) and ``systemctl stop``
    of ``stop_unit`` fails the way a unit whose stop job is cancelled does."""

    def __init__(self, inner, push_path=None, stop_unit=None):
        self.inner, self.push_path, self.stop_unit = inner, push_path, stop_unit

    def run(self, vmid, argv, timeout, input=None):
        if self.stop_unit and argv == ["systemctl", "stop", self.stop_unit]:
            return ExecResult(1, "", f"Job for {self.stop_unit} canceled.\n")
        return self.inner.run(vmid, argv, timeout, input)

    def push(self, vmid, path, content, mode=0o644):
        if path == self.push_path:
            raise ExecError(
                vmid, ["pct", "push", str(vmid), path], 1, "write failed: No space left on device"
            )
        self.inner.push(vmid, path, content, mode)


def _api(host) -> PveApiServer:
    return host.api


def _fail_file(host, ports, a):
    ports.files = ReadOnlyFiles(ports.files, a.path)


def _fail_mapping(host, ports, a):
    _api(host).inject_api_fault(
        "POST", r"/cluster/mapping/pci", "cfs-lock 'file-pci_mapping' error: got lock request timeout"
    )
    _api(host).inject_api_fault(
        "PUT", rf"/cluster/mapping/pci/{a.id}", "cfs-lock 'file-pci_mapping' error: got lock request timeout"
    )
    _api(host).inject_api_fault(
        "DELETE",
        rf"/cluster/mapping/pci/{a.id}",
        "cfs-lock 'file-pci_mapping' error: got lock request timeout",
    )


def _fail_dropin(host, ports, a):
    ports.exec = FailingExec(ports.exec, push_path=a.path)


def _fail_stop_service(host, ports, a):
    ports.exec = FailingExec(ports.exec, stop_unit=a.unit)


def _fail_stop_guest(host, ports, a):
    _api(host).inject_fault(
        "vzshutdown" if a.guest == "lxc" else "qmshutdown",
        a.vmid,
        f"command 'lxc-stop -n {a.vmid} --nokill --timeout 60' failed: exit code 1",
    )


def _fail_rebind(host, ports, a):
    # vfio-pci's probe binds nothing once: the read-back must notice
    SimKernel(host.paths.root).inject(a.address, "bind", "noop", times=1)


def _fail_update_container(host, ports, a):
    _api(host).inject_api_fault("PUT", rf"/nodes/[^/]+/lxc/{a.vmid}/config", "CT is locked (backup)")


def _fail_start_guest(host, ports, a):
    _api(host).inject_fault(
        "vzstart" if a.guest == "lxc" else "qmstart", a.vmid, f"startup for container '{a.vmid}' failed"
    )


def _fail_start_service(host, ports, a):
    # the new configuration (tp 4) does not fit; the old one (tp 8) starts again in the rollback
    break_container(
        host.dir, a.vmid, "service_fails", message="RuntimeError: CUDA error: out of memory", tp=4
    )


FAIL_BY_KIND = {
    "write_host_file": _fail_file,
    "remove_host_file": _fail_file,
    "set_mapping": _fail_mapping,
    "delete_mapping": _fail_mapping,
    "write_service_dropin": _fail_dropin,
    "stop_service": _fail_stop_service,
    "stop_guest": _fail_stop_guest,
    "rebind": _fail_rebind,
    "update_container": _fail_update_container,
    "start_guest": _fail_start_guest,
    "start_service": _fail_start_service,
}

TIMEOUTS = applysim.FAST_TIMEOUTS


def _seed_steps(template) -> list:
    base = Path(tempfile.mkdtemp(prefix="gputopo-plan-", dir=applysim.fast_tmp()))
    h = applysim.copy_host(template, base / "sim")
    try:
        _, _, p = read_and_plan(applysim.seed_spec(h), h.ports(), str(h.paths.root))
        return list(p.actions)
    finally:
        h.stop()
        applysim.cleanup(base)


def test_every_step_failing_rolls_back_byte_for_byte(template, new_host):
    actions = _seed_steps(template)
    assert len(actions) >= 10
    missing = sorted({a.kind for a in actions} - set(FAIL_BY_KIND))
    assert not missing, f"no way to make these steps fail: {missing}"
    for i, a in enumerate(actions):
        host = new_host()
        ports = host.ports()
        spec = applysim.seed_spec(host)
        before = applysim.fingerprint(host)
        FAIL_BY_KIND[a.kind](host, ports, a)
        with pytest.raises(ApplyFailed) as e:
            apply(spec, ports, root=str(host.paths.root), timeouts=TIMEOUTS)
        err = e.value
        assert f"step {i + 1} " in str(err), (i, a.describe(), str(err))
        assert err.rolled_back and not err.needs_human and err.exit_code == 1, str(err)
        assert "\n" not in str(err)
        got = applysim.fingerprint(host)
        assert applysim.diff(before, got) == [], (i, a.describe(), applysim.diff(before, got))
        j = list_journals(host.paths.root)[-1]
        recs = parse_journal(j.read_text())
        assert recs[-1].type == "end" and recs[-1].result == "rolled-back"
        assert find_unfinished(host.paths.root) is None
        host.stop()


def test_hanging_write_names_the_device_and_rolls_back_the_rest(new_host):
    host = new_host()
    ports = host.ports()
    spec = applysim.seed_spec(host)
    before = applysim.fingerprint(host)
    hung = "0000:91:00.0"
    SimKernel(host.paths.root).inject(hung, "unbind", "hang")
    with pytest.raises(ApplyFailed) as e:
        apply(
            spec,
            ports,
            root=str(host.paths.root),
            timeouts=Timeouts(sysfs=0.5, guest=30, exec=10, service=20, poll=0.02),
        )
    err = e.value
    assert err.exit_code == 3 and err.needs_human == [hung]
    assert f"device {hung} needs a human" in str(err) and "\n" not in str(err)
    after = applysim.fingerprint(host)
    changed = applysim.diff(before, after)
    # only the hung GPU's group may differ; here its override was set before the unbind hung
    assert all(hung in line for line in changed), changed
    for a in ("0000:81:00.0", "0000:e1:00.0", "0000:f1:00.0"):
        assert after[f"pci:{a}"] == before[f"pci:{a}"]
    assert after["service"] == before["service"] and after["guests"] == before["guests"]
    journal = list_journals(host.paths.root)[-1]
    recs = parse_journal(journal.read_text())
    # the journal stays open: its last word names the device and the undo still to do
    assert recs[-1].type == "needs-human" and recs[-1].needs_human == [hung]
    hung_steps = [r.step for r in recs if r.type == "failed" and r.error_type == "SysfsTimeout"]
    assert hung_steps and set(hung_steps) <= set(recs[-1].pending)
    assert not [r for r in recs if r.type == "end"]
    assert find_unfinished(host.paths.root).path == journal

    # the next apply refuses, naming the journal and the way out
    from gputopo.cli import main

    with pytest.raises(SystemExit) as refused:
        main(["apply", "--sim", str(host.dir), "--spec", str(_spec_file(host)), "--yes", "--no-verify"])
    assert refused.value.code == 2

    with pytest.raises(UnfinishedApply) as again:
        apply(spec, ports, root=str(host.paths.root), timeouts=T_HANG)
    msg = str(again.value)
    assert "\n" not in msg and str(journal) in msg and "gputopo recover" in msg and hung in msg

    # the holder is gone: the hung write returns (and acts); recover completes the rollback
    SimKernel(host.paths.root).release(hung)
    main_exit = None
    try:
        main(["recover", "--sim", str(host.dir), "--timeout", "2"])
    except SystemExit as e:
        main_exit = e.code
    assert main_exit in (None, 0)
    assert applysim.diff(before, applysim.fingerprint(host)) == []
    recs = parse_journal(journal.read_text())
    assert recs[-1].type == "end" and recs[-1].result == "rolled-back"
    assert find_unfinished(host.paths.root) is None


def _spec_file(host) -> Path:
    f = host.dir / "spec.yaml"
    f.write_text(applysim.seed_spec_text(host))
    return f


T_HANG = Timeouts(sysfs=0.5, guest=30, exec=10, service=20, poll=0.02)


# --- crash: SIGKILL mid-apply, then recover ---------------------------------------------------
# (tests/apply/test_crash_matrix.py kills at every point; here one point per phase)

DRIVER = TESTS / "helpers" / "crashdriver.py"


def _drive(host, *args: str, at: str | None = None, count: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
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


def _apply_args(host) -> list[str]:
    f = host.dir / "spec.yaml"
    f.write_text(applysim.seed_spec_text(host))
    return ["apply", "--spec", str(f), "--yes", "--no-verify", "--timeout", "30"]


def _first_begin_per_phase(template) -> dict[str, int]:
    """Phase -> the journal record count right after its first step began (a clean run's trace)."""
    base = Path(tempfile.mkdtemp(prefix="gputopo-trace-", dir=applysim.fast_tmp()))
    h = applysim.copy_host(template, base / "sim")
    try:
        out = base / "count.json"
        assert _drive(h, *_apply_args(h), count=out).returncode == 0
        records = parse_journal(list_journals(h.paths.root)[-1].read_text())
    finally:
        h.stop()
        applysim.cleanup(base)
    firsts: dict[str, int] = {}
    for n, r in enumerate(records, 1):
        if r.type == "begin":
            firsts.setdefault(r.action.phase, n)
    return firsts


def test_sigkill_in_each_phase_then_recover_rolls_back(template, new_host):
    firsts = _first_begin_per_phase(template)
    assert set(firsts) == {"prepare", "stop", "switch", "config", "start"}
    for i, (phase, n) in enumerate(sorted(firsts.items(), key=lambda kv: kv[1])):
        host = new_host()
        before = applysim.fingerprint(host)
        res = _drive(host, *_apply_args(host), at=f"record:{n}")
        assert res.returncode == -signal.SIGKILL, (phase, res.stderr)
        assert find_unfinished(host.paths.root) is not None
        if i == 0:  # the next apply names what to do
            refused = _drive(host, *_apply_args(host))
            assert refused.returncode == 2 and "gputopo recover" in refused.stderr, refused.stderr
        rec = _drive(host, "recover")
        assert rec.returncode == 0, (phase, rec.stdout, rec.stderr)
        assert find_unfinished(host.paths.root) is None
        assert applysim.diff(before, applysim.fingerprint(host)) == [], phase
        host.stop()


def test_sigkill_in_switch_then_recover_finish_applies(template, new_host):
    firsts = _first_begin_per_phase(template)
    host = new_host()
    res = _drive(host, *_apply_args(host), at=f"record:{firsts['switch']}")
    assert res.returncode == -signal.SIGKILL, res.stderr
    rec = _drive(host, "recover", "--finish")
    assert rec.returncode == 0, rec.stderr
    assert find_unfinished(host.paths.root) is None
    host.stop()  # the other processes' servers replaced the simulator's TLS files
    ports = host.ports()
    _, _, p = read_and_plan(applysim.seed_spec(host), ports, str(host.paths.root))
    assert p.is_empty, p.to_text()
    assert applysim.fingerprint(host)["service"][0] == "active"


def test_sigkill_after_every_step_while_verifying_leaves_an_applied_host(template, new_host):
    """Verification is not part of the transaction: killed after the last step (journal closed),
    or during a verification that may roll back (journal open at Verifying), the host stays
    applied and recover does not undo it."""
    host = new_host()
    args = _apply_args(host)[:-3] + ["--rollback-on-verify-failure", "--timeout", "30"]
    out = host.dir / "count.json"
    probe = _drive(host, *args, count=out)
    assert probe.returncode == 0, probe.stderr
    recs = parse_journal(list_journals(host.paths.root)[-1].read_text())
    verifying = next(n for n, r in enumerate(recs, 1) if r.type == "verifying")
    applied = applysim.fingerprint(host)
    host.stop()

    host = new_host()
    res = _drive(host, *args, at=f"record:{verifying}")
    assert res.returncode == -signal.SIGKILL, res.stderr
    rec = _drive(host, "recover")
    assert rec.returncode == 0 and "only the verification was interrupted" in rec.stdout + rec.stderr, (
        rec.stderr
    )
    assert find_unfinished(host.paths.root) is None
    assert applysim.diff(applied, applysim.fingerprint(host)) == []
    host.stop()


class _Notes(Progress):
    def __init__(self):
        self.notes: list[str] = []

    def note(self, text: str) -> None:
        self.notes.append(text)


def test_sigkill_in_config_then_recover_without_the_api_undoes_sysfs_and_names_the_rest(template, new_host):
    """After a crash the API may not answer (pmxcfs down: pvesh fails). The journal names this
    host, so recover warns and goes on: the GPUs go back to their drivers, the steps that need
    the API are named and the journal stays open; a recover once the API answers completes."""
    from gputopo.adapters.credentials import ApiConfig
    from gputopo.adapters.proxmox import ProxmoxClient
    from gputopo.apply import recover

    firsts = _first_begin_per_phase(template)
    host = new_host()
    before = applysim.fingerprint(host)
    res = _drive(host, *_apply_args(host), at=f"record:{firsts['config']}")
    assert res.returncode == -signal.SIGKILL, res.stderr
    journal = find_unfinished(host.paths.root).path
    moved = [k for k in before if k.startswith("pci:") and applysim.fingerprint(host)[k] != before[k]]
    assert moved  # the switch was done: GPUs are on other drivers

    def pmxcfs_down(argv, timeout):
        return "", "ipcc_send_rec[1] failed: Connection refused\n", 255

    down = ProxmoxClient.from_config(
        ApiConfig(backend="local", node=host.node, timeout=5), runner=pmxcfs_down
    )
    ports = dataclasses.replace(host.ports(), proxmox=down)
    notes = _Notes()
    with pytest.raises(ApplyFailed) as e:
        recover(ports, root=str(host.paths.root), progress=notes, timeouts=T_HANG)
    assert f"{journal} stays open" in str(e.value) and "\n" not in str(e.value)
    assert notes.notes[0].startswith("warning: cannot use the Proxmox API via pvesh (--local) (")
    assert "ipcc_send_rec" in notes.notes[0]
    after = applysim.fingerprint(host)
    assert {k: after[k] for k in moved} == {k: before[k] for k in moved}  # sysfs undone without the API
    recs = parse_journal(journal.read_text())
    assert recs[-1].type == "needs-human" and [r for r in recs if r.type == "undo-failed"]
    assert find_unfinished(host.paths.root).path == journal
    # the API answers again: the next recover completes the rollback
    assert recover(host.ports(), root=str(host.paths.root), timeouts=T_HANG).status == "recovered"
    assert find_unfinished(host.paths.root) is None
    assert applysim.diff(before, applysim.fingerprint(host)) == []
    host.stop()
