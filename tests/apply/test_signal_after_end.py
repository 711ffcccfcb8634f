"""A signal after an apply's last step: the change is in place and its journal closed (or about to
be), so nothing is rolled back. The command says "applied", names ``gputopo verify`` when the
signal stopped the verification, and exits 0, not with the signal's status (which reads as
"rolled back" in the exit-code table)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from gputopo.apply.document import result_document
from gputopo.apply.journal import find_unfinished, list_journals, parse_journal
from gputopo.model.documents import VerifyReport
from gputopo.usecases.apply import apply
from gputopo.usecases.readplan import read_and_plan
from helpers import TESTS, applysim
from helpers.applysim import template  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow  # applies on a simulated host, seconds each

DRIVER = TESTS / "helpers" / "crashdriver.py"


def _drive(host, spec, env: dict[str, str]) -> subprocess.CompletedProcess:
    args = ["apply", "--spec", str(spec), "--yes", "--no-verify", "--timeout", "30", "--sim", str(host.dir)]
    return subprocess.run(
        [sys.executable, str(DRIVER), *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
        timeout=300,
    )


def _end_record(template, tmp_path) -> tuple[int, dict]:
    """The journal record number of a clean apply's end, and the host it leaves."""
    host = applysim.copy_host(template, tmp_path / "probe")
    spec = host.dir / "spec.yaml"
    spec.write_text(applysim.seed_spec_text(host))
    res = _drive(host, spec, {})
    assert res.returncode == 0, res.stderr
    recs = parse_journal(list_journals(host.paths.root)[-1].read_text())
    assert recs[-1].type == "end" and recs[-1].result == "applied"
    applied = applysim.fingerprint(host)
    host.stop()
    return len(recs), applied


@pytest.mark.parametrize("name", ["INT", "TERM"])
def test_a_signal_right_after_the_journal_ends_applied_says_applied_and_exits_0(template, tmp_path, name):
    end, applied = _end_record(template, tmp_path)
    host = applysim.copy_host(template, tmp_path / "sim")
    spec = host.dir / "spec.yaml"
    spec.write_text(applysim.seed_spec_text(host))
    res = _drive(host, spec, {"GPUTOPO_CRASH_AT": f"record:{end}", "GPUTOPO_CRASH_SIGNAL": name})
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "gputopo: interrupted" not in out and "rolled back" not in out, out
    assert f"SIG{name} received after the last step: the change stays" in res.stdout, out
    assert res.stdout.rstrip().splitlines()[-1].startswith("applied in "), out
    assert find_unfinished(host.paths.root) is None
    assert applysim.diff(applied, applysim.fingerprint(host)) == []
    host.stop()


def _stopped_by(signum: int):
    """A verification that a signal stops: it sends ``signum`` to this process, then waits far
    longer than the test lets it; it never returns a report."""

    def verify() -> VerifyReport:
        os.kill(os.getpid(), signum)
        time.sleep(30)
        raise AssertionError("the signal did not stop the verification")

    return verify


@pytest.mark.parametrize("rollback_on_verify_failure", [False, True], ids=["verify-after", "verify-inside"])
def test_a_signal_during_the_verification_stops_only_it_and_the_apply_ends_applied(
    template, tmp_path, rollback_on_verify_failure
):
    host = applysim.copy_host(template, tmp_path / "sim")
    ports = host.ports()
    t0 = time.monotonic()
    try:
        spec = applysim.seed_spec(host)
        res = apply(
            spec,
            ports,
            root=host.paths.root,
            verify=_stopped_by(signal.SIGTERM),
            rollback_on_verify_failure=rollback_on_verify_failure,
        )
        _, _, again = read_and_plan(spec, ports, str(host.paths.root))
    finally:
        ports.close()
    assert time.monotonic() - t0 < 30  # the verification was stopped, not waited for
    assert res.status == "applied" and res.verify is None and res.verify_stopped == "SIGTERM"
    doc = result_document(res)
    assert doc["exit_code"] == 0 and doc["status"] == "applied"
    assert doc["warnings"][-1] == (
        "applied; SIGTERM stopped the verification before it ended: run 'gputopo verify'"
    )
    assert find_unfinished(host.paths.root) is None
    end = parse_journal(list_journals(host.paths.root)[-1].read_text())[-1]
    assert (end.type, end.result, end.verify) == (
        "end",
        "applied",
        "stopped" if rollback_on_verify_failure else None,
    )
    assert again.is_empty, again.to_text()  # the change is in place: nothing left to do
    # the handlers apply installed are gone again
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    host.stop()


