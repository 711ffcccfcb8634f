"""PctExec: the argv it hands to pct, timeouts and failures, with an injected runner."""

import os
import subprocess

import pytest

from gputopo.adapters.pct import PctExec
from gputopo.errors import ExecError
from gputopo.ports import ExecPort


class FakeRunner:
    """pct as a subprocess runner: records argv; push stores the file, `exec -- cat` reads it.

    ``push_lies``: pct push exits 0 but the file never arrives (a failed worker whose exit
    status says nothing).
    """

    def __init__(self, rc=0, stdout="", stderr="", timeout=False, missing=False, push_lies=False):
        self.calls = []
        self.rc, self.stdout, self.stderr = rc, stdout, stderr
        self.timeout, self.missing, self.push_lies = timeout, missing, push_lies
        self.pushed = None
        self.files: dict[str, str] = {}

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
            if self.rc == 0 and not self.push_lies:
                self.files[cmd[4]] = self.pushed[0]
        if cmd[1] == "exec" and cmd[4:5] == ["cat"]:
            path = cmd[5]
            if path not in self.files:
                return subprocess.CompletedProcess(cmd, 1, "", f"cat: {path}: No such file or directory\n")
            return subprocess.CompletedProcess(cmd, 0, self.files[path], "")
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


def test_push_reads_back_and_refuses_a_push_that_exited_0_but_wrote_nothing():
    r = FakeRunner()
    PctExec(runner=r).push(101, "/etc/x.conf", "a\n")
    assert r.calls[1][0] == ["pct", "exec", "101", "--", "cat", "/etc/x.conf"]
    with pytest.raises(ExecError) as e:
        PctExec(runner=FakeRunner(push_lies=True)).push(101, "/etc/x.conf", "a\n")
    assert "No such file" in str(e.value) and len(str(e.value).splitlines()) == 1


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
