"""What the inference service is down for, and what apply and history say it was: the VMs that
must stop shut down before the service stops (a guest's shutdown is not the service's downtime),
the recorded stop window ends when the service is back (not when an operator ran recover hours
later), and the time an operator spends at the confirmation prompt is not the apply's."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gputopo.actions import StartService, StopGuest, StopService, stop_window
from gputopo.apply.history import record_of
from gputopo.apply.journal import (
    Begin,
    Done,
    End,
    Failed,
    Header,
    Journal,
    NeedsHuman,
    Recover,
    RestartFailed,
    UndoBegin,
    UndoDone,
)
from gputopo.facts.discover import discover
from gputopo.plan.spec import parse_spec
from gputopo.plan.starter import init_spec
from gputopo.usecases.apply import apply
from helpers import applysim
from helpers.applysim import host, template  # noqa: F401 (fixtures)

PACE = 0.05  # set_latencies' scale: the VM's guest shuts down in 20 x 0.05 = 1 s


def _consumer_split(h) -> str:
    """The seed split with VM 201 consuming the VM mapping (started by the split)."""
    return init_spec(discover(str(h.paths.root)), container_mapping="pro6000", vm=201)


def _back(text: str) -> str:
    """That split turned around: the container takes every GPU, VM 201 loses its lines."""
    return (
        text.replace("numa: [0]", "numa: [0, 1]")
        .replace("            numa: [1]", "            count: 1")
        .replace("gpus:\n            count: 1", "gpus: rest")
    )


@pytest.mark.slow
def test_a_vms_shutdown_comes_before_the_service_stops_and_outside_the_stop_window(host):
    text = _consumer_split(host)
    ports = host.ports()
    try:
        assert apply(parse_spec(text), ports, root=str(host.paths.root)).status == "applied"
        assert ports.proxmox.guest_status("qemu", 201) == "running"
        host.set_latencies(PACE)  # a guest that takes 1 s to shut down, a service 1 s to start
        res = apply(
            parse_spec(_back(text)), ports, root=str(host.paths.root), timeouts=applysim.FAST_TIMEOUTS
        )
    finally:
        ports.close()
    assert res.status == "applied"
    actions = list(res.plan.actions)
    vm_stop = next(i for i, a in enumerate(actions) if isinstance(a, StopGuest) and a.guest == "qemu")
    svc_stop = next(i for i, a in enumerate(actions) if isinstance(a, StopService))
    svc_start = next(i for i, a in enumerate(actions) if isinstance(a, StartService))
    assert vm_stop < svc_stop
    # what ran: the service stopped only once the VM was down (the journal's clock), and the
    # VM's shutdown took the guest's paced second
    records = Journal.load(res.journal).records
    began = {r.step: r.t for r in records if isinstance(r, Begin)}
    done = {r.step: r.t for r in records if isinstance(r, Done)}
    assert done[vm_stop] - began[vm_stop] >= 0.9
    assert began[svc_stop] >= done[vm_stop]
    # the stop window is the service's: from its stop to its start's end, without the VM's
    # shutdown; apply's (monotonic clock) and history's (the journal) agree
    service_down = done[svc_start] - began[svc_stop]
    assert res.stop_window_s == pytest.approx(service_down, abs=0.05)
    assert record_of(Journal.load(res.journal)).stop_window_s == pytest.approx(service_down, abs=1e-6)
    assert res.stop_window_s < max(done.values()) - began[vm_stop] - 0.9


@pytest.mark.slow
def test_the_time_at_the_prompt_is_not_in_the_apply_time(host):
    ports = host.ports()

    def slow_operator(plan) -> bool:
        time.sleep(1.0)  # reading the plan
        return True

    try:
        t0 = time.monotonic()
        res = apply(applysim.seed_spec(host), ports, root=str(host.paths.root), confirm=slow_operator)
        outside = time.monotonic() - t0
    finally:
        ports.close()
    assert res.status == "applied"
    assert res.wall_s <= outside - 1.0


# --- the recorded stop window of a journal (no host: records with their times) -------------------

STOP = StopService(vmid=101, unit="sglang.service")
STOP_VM = StopGuest(guest="qemu", vmid=201)
START = StartService(vmid=101, unit="sglang.service")


def _journal(*records) -> Journal:
    header = Header(pid=1, started=0.0, t=0.0, node="pve1", actions=[STOP_VM, STOP, START])
    return Journal(Path("x.jsonl"), [header, *records])


def _rolled_back() -> list:
    """VM stop (t 1-21), service stop (t 21-22), its start failing (t 22-30), its undo (t 30-31)."""
    return [
        Begin(step=0, action=STOP_VM, before={"status": "running"}, t=1.0),
        Done(step=0, seconds=20.0, t=21.0),
        Begin(step=1, action=STOP, before={"active": True}, t=21.0),
        Done(step=1, seconds=1.0, t=22.0),
        Begin(step=2, action=START, before={"active": False}, t=22.0),
        Failed(step=2, error="x", error_type="ExecError", t=30.0),
        UndoBegin(step=2, t=30.0),
        UndoDone(step=2, what="", t=31.0),
    ]


def test_the_window_begins_at_the_service_stop_not_at_a_vm_stop_before_it():
    assert stop_window([STOP_VM, STOP, START]) == (1, 2)
    assert stop_window([STOP_VM, StartService(vmid=101, unit="a")]) == (1, 1)
    assert stop_window([STOP_VM]) == (0, 0)  # only a VM stops: its own window
    j = _journal(
        Begin(step=0, action=STOP_VM, before={"status": "running"}, t=1.0),
        Done(step=0, seconds=20.0, t=21.0),
        Begin(step=1, action=STOP, before={"active": True}, t=21.0),
        Done(step=1, seconds=1.0, t=22.0),
        Begin(step=2, action=START, before={"active": False}, t=22.0),
        Done(step=2, seconds=10.0, t=32.0),
        End(result="applied", t=33.0),
    )
    assert record_of(j).stop_window_s == 32.0 - 21.0


def test_a_rollback_that_needed_a_human_for_a_device_ends_the_window_not_the_later_recover():
    j = _journal(
        *_rolled_back(),
        NeedsHuman(needs_human=["0000:81:00.0"], pending=[], left="a device", t=40.0),
        Recover(mode="rollback", pid=2, t=5000.0),
        End(result="rolled-back", t=5001.0),
    )
    assert record_of(j).stop_window_s == 40.0 - 21.0


def test_a_rollback_that_could_not_start_the_service_again_lasts_until_the_recover_that_did():
    j = _journal(
        *_rolled_back(),
        RestartFailed(what="101/sglang.service", error="x", t=39.0),
        NeedsHuman(needs_human=[], pending=[], left="x", t=40.0),
        Recover(mode="rollback", pid=2, t=5000.0),
        End(result="rolled-back", t=5001.0),
    )
    assert record_of(j).stop_window_s == 5001.0 - 21.0
    # a VM that did not start again is not the service's downtime
    j = _journal(
        *_rolled_back(),
        RestartFailed(what="qemu/201", error="x", t=39.0),
        NeedsHuman(needs_human=[], pending=[], left="x", t=40.0),
        Recover(mode="rollback", pid=2, t=5000.0),
        End(result="rolled-back", t=5001.0),
    )
    assert record_of(j).stop_window_s == 40.0 - 21.0
