"""A signal while apply waits for a guest's shutdown: Proxmox's shutdown task is the node's and
runs on (pve-common RESTEnvironment.pm fork_worker), so the rollback waits for it before it
decides whether the guest was stopped, then starts the guest again and ends ``rolled back``
with the signal's exit code (143, 129, 130). The container's direction (the seed split with
``container_restart: always``) and a VM consumer's (VM 201 losing its GPUs to CT 101, with
``when_gpus_leave: remove``); SIGKILL inside the shutdown, then ``gputopo recover``. Judged on
what runs: the guests, the service's command line and GPUs, the container's /dev."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gputopo.apply.journal import find_unfinished, list_journals, parse_journal
from gputopo.errors import TaskFailed
from gputopo.facts.discover import discover
from gputopo.plan.starter import init_spec
from gputopo.sim import state
from helpers import TESTS, applysim
from helpers.applysim import host, template  # noqa: F401 (fixtures)
from helpers.cli import run

# how the crash driver names a Proxmox call that changes something in its trace ("POST /nodes/...")
API_METHODS = ("POST", "PUT", "DELETE")

pytestmark = pytest.mark.slow  # applies on a simulated host in a process of its own, seconds each

SHUTDOWN = 1.5  # seconds the guest takes to go down: the signal lands 0.2 s into it
DRIVER = TESTS / "helpers" / "crashdriver.py"
EXIT = {signal.SIGTERM: 143, signal.SIGHUP: 129, signal.SIGINT: 130}


def _pace(h, task: str) -> None:
    """The guest takes SHUTDOWN s to go down; the service loads for longer than that, so a
    rollback that did not wait for the shutdown sees the guest stop in its middle."""
    state.write_state(
        h.paths.run,
        "latencies",
        {task: SHUTDOWN, "service.start": 2.0, "service.stop": 0.1, "vzstart": 0.2},
    )


def _argv(h, spec: Path) -> list[str]:
    return ["apply", "--spec", str(spec), "--sim", str(h.dir), "--yes", "--no-verify", "--timeout", "30"]


def _apply(h, spec: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, *extra, *_argv(h, spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _in_shutdown(h, proc: subprocess.Popen, guest: str) -> None:
    """Return 0.2 s after the stop step of ``guest`` (``lxc``, ``qemu``) began."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        journals = list_journals(h.paths.root)
        recs = parse_journal(journals[-1].read_text()) if journals else []
        if any(r.type == "begin" and r.action.kind == "stop_guest" and r.action.guest == guest for r in recs):
            time.sleep(0.2)
            return
        time.sleep(0.02)
    raise AssertionError(f"the stop of the {guest} guest never began: {proc.communicate()[0]}")


def _settled(h) -> None:
    """Let every task the node still runs end (a node's tasks outlive gputopo's process): each
    one's status read through the API once it is due, as ``pvenode task list`` would show it."""
    time.sleep(SHUTDOWN + 0.3)
    h.start()
    try:
        api = h.ports().proxmox
        for upid in state.read_state(h.paths.run, "tasks", {}) or {}:
            try:
                api.wait_task(upid, 5)
            except TaskFailed:
                pass  # it ended
    finally:
        h.stop()


def _rolled_back(out: str) -> None:
    last = out.rstrip().splitlines()[-1]
    assert last.endswith("; rolled back"), out
    assert "NOT fully rolled back" not in out and "find why" not in out, out


def _history_says_rolled_back(h, capsys) -> None:
    code, out, err = run(capsys, "history", "--sim", str(h.dir))
    assert code == 0, err
    assert " rolled-back " in out.strip().splitlines()[-1], out


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name)
def test_a_signal_inside_the_containers_shutdown_rolls_back_with_it_running(host, capsys, signum):
    spec = host.dir / "spec.yaml"
    spec.write_text(applysim.restarting(applysim.seed_spec_text(host)))
    before = applysim.fingerprint(host)
    _pace(host, "vzshutdown")

    proc = _apply(host, spec, "-m", "gputopo")
    _in_shutdown(host, proc, "lxc")
    proc.send_signal(signum)
    out = proc.communicate(timeout=120)[0]

    assert proc.returncode == EXIT[signum], out
    _rolled_back(out)
    _settled(host)
    assert find_unfinished(host.paths.root) is None
    assert applysim.diff(before, applysim.fingerprint(host)) == [], out
    _history_says_rolled_back(host, capsys)
    assert "waiting for CT 101 shutdown" in out, out  # it said what it waited for


def test_a_signal_inside_a_vm_consumers_shutdown_rolls_back_with_it_running(host, capsys):
    # gputopo demo's split: CT 101 on NUMA node 0, VM 201 consuming pro6000-vm (NUMA node 1,
    # ``when_gpus_leave: remove``) and started; the change back gives CT 101 every GPU
    split = applysim.restarting(
        init_spec(discover(str(host.paths.root)), container_mapping="pro6000", vm=201)
    )
    (host.dir / "split.yaml").write_text(split)
    code, _, err = run(capsys, *_argv(host, host.dir / "split.yaml"))
    assert code == 0, err
    back = host.dir / "back.yaml"
    back.write_text(applysim.reverse(split))
    before = applysim.fingerprint(host)
    _pace(host, "qmshutdown")

    proc = _apply(host, back, "-m", "gputopo")
    _in_shutdown(host, proc, "qemu")
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=120)[0]

    assert proc.returncode == 143, out
    _rolled_back(out)
    _settled(host)
    assert applysim.diff(before, applysim.fingerprint(host)) == [], out
    assert applysim.fingerprint(host)["guests"]["qemu"]["201"] == "running"  # on its GPUs: the diff
    _history_says_rolled_back(host, capsys)
    assert "waiting for VM 201 shutdown" in out, out


