"""PctExec: the argv it hands to pct, timeouts and failures, with an injected runner."""

import os
import subprocess

import pytest

from gputopo.errors import ExecError
from gputopo.exec import PctExec
from gputopo.ports import ExecPort


class FakeRunner:
    def __init__(self, rc=0, stdout="", stderr="", timeout=False, missing=False):
        self.calls = []
        self.rc, self.stdout, self.stderr = rc, stdout, stderr
        self.timeout, self.missing = timeout, missing
        self.pushed = None

    def __call__(self, cmd, **kw):
        self.calls.append((cmd, kw))
        if self.missing:
            raise FileNotFoundError(2, "No such file or directory")
        if self.timeout:
            raise subprocess.TimeoutExpired(cmd, kw["timeout"], stderr=b"partial")
        if cmd[1] == "push":
            tmp = cmd[3]
            st = os.stat(tmp)
            self.pushed = (open(tmp).read(), st.st_mode & 0o777)
        return subprocess.CompletedProcess(cmd, self.rc, self.stdout, self.stderr)


def test_is_an_exec_port():
    assert isinstance(PctExec(), ExecPort)


def test_run_argv_and_result():
    r = FakeRunner(stdout="0, 1 MiB\n")
    res = PctExec(pct="/usr/sbin/pct", runner=r).run(101, ["nvidia-smi", "-L"], timeout=7.5, input="x")
    cmd, kw = r.calls[0]
    assert cmd == ["/usr/sbin/pct", "exec", "101", "--", "nvidia-smi", "-L"]
    assert kw["timeout"] == 7.5 and kw["input"] == "x" and kw["text"] is True
    assert (res.rc, res.stdout) == (0, "0, 1 MiB\n")


def test_run_nonzero_is_returned_not_raised():
    r = FakeRunner(rc=255, stderr="container '101' not running!\n")
    res = PctExec(runner=r).run(101, ["true"], timeout=1)
    assert res.rc == 255 and "not running" in res.stderr


def test_run_timeout_raises_with_rc_none():
    with pytest.raises(ExecError) as e:
        PctExec(runner=FakeRunner(timeout=True)).run(101, ["sleep", "100"], timeout=0.1)
    assert e.value.rc is None and e.value.vmid == 101
    assert str(e.value).startswith("CT 101: sleep 100 timed out")


def test_missing_pct_binary():
    with pytest.raises(ExecError) as e:
        PctExec(pct="/nonexistent/pct", runner=FakeRunner(missing=True)).run(101, ["true"], timeout=1)
    assert e.value.rc == 127 and "/nonexistent/pct" in str(e.value)


def test_push_writes_private_temp_and_removes_it():
    r = FakeRunner()
    PctExec(runner=r).push(101, "/etc/systemd/system/sglang.service.d/tp.conf", "[Service]\n", 0o640)
    cmd, _ = r.calls[0]
    assert cmd[:3] == ["pct", "push", "101"]
    assert cmd[4:] == ["/etc/systemd/system/sglang.service.d/tp.conf", "--perms", "0640"]
    assert r.pushed == ("[Service]\n", 0o600)
    assert not os.path.exists(cmd[3])


def test_push_failure_raises_and_cleans_up():
    r = FakeRunner(rc=255, stderr="can only push files to a running CT\n")
    with pytest.raises(ExecError) as e:
        PctExec(runner=r).push(101, "/tmp/x", "y")
    assert e.value.rc == 255 and "running CT" in str(e.value)
    assert not os.path.exists(r.calls[0][0][3])


def test_push_timeout():
    with pytest.raises(ExecError) as e:
        PctExec(runner=FakeRunner(timeout=True)).push(101, "/tmp/x", "y")
    assert e.value.rc is None
