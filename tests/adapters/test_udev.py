"""The wait for udev after a driver change: the Binder against a simulated kernel with a udev
beside it (helpers.udevfake), the wait's rules on literal events, and pyudev's side."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from gputopo.adapters import udev
from gputopo.adapters.sysfs import Binder
from gputopo.adapters.udev import Expect, MonitorListener, UdevEvents, await_events
from gputopo.errors import UdevTimeout
from gputopo.ports import DeviceEvent, DeviceEventsPort
from gputopo.sim.kernel import SimKernel
from helpers.simkernel import ADA, ADA_AUDIO, PRO, kern, root  # noqa: F401 (fixtures)
from helpers.udevfake import FakeUdev

DELAY = 0.2  # how long udev takes with each event here


def binder_with(kern: SimKernel, u: FakeUdev, timeout: float = 5.0) -> Binder:
    return Binder(u.sysfs(kern), kern.root, timeout, events=u)


def test_fake_and_real_are_device_events_ports(root: Path) -> None:
    assert isinstance(FakeUdev(root), DeviceEventsPort) and isinstance(UdevEvents(), DeviceEventsPort)


def test_move_returns_only_after_udev_broadcast_the_bind_and_the_vfio_group(
    kern: SimKernel, root: Path
) -> None:
    u = FakeUdev(root, delay=DELAY)
    b = binder_with(kern, u)
    g = b.iommu_group_of(ADA)
    b.move_group([ADA, ADA_AUDIO], "vfio-pci", keep_override=True)
    returned = time.monotonic()
    assert b.driver_of(ADA) == "vfio-pci" and b.vfio_group_present(g)
    # the kernel sent unbind, bind for each function and the group's add; udev broadcast them later
    sent = {(e.action, e.subsystem, e.name) for e in u.kernel}
    assert {("bind", "pci", ADA), ("bind", "pci", ADA_AUDIO), ("add", "vfio", str(g))} <= sent
    last = {(e.action, e.name): at for at, e in u.broadcast}
    for key in (("bind", ADA), ("bind", ADA_AUDIO), ("add", str(g))):
        assert returned >= last[key], f"the move returned before udev processed {key}"
    assert u.listeners[0].closed


def test_move_back_waits_for_the_bind_to_nvidia(kern: SimKernel, root: Path) -> None:
    u = FakeUdev(root)
    b = binder_with(kern, u)
    b.move(PRO[0], "vfio-pci")
    u.delay = DELAY
    b.move_group([PRO[0]], None, natives={PRO[0]: "nvidia"})
    returned = time.monotonic()
    bind = [at for at, e in u.broadcast if (e.action, e.name, e.driver) == ("bind", PRO[0], "nvidia")]
    assert bind and returned >= bind[0]


def test_restore_waits_for_udev_too(kern: SimKernel, root: Path) -> None:
    u = FakeUdev(root)
    b = binder_with(kern, u)
    prev = b.move_group([PRO[1]], "vfio-pci")
    u.delay = DELAY
    b.restore(prev)
    returned = time.monotonic()
    assert b.driver_of(PRO[1]) == "nvidia"
    bind = [at for at, e in u.broadcast if (e.action, e.name, e.driver) == ("bind", PRO[1], "nvidia")]
    assert bind and returned >= bind[0]


def test_udev_never_processing_the_bind_times_out_naming_the_device(kern: SimKernel, root: Path) -> None:
    u = FakeUdev(root, held={PRO[0]})
    b = binder_with(kern, u, timeout=0.3)
    t0 = time.monotonic()
    with pytest.raises(UdevTimeout) as e:
        b.move(PRO[0], "vfio-pci")
    assert time.monotonic() - t0 >= 0.3
    text = str(e.value)
    assert "\n" not in text and f"bind of {PRO[0]}" in text and "0.3 s" in text, text
    assert e.value.exit_code == 1 and e.value.previous[PRO[0]].driver == "nvidia"
    # the kernel did bind it: only udev is behind
    assert b.driver_of(PRO[0]) == "vfio-pci"


def test_an_event_from_before_the_write_does_not_end_the_wait(kern: SimKernel, root: Path) -> None:
    u = FakeUdev(root, held={PRO[2]})
    listen = u.listen

    def listen_with_a_late_old_bind():
        lst = listen()
        u.stale(lst, "pci", PRO[2], "bind")  # an older bind of the device udev finishes now
        return lst

    u.listen = listen_with_a_late_old_bind
    b = binder_with(kern, u, timeout=0.3)
    with pytest.raises(UdevTimeout, match=f"bind of {PRO[2]}"):
        b.move(PRO[2], "vfio-pci")


def test_a_failed_rule_is_a_warning_naming_the_device(kern: SimKernel, root: Path) -> None:
    u = FakeUdev(root)
    u.failed[PRO[0]] = "a program exited 1"
    b = binder_with(kern, u)
    said = []
    b.warn = said.append
    b.move(PRO[0], "vfio-pci")
    assert said == [f"udev processed the bind of {PRO[0]} event, but a rule failed: a program exited 1"]


def test_a_move_that_changes_nothing_waits_for_nothing(kern: SimKernel, root: Path) -> None:
    u = FakeUdev(root, held={PRO[0]})
    b = binder_with(kern, u, timeout=0.3)
    b.move(PRO[0], "nvidia")  # already there
    assert u.kernel == []


def test_without_udev_a_move_does_not_wait_and_says_so_once(kern: SimKernel, root: Path, caplog) -> None:
    udev._said.clear()
    caplog.set_level(logging.DEBUG, logger="gputopo.adapters.udev")
    events = UdevEvents(str(root))  # the simulated root has no run/udev/control
    b = Binder(kern, root, 5.0, events=events)
    b.move(PRO[0], "vfio-pci")
    b.move(PRO[0], "nvidia")
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        "no udev here (no /run/udev/control: a container, or systemd-udevd is not running); "
        "driver changes do not wait for udev"
    ]


# --- the wait's rules ----------------------------------------------------------------------


class Script:
    """A listener that hands out a fixed list of events, then nothing; time is the clock's."""

    def __init__(self, events: list[DeviceEvent], clock: list[float], seqnum: int = 10):
        self.events, self.clock, self.seqnum = list(events), clock, seqnum

    def receive(self, timeout: float) -> DeviceEvent | None:
        if self.events:
            self.clock[0] += 0.01
            return self.events.pop(0)
        self.clock[0] += timeout
        return None

    def close(self) -> None:
        pass


