"""``watch --follow``'s loop driven by a scripted event source on a made-up clock: which events
make a pass, how soon, how a burst folds into one pass, and the interval; no real udev, and no
sleeping (the clock moves only when the loop waits)."""

from __future__ import annotations

import pytest

from gputopo.watch.follow import MAX_DELAY, NoEvents, NoUdev, PciEvent, UdevEvents, follow

GPU = "0000:81:00.0"


class Script:
    """Events at given times on a clock of its own: a wait returns the next event when it comes
    within the timeout (moving the clock to it), else moves the clock by the timeout."""

    def __init__(self, events: list[tuple[float, PciEvent]], end: float):
        self.now = 0.0
        self.end = end
        self.events = sorted(events, key=lambda e: e[0])
        self.passes: list[tuple[float, str]] = []

    def clock(self) -> float:
        return self.now

    def next(self, timeout: float) -> PciEvent | None:
        assert timeout >= 0
        if self.events and self.events[0][0] <= self.now + timeout:
            t, event = self.events.pop(0)
            self.now = max(self.now, t)
            return event
        self.now += timeout
        return None

    def one_pass(self, why: str) -> None:
        self.passes.append((round(self.now, 6), why))

    def stop(self) -> bool:
        return self.now >= self.end

    def run(self, interval: float = 60.0) -> int:
        return follow(self, self.one_pass, self.stop, interval=interval, clock=self.clock)


def test_an_unbind_makes_a_pass_within_a_second():
    s = Script([(10.0, PciEvent("unbind", GPU))], end=20.0)
    assert s.run() == 2
    assert s.passes[0] == (0.0, "start")
    t, why = s.passes[1]
    assert why == f"unbind {GPU}" and 10.0 <= t <= 11.0


@pytest.mark.parametrize("action", ["bind", "unbind", "remove", "add"])
def test_each_driver_or_bus_change_makes_a_pass(action):
    s = Script([(5.0, PciEvent(action, GPU))], end=8.0)
    s.run()
    assert [why for _, why in s.passes] == ["start", f"{action} {GPU}"]


def test_other_events_make_no_pass():
    s = Script([(5.0, PciEvent("change", GPU)), (6.0, PciEvent("online", GPU))], end=30.0)
    s.run()
    assert s.passes == [(0.0, "start")]


def test_a_burst_makes_one_pass():
    # an apply rebinding one IOMMU group: unbind and bind of the GPU and its audio function
    burst = [
        (10.0 + i * 0.05, PciEvent(a, f"0000:81:00.{i % 2}"))
        for i, a in enumerate(["unbind"] * 2 + ["bind"] * 2)
    ]
    s = Script(burst, end=30.0)
    s.run()
    assert len(s.passes) == 2
    t, why = s.passes[1]
    assert why == "unbind 0000:81:00.0" and 10.15 <= t <= 11.0


def test_a_long_stream_of_events_still_gets_a_pass_within_a_second_of_each():
    times = [10.0 + i * 0.1 for i in range(40)]  # one event every 100 ms for 4 s
    s = Script([(t, PciEvent("unbind", GPU)) for t in times], end=30.0)
    s.run()
    passes = [t for t, why in s.passes if why != "start"]
    for t in times:
        assert any(t <= p <= t + 1.0 for p in passes), (t, passes)
    # ... and folds them: a pass at most every MAX_DELAY while it lasts, not one per event
    assert len(passes) <= 4.0 / MAX_DELAY + 2


def test_a_quiet_node_gets_a_pass_every_interval_counted_from_the_last_pass():
    s = Script([(10.0, PciEvent("remove", GPU))], end=150.0)
    s.run(interval=60.0)
    times = [t for t, _ in s.passes]
    assert [why for _, why in s.passes] == ["start", f"remove {GPU}", "interval", "interval"]
    assert times[2] == pytest.approx(times[1] + 60.0) and times[3] == pytest.approx(times[1] + 120.0)


def test_a_stop_ends_the_loop_before_a_burst_passes():
    s = Script([(10.0, PciEvent("unbind", GPU))], end=10.1)
    assert s.run() == 1
    assert s.passes == [(0.0, "start")]


def test_without_events_each_wait_is_the_stop_events_wait():
    waited = []
    src = NoEvents(waited.append)
    assert src.next(0.7) is None and waited == [0.7]


def test_no_udev_under_a_root_without_its_control_socket(tmp_path):
    with pytest.raises(NoUdev, match=r"no /run/udev/control"):
        UdevEvents.open(tmp_path)


class _Device:
    """What UdevEvents reads of a pyudev.Device: its action and sys_name."""

    def __init__(self, action: str, sys_name: str):
        self.action, self.sys_name = action, sys_name


class _Monitor:
    def __init__(self, devices):
        self.devices = list(devices)
        self.timeouts: list[float] = []

    def poll(self, timeout=None):
        self.timeouts.append(timeout)
        return self.devices.pop(0) if self.devices else None


def test_udev_events_are_read_from_the_monitors_devices():
    mon = _Monitor([_Device("unbind", GPU)])
    src = UdevEvents(mon)
    assert src.next(0.5) == PciEvent("unbind", GPU)
    assert src.next(0.25) is None
    assert mon.timeouts == [0.5, 0.25]
