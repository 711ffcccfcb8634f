"""What apply and recover say and exit with when things go wrong, through the command line:
a rollback that could not complete exits 3 (what ``history`` calls needs-human) naming what is
left and the next command, a Ctrl-C included; read-only host files are a preflight refusal (exit
2, nothing changed); Ctrl-C at the confirmation prompt exits 130 (a real terminal); ``recover
--dry-run`` lists what recover then does, changing nothing."""

from __future__ import annotations

import json
import os
import pty
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from gputopo.apply.journal import find_unfinished, list_journals, parse_journal
from gputopo.sim.container import break_container, heal_container
from helpers import TESTS, applysim
from helpers.applysim import template  # noqa: F401 (fixtures)
from helpers.cli import run

pytestmark = pytest.mark.slow  # every test applies on a simulated host (seconds each); the full run only

DRIVER = TESTS / "helpers" / "crashdriver.py"
SERVICE_ERROR = (
    "CT 101: systemctl is-active sglang.service exited 3: sglang.service is failed: see "
    '"systemctl status sglang.service" and "journalctl -xeu sglang.service" for details'
)
FIX_SERVICE = "find why sglang.service in CT 101 did not start, fix it, then run 'gputopo recover'"


@pytest.fixture
def host(template):
    base = Path(tempfile.mkdtemp(prefix="gputopo-words-", dir=applysim.fast_tmp()))
    h = applysim.copy_host(template, base / "sim")
    h.ports()
    (h.dir / "spec.yaml").write_text(applysim.seed_spec_text(h))
    yield h
    h.stop()
    applysim.cleanup(base)


def _apply(host, *more: str) -> list[str]:
    return ["apply", "--sim", str(host.dir), "--spec", str(host.dir / "spec.yaml"), *more]


def _errors(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("gputopo: error:")]


def _history_last(capsys, host) -> dict:
    code, out, err = run(capsys, "history", "--sim", str(host.dir), "--json")
    assert code == 0, err
    return json.loads(out)["applies"][-1]


def test_a_rollback_whose_service_does_not_start_again_exits_3_with_the_next_step(capsys, host):
    """The new service does not start, and neither does the old one: the rollback cannot bring
    back what ran, the journal stays open (history: needs-human), so the apply exits 3, not 1,
    and says what to fix and what to run; after the fix, recover settles it."""
    before = applysim.fingerprint(host)
    break_container(host.dir, 101, "service_fails")
    code, _, err = run(capsys, *_apply(host, "--yes", "--no-verify"))
    assert code == 3, err
    assert _errors(err) == [
        "gputopo: error: apply failed at step 12 (CT 101: start sglang.service (after systemctl "
        f"daemon-reload)): {SERVICE_ERROR}; NOT fully rolled back (sglang.service in CT 101 did not "
        f"start again); {FIX_SERVICE}"
    ]
    last = _history_last(capsys, host)
    assert last["outcome"] == "needs-human"
    assert last["reason"] == (
        f"needs a human; sglang.service in CT 101 did not start again: {SERVICE_ERROR}; {FIX_SERVICE}"
    )
    # the next apply is refused with the same next step
    code, _, err = run(capsys, *_apply(host, "--yes", "--no-verify"))
    assert code == 2 and _errors(err)[0].endswith(f"; {FIX_SERVICE}"), err
    heal_container(host.dir, 101)
    code, out, err = run(capsys, "recover", "--sim", str(host.dir))
    assert code == 0 and out.splitlines()[-1].startswith("recovered: "), err
    assert applysim.diff(before, applysim.fingerprint(host)) == []


def test_the_steps_of_a_service_left_down_are_undo_incomplete_not_undo_done(capsys, host):
    """A rollback that could not start the service again leaves the steps that stopped and
    started it ``undo-incomplete``, naming the service left down, in ``apply --json`` and in
    ``history show``; the steps whose undo held stay ``undo-done``."""
    break_container(host.dir, 101, "service_fails")
    code, out, err = run(capsys, *_apply(host, "--yes", "--no-verify", "--json"))
    assert code == 3, err
    steps = {s["description"]: s for s in json.loads(out)["steps"]}
    stop, start = (
        steps["CT 101: stop sglang.service"],
        steps["CT 101: start sglang.service (after systemctl daemon-reload)"],
    )
    left = f"left down: sglang.service in CT 101 did not start again: {SERVICE_ERROR}"
    assert stop["status"] == start["status"] == "undo-incomplete"
    assert stop["warnings"] == start["warnings"] == [left]
    assert {s["status"] for d, s in steps.items() if "sglang" not in d} == {"undo-done"}
    code, out, err = run(capsys, "history", "show", "last", "--sim", str(host.dir), "--json")
    assert code == 0, err
    shown = {s["description"]: s for s in json.loads(out)["steps"]}
    assert shown["CT 101: stop sglang.service"]["status"] == "undo-incomplete"
    assert shown["CT 101: stop sglang.service"]["undo"] == left
    assert {s["status"] for d, s in shown.items() if "sglang" not in d} == {"undo-done"}
    code, out, err = run(capsys, "history", "show", "last", "--sim", str(host.dir))
    assert code == 0, err
    assert "CT 101: stop sglang.service: undo-incomplete" in out and f"undo: {left}" in out, out
    # once the service is fixed, recover starts it: no step is left down any more
    heal_container(host.dir, 101)
    code, _, err = run(capsys, "recover", "--sim", str(host.dir))
    assert code == 0, err
    code, out, err = run(capsys, "history", "show", "last", "--sim", str(host.dir), "--json")
    assert {s["status"] for s in json.loads(out)["steps"]} == {"undo-done"}