def ev(action: str, name: str, seqnum: int, subsystem: str = "pci") -> DeviceEvent:
    return DeviceEvent(action, subsystem, name, seqnum)


def test_await_takes_the_expected_events_made_after_the_listener_started() -> None:
    clock = [0.0]
    a = "0000:01:00.0"
    events = [
        ev("bind", a, 9),
        ev("unbind", a, 11),
        ev("bind", "0000:02:00.0", 12),
        ev("add", "7", 13, "vfio"),
        ev("bind", a, 14),
    ]
    got = await_events(
        Script(events, clock), [Expect("pci", a, "bind"), Expect("vfio", "7", "add")], 5.0, lambda: clock[0]
    )
    assert {k: e.seqnum for k, e in got.items()} == {
        Expect("pci", a, "bind"): 14,
        Expect("vfio", "7", "add"): 13,
    }
    assert clock[0] < 1.0


def test_await_times_out_naming_every_event_still_awaited() -> None:
    clock = [0.0]
    with pytest.raises(UdevTimeout) as e:
        await_events(
            Script([ev("bind", "0000:01:00.0", 11)], clock),
            [
                Expect("pci", "0000:01:00.0", "bind"),
                Expect("pci", "0000:02:00.0", "unbind"),
                Expect("vfio", "12", "add"),
            ],
            2.0,
            lambda: clock[0],
        )
    assert str(e.value).startswith(
        "udev did not process the unbind of 0000:02:00.0, add of vfio group 12 events within 2 s"
    )
    assert clock[0] == pytest.approx(2.0)  # it waited the whole timeout, not longer


def test_await_with_nothing_expected_returns_at_once() -> None:
    assert await_events(Script([], [0.0]), [], 0.0) == {}


# --- pyudev's side -------------------------------------------------------------------------


class FakeMonitor:
    def __init__(self, devices):
        self.devices = list(devices)

    def poll(self, timeout=None):
        if self.devices and isinstance(self.devices[0], OSError):
            raise self.devices.pop(0)
        return self.devices.pop(0) if self.devices else None


def device(props: dict, **kw) -> SimpleNamespace:
    return SimpleNamespace(properties=props, **kw)


def test_monitor_events_become_device_events() -> None:
    ok = device(
        {"DRIVER": "vfio-pci"}, action="bind", subsystem="pci", sys_name="0000:01:00.0", sequence_number=42
    )
    bad = device(
        {"UDEV_WORKER_FAILED": "1", "UDEV_WORKER_EXIT_STATUS": "3"},
        action="bind",
        subsystem="pci",
        sys_name="0000:02:00.0",
        sequence_number=43,
    )
    lst = MonitorListener(FakeMonitor([ok, bad]), seqnum=41)
    a, b = lst.receive(1.0), lst.receive(1.0)
    assert (a.action, a.subsystem, a.name, a.seqnum, a.driver, a.failed) == (
        "bind",
        "pci",
        "0000:01:00.0",
        42,
        "vfio-pci",
        None,
    )
    assert (b.name, b.failed) == ("0000:02:00.0", "a program exited 3")
    assert lst.receive(0.0) is None


def test_listen_without_udev_is_none(tmp_path: Path) -> None:
    assert UdevEvents(str(tmp_path)).listen() is None
    assert "no /run/udev/control" in UdevEvents(str(tmp_path)).unavailable()


def test_kernel_seqnum_reads_the_kernels_counter(tmp_path: Path) -> None:
    (tmp_path / "sys/kernel").mkdir(parents=True)
    (tmp_path / "sys/kernel/uevent_seqnum").write_text("4711\n")
    assert udev.kernel_seqnum(str(tmp_path)) == 4711
    assert udev.kernel_seqnum(str(tmp_path / "none")) == 0


def test_a_monitor_that_dropped_events_waits_out_the_timeout_instead_of_crashing() -> None:
    import errno

    lst = MonitorListener(FakeMonitor([OSError(errno.ENOBUFS, "No buffer space available")]), seqnum=1)
    t0 = time.monotonic()
    assert lst.receive(0.2) is None
    assert time.monotonic() - t0 >= 0.19