def _guest_status(h, kind: str, vmid: int) -> str:
    h.start()
    try:
        return h.ports().proxmox.guest_status(kind, vmid)
    finally:
        h.stop()


@pytest.mark.parametrize("when", ["inside", "after"])
def test_sigkill_inside_the_containers_shutdown_then_recover_puts_it_back(host, capsys, when):
    """``inside``: recover runs while Proxmox still shuts the container down (it waits for the
    journaled task); ``after``: the shutdown ended meanwhile, as the node carries it out
    whatever happened to the process that asked for it."""
    spec = host.dir / "spec.yaml"
    spec.write_text(applysim.restarting(applysim.seed_spec_text(host)))
    before = applysim.fingerprint(host)
    _pace(host, "vzshutdown")

    proc = _apply(host, spec, "-m", "gputopo")
    _in_shutdown(host, proc, "lxc")
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert find_unfinished(host.paths.root) is not None
    if when == "after":
        time.sleep(SHUTDOWN)
        assert _guest_status(host, "lxc", 101) == "stopped"

    code, out, err = run(capsys, "recover", "--sim", str(host.dir))

    assert code == 0, out + err
    assert "recovered" in out + err and "NOT" not in out + err, out + err
    assert "undo 7: started lxc 101" in out + err, out + err  # the node's shutdown stopped it
    _settled(host)
    assert find_unfinished(host.paths.root) is None
    assert applysim.diff(before, applysim.fingerprint(host)) == [], out + err
    _history_says_rolled_back(host, capsys)


def _call_after_shutdown_post(h, spec: Path, tmp: Path) -> int:
    """The crash driver's ``call:N`` of the shutdown's POST in a clean run of ``spec``: the
    first API call that changes something after the stop step's ``begin`` record."""
    count = tmp / "count.json"
    res = subprocess.run(
        [sys.executable, str(DRIVER), *_argv(h, spec)],
        capture_output=True,
        text=True,
        env={**os.environ, "GPUTOPO_CRASH_COUNT": str(count)},
        timeout=120,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    recs = parse_journal(list_journals(h.paths.root)[-1].read_text())
    stop = next(n for n, r in enumerate(recs, 1) if r.type == "begin" and r.action.kind == "stop_guest")
    trace = json.loads(count.read_text())["trace"]
    return next(
        calls for what, records, calls in trace if records == stop and what.split(" ", 1)[0] in API_METHODS
    )


def test_sigkill_between_proxmoxs_answer_and_the_journal_then_recover_waits_for_the_shutdown(
    template, tmp_path, capsys
):
    """Killed right after Proxmox accepted the shutdown, before the journal kept its UPID:
    recover finds the task in the node's list of running tasks and waits for it."""
    probe = applysim.copy_host(template, tmp_path / "probe")
    spec = probe.dir / "spec.yaml"
    spec.write_text(applysim.restarting(applysim.seed_spec_text(probe)))
    n = _call_after_shutdown_post(probe, spec, tmp_path)
    host = applysim.copy_host(template, tmp_path / "sim")
    spec = host.dir / "spec.yaml"
    spec.write_text(applysim.restarting(applysim.seed_spec_text(host)))
    before = applysim.fingerprint(host)
    _pace(host, "vzshutdown")

    res = subprocess.run(
        [sys.executable, str(DRIVER), *_argv(host, spec)],
        capture_output=True,
        text=True,
        env={**os.environ, "GPUTOPO_CRASH_AT": f"call:{n}"},
        timeout=120,
    )
    assert res.returncode == -signal.SIGKILL, res.stdout + res.stderr
    recs = parse_journal(find_unfinished(host.paths.root).path.read_text())
    assert recs[-1].type == "begin" and recs[-1].action.kind == "stop_guest"  # no UPID kept

    code, out, err = run(capsys, "recover", "--sim", str(host.dir))

    assert code == 0, out + err
    assert "waiting for CT 101 shutdown" in out + err and "undo 7: started lxc 101" in out + err, out + err
    _settled(host)
    assert applysim.diff(before, applysim.fingerprint(host)) == [], out + err
    _history_says_rolled_back(host, capsys)


@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGTERM])
def test_a_signal_right_after_the_journals_first_record_rolls_back_and_closes_it(template, tmp_path, signum):
    """The signal lands once the journal's header is on disk, before the runner that rolls back
    exists: it waits for the runner, the apply ends ``rolled back`` with the signal's exit code and
    the journal is closed (nothing for ``gputopo recover``), the host as before."""
    host = applysim.copy_host(template, tmp_path / "sim")
    spec = host.dir / "spec.yaml"
    spec.write_text(applysim.restarting(applysim.seed_spec_text(host)))
    before = applysim.fingerprint(host)

    res = subprocess.run(
        [sys.executable, str(DRIVER), *_argv(host, spec)],
        capture_output=True,
        text=True,
        env={**os.environ, "GPUTOPO_CRASH_AT": "record:1", "GPUTOPO_CRASH_SIGNAL": signum.name[3:]},
        timeout=120,
    )

    assert res.returncode == EXIT[signum], res.stdout + res.stderr
    assert res.stderr.splitlines()[-1].endswith("rolled back"), res.stdout + res.stderr
    assert "gputopo: interrupted" not in res.stderr, res.stderr
    assert find_unfinished(host.paths.root) is None, res.stdout + res.stderr
    assert applysim.diff(before, applysim.fingerprint(host)) == []