def test_ctrl_c_whose_rollback_cannot_restart_the_service_exits_3_not_130(host):
    """Ctrl-C mid-switch rolls back; when the rollback cannot start the service again the
    journal stays open, and the exit is 3 with the next step, never 130 as if it were complete."""
    break_container(host.dir, 101, "service_fails")
    kernel, proc = applysim.held_apply(host)
    try:
        deadline = time.monotonic() + 120  # a bound on a broken test, not a measured window
        while time.monotonic() < deadline and proc.poll() is None:
            if any(r.type == "begin" and r.action.phase == "switch" for r in _records(host)):
                break
            time.sleep(0.02)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGINT)
        kernel.release()
        _, err = proc.communicate(timeout=120)
    finally:
        kernel.release()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 3, err
    [line] = _errors(err)
    assert line.startswith("gputopo: error: apply failed at step "), line
    assert line.endswith(
        f": interrupted (SIGINT); NOT fully rolled back (sglang.service in CT 101 did not start again: "
        f"{SERVICE_ERROR}); {FIX_SERVICE}"
    ), line
    assert find_unfinished(host.paths.root) is not None


def _records(host) -> list:
    paths = list_journals(host.paths.root)
    return parse_journal(paths[-1].read_text()) if paths else []


def _can_mount_read_only() -> bool:
    probe = tempfile.mkdtemp(dir=applysim.fast_tmp())
    try:
        res = subprocess.run(
            [
                "unshare",
                "-rm",
                "sh",
                "-c",
                f"mount --bind {probe} {probe} && mount -o remount,bind,ro {probe}",
            ],
            capture_output=True,
        )
        return res.returncode == 0
    except OSError:
        return False
    finally:
        os.rmdir(probe)


BOOT_FILES = (
    "etc/udev/rules.d/90-gputopo-vfio.rules",
    "etc/modules-load.d/gputopo-vfio.conf",
    "etc/modprobe.d/gputopo-vfio.conf",
)


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (util-linux)")
@pytest.mark.parametrize(
    "read_only, said",
    [
        (
            "etc",
            [
                f"cannot write /{path} (/{path.rsplit('/', 1)[0]}: Read-only file system): make it writable, "
                "then apply again"
                for path in BOOT_FILES
            ],
        ),
        (
            "var",
            [
                "cannot write the apply journal under /var/lib/gputopo/journal (/var: Read-only file system): "
                "make it writable, then apply again"
            ],
        ),
    ],
)
def test_a_read_only_etc_or_var_is_refused_by_preflight_and_nothing_changes(host, read_only, said):
    """/etc (the boot files) or /var (the journal) mounted read-only, a real read-only bind mount
    in a mount namespace of its own: the apply stops in preflight, exit 2, one line per file
    naming the directory and why; no step ran and no journal was written."""
    if not _can_mount_read_only():
        pytest.skip("no mount namespace here (unshare -rm refused)")
    before = applysim.fingerprint(host)
    where = host.paths.root / read_only
    where.mkdir(exist_ok=True)
    argv = " ".join([sys.executable, "-m", "gputopo", *_apply(host, "--yes", "--no-verify")])
    res = subprocess.run(
        [
            "unshare",
            "-rm",
            "sh",
            "-c",
            f"mount --bind {where} {where} && mount -o remount,bind,ro {where} && {argv}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 2, res.stderr
    assert _errors(res.stderr) == [f"gputopo: error: {line}" for line in said]
    assert "[ 1/" not in res.stderr  # no step began
    assert list_journals(host.paths.root) == []
    assert applysim.diff(before, applysim.fingerprint(host)) == []


def _reading_its_terminal(pid: int) -> bool:
    """True when process ``pid`` sleeps in a read of its terminal (the tty driver's wait). A key
    typed before that can be lost: its SIGINT may land between the prompt's write and the read,
    which then blocks (CPython runs its handler at once, but nothing interrupts a read that had
    not begun). A person is never that fast; a test is."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        wchan = Path(f"/proc/{pid}/wchan").read_text().strip()
    except OSError:
        return False
    return state == "S" and wchan in ("wait_woken", "n_tty_read")


def _in_a_terminal(
    argv: list[str], key: bytes, prompt: bytes = b"Apply these changes? [y/N]:"
) -> tuple[int, str]:
    """Run ``gputopo ARGV`` on a new pseudo-terminal (its controlling terminal, as a login shell
    has) and type ``key`` once it waits at ``prompt``; (exit code, everything it printed). A
    child that does not end in time prints its threads' stacks (faulthandler) and is killed."""
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}
    pid, fd = pty.fork()
    if pid == 0:  # the child: exec at once
        os.execvpe(sys.executable, [sys.executable, "-m", "gputopo", *argv], env)
    seen = b""
    sent = aborted = False
    status = None
    deadline = time.monotonic() + 300  # a bound on a broken test, not a measured window
    while status is None:
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            status = st
        elif time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL if aborted else signal.SIGABRT)  # SIGABRT: the stacks first
            aborted, deadline = True, time.monotonic() + 10
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                seen += os.read(fd, 65536)
            except OSError:  # EIO: the child closed the terminal
                pass
        if not sent and prompt in seen and _reading_its_terminal(pid):
            os.write(fd, key)  # the terminal turns ^C into SIGINT for its foreground process
            sent = True
    os.close(fd)
    text = seen.decode(errors="replace")
    assert sent and not aborted, text
    return os.waitstatus_to_exitcode(status), text


