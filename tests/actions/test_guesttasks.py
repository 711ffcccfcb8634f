"""The guests' tasks a rollback waits for (:mod:`gputopo.actions.guesttasks`): a task still
running is waited for until its deadline, one that failed has ended, one still running at its
deadline is named; the node's running tasks that no journal kept are found by guest."""

from __future__ import annotations

import time
from types import SimpleNamespace

from gputopo.actions.context import Timeouts
from gputopo.actions.guesttasks import running_tasks, task_guest, task_name, wait_tasks
from gputopo.errors import ProxmoxError, TaskFailed, TaskTimeout

SHUT = "UPID:pve1:000186A0:000F4240:6B16475D:vzshutdown:101:root@pam:"
QM = "UPID:pve1:000186A1:000F4241:6B16475E:qmstart:201:root@pam:"
HA = "UPID:pve1:000186A2:000F4242:6B16475F:hastop:101:root@pam:"


class _Api:
    """A node whose tasks end at given times (time.time()), or fail, or cannot be read."""

    def __init__(self, ends: dict[str, float], failed=(), unreadable=(), active=None):
        self.ends, self.failed, self.unreadable = ends, set(failed), set(unreadable)
        self.active = active or {}
        self.waits: list[tuple[str, float]] = []

    def wait_task(self, upid, timeout, what=None, limit=None):
        self.waits.append((upid, timeout))
        if upid in self.unreadable:
            raise ProxmoxError(f"GET /nodes/pve1/tasks/{upid}/status", None, "connection refused")
        if time.time() + timeout < self.ends[upid]:
            time.sleep(timeout)
            raise TaskTimeout(upid, what, timeout)
        time.sleep(max(0.0, self.ends[upid] - time.time()))
        if upid in self.failed:
            raise TaskFailed(upid, "container did not stop", what)
        return "OK"

    def active_tasks(self, vmid):
        return self.active.get(vmid, [])


def _ctx(api):
    notes: list[str] = []
    ctx = SimpleNamespace(
        ports=SimpleNamespace(proxmox=api), note=notes.append, timeouts=Timeouts(guest=300.0)
    )
    return ctx, notes


def test_names_and_guests_of_tasks():
    assert task_name(SHUT) == "CT 101 shutdown" and task_guest(SHUT) == ("lxc", "101")
    assert task_name(QM) == "VM 201 start" and task_guest(QM) == ("qemu", "201")
    assert task_name(HA) == "HA resource 101 stop" and task_guest(HA) == (None, "101")
    assert task_name("UPID:pve1:1:2:3:vzdump::root@pam:") == "task UPID:pve1:1:2:3:vzdump::root@pam:"


def test_a_running_task_is_waited_for_and_said_and_one_that_ended_is_looked_at_once():
    now = time.time()
    api = _Api({SHUT: now + 0.3, QM: now - 5})
    ctx, notes = _ctx(api)
    assert wait_tasks(ctx, [(QM, now + 10), (SHUT, now + 10)]) == []
    assert time.time() >= now + 0.3  # it waited for the shutdown to end
    assert [u for u, _ in api.waits] == [QM, SHUT, SHUT]
    assert notes == [f"waiting for CT 101 shutdown (task {SHUT}): Proxmox carries it out to its end"]


def test_a_failed_task_has_ended_and_one_past_its_deadline_is_named():
    now = time.time()
    api = _Api({SHUT: now + 0.1, QM: now + 60}, failed=[SHUT])
    ctx, _ = _ctx(api)
    late = wait_tasks(ctx, [(SHUT, now + 10), (QM, now + 0.2)])
    assert late == [(QM, f"VM 201 start (task {QM}) still running at the end of its step's limit")]


def test_a_task_whose_status_cannot_be_read_is_warned_about_not_named_late():
    ctx, notes = _ctx(_Api({}, unreadable=[SHUT]))
    assert wait_tasks(ctx, [(SHUT, time.time() + 10)]) == []
    assert notes and "could not be read" in notes[0] and "connection refused" in notes[0]


def test_running_tasks_lists_those_no_journal_kept_with_a_steps_limit_from_their_start():
    backup = "UPID:pve1:00001111:00002222:6B16475A:vzdump:201:root@pam:"  # someone's backup of VM 201
    api = _Api({}, active={101: [SHUT, HA], 201: [QM, backup]})
    ctx, _ = _ctx(api)
    out = dict(running_tasks(ctx, {101, 201}, known={HA}))
    assert set(out) == {SHUT, QM}  # not the backup: no step of gputopo's started it
    # a shutdown gets twice Proxmox's default timeout and 35 s, at least the guest limit
    assert out[SHUT] == 0x6B16475D + 300.0 and out[QM] == 0x6B16475E + 300.0