class _SlowInitramfs:
    """Host commands whose update-initramfs gets ``signum`` (the operator's Ctrl-C, systemd's
    stop) while it runs."""

    def __init__(self, signum: int):
        self.signum = signum
        self.ran: list[list[str]] = []

    def run(self, argv, timeout):
        self.ran.append(list(argv))
        os.kill(os.getpid(), self.signum)
        time.sleep(30)
        raise AssertionError("the signal did not stop the command")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_during_the_boot_refresh_stops_only_it_and_lists_what_is_left(template, tmp_path, signum):
    """``apply --refresh-boot``: the apply is over when update-initramfs runs; a signal then stops
    the command and the apply still ends applied, the commands listed as still to run."""
    from gputopo.usecases.apply import boot_after

    host = applysim.copy_host(template, tmp_path / "sim")
    ports = host.ports()
    try:
        res = apply(applysim.seed_spec(host), ports, root=host.paths.root)
        assert res.status == "applied"
        ports.host = _SlowInitramfs(signum)
        notes: list[str] = []
        t0 = time.monotonic()
        boot = boot_after(res, ports, True, notes.append)
    finally:
        ports.close()
    assert time.monotonic() - t0 < 30
    assert ports.host.ran == [["update-initramfs", "-u", "-k", "all"]]
    assert boot is not None and not boot.ran and boot.text() == "update-initramfs -u -k all"
    name = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM", signal.SIGHUP: "SIGHUP"}[signum]
    assert notes[-1] == f"{name} stopped the boot refresh; the change is applied", notes
    assert signal.getsignal(signum) in (signal.SIG_DFL, signal.default_int_handler)
    host.stop()


def _count(
    host, spec, *args: str, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess, int]:
    """Run ``gputopo ARGS`` (the apply's arguments when none) through the crash driver; its result
    and how many journal records it wrote."""
    out = host.dir.parent / "count.json"
    argv = list(args) or ["apply", "--spec", str(spec), "--yes", "--no-verify", "--timeout", "30"]
    res = subprocess.run(
        [sys.executable, str(DRIVER), *argv, "--sim", str(host.dir)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "GPUTOPO_CRASH_COUNT": str(out), **(env or {})},
        timeout=300,
    )
    return res, json.loads(out.read_text())["record"] if out.exists() else 0


@pytest.mark.parametrize("finish", [True, False], ids=["finish", "rollback"])
def test_a_signal_right_after_recover_ends_the_journal_says_what_recover_did(template, tmp_path, finish):
    """SIGKILL mid-apply, then ``recover`` (or ``--finish``) gets SIGTERM right after the journal's
    end: the recovery is done, so it says "recovered:" or "finished:" and exits 0."""
    end, applied = _end_record(template, tmp_path)
    args = ["recover", "--finish"] if finish else ["recover"]
    hosts = []
    for name in ("probe-recover", "sim"):
        host = applysim.copy_host(template, tmp_path / name)
        spec = host.dir / "spec.yaml"
        spec.write_text(applysim.seed_spec_text(host))
        before = applysim.fingerprint(host)
        res = _drive(host, spec, {"GPUTOPO_CRASH_AT": f"record:{end // 2}"})
        assert res.returncode == -signal.SIGKILL and find_unfinished(host.paths.root) is not None
        hosts.append((host, spec, before))
    (probe, spec, _), (host, _, before) = hosts
    res, records = _count(probe, spec, *args)
    assert res.returncode == 0 and records > 1, res.stderr
    probe.stop()

    res, _ = _count(
        host, spec, *args, env={"GPUTOPO_CRASH_AT": f"record:{records}", "GPUTOPO_CRASH_SIGNAL": "TERM"}
    )
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "gputopo: interrupted" not in out and "SIGTERM received" in out, out
    assert ("finished:" if finish else "recovered:") in out, out
    assert find_unfinished(host.paths.root) is None
    assert applysim.diff(applied if finish else before, applysim.fingerprint(host)) == []
    host.stop()