@pytest.mark.parametrize(
    "key, code, said",
    [(b"\x03", 130, "gputopo: interrupted"), (b"\x04", 2, "gputopo: aborted")],
    ids=["ctrl-c", "ctrl-d"],
)
def test_ctrl_c_at_the_prompt_exits_130_and_ctrl_d_declines(host, key, code, said):
    """At 'Apply these changes? [y/N]:' in a real terminal, Ctrl-C is an interrupt (130, as the
    exit-code table says) and Ctrl-D a declined prompt (2); either way nothing changed."""
    before = applysim.fingerprint(host)
    rc, text = _in_a_terminal(_apply(host, "--no-verify"), key)
    assert rc == code, text
    assert text.rstrip().splitlines()[-1] == said, text
    assert list_journals(host.paths.root) == []
    assert applysim.diff(before, applysim.fingerprint(host)) == []


def test_recover_dry_run_lists_what_recover_then_does_and_changes_nothing(capsys, host):
    """SIGKILL right after the first rebind began: ``recover --dry-run`` lists the undo steps in
    the order recover then runs them, then what it starts; the host and the journal stay as they
    were; the recover that follows undoes exactly those steps in that order."""
    before = applysim.fingerprint(host)
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "GPUTOPO_CRASH_AT": "record:14",
    }  # header + 6 steps x 2, a begin
    argv = _apply(host, "--yes", "--no-verify", "--timeout", "30")
    res = subprocess.run(
        [sys.executable, str(DRIVER), *argv], capture_output=True, text=True, env=env, timeout=300
    )
    assert res.returncode == -signal.SIGKILL, res.stderr
    journal = find_unfinished(host.paths.root).path
    text_before, crashed = journal.read_bytes(), applysim.fingerprint(host)
    begun = list(dict.fromkeys(r.step for r in parse_journal(text_before.decode()) if r.type == "begin"))
    assert begun[:6] == [0, 1, 2, 3, 4, 5] and len(begun) >= 7  # the prepare and stop steps, a rebind

    code, out, err = run(capsys, "recover", "--sim", str(host.dir), "--dry-run")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == f"recover would settle {journal}:" and lines[-1] == "Nothing was changed (dry run)."
    would = [ln.split(". ", 1)[1] for ln in lines[1:-1]]
    assert would[-2:] == [
        "start sglang.service in CT 101 (restarted if it runs another command line)",
        "close the journal as rolled back",
    ]
    undo = would[:-2]
    assert len(undo) == len(begun) and all(u.startswith("undo step ") for u in undo), would
    assert journal.read_bytes() == text_before
    assert applysim.diff(crashed, applysim.fingerprint(host)) == []

    code, _, err = run(capsys, "recover", "--sim", str(host.dir))
    assert code == 0, err
    records = parse_journal(journal.read_text())
    acts = records[0].actions
    done = [f"undo step {r.step + 1}: {acts[r.step].describe()}" for r in records if r.type == "undo-begin"]
    assert done == undo
    assert applysim.diff(before, applysim.fingerprint(host)) == []
