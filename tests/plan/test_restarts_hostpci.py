"""The running VMs the plan stops and starts again around a rebind (``plan.restarts.
guest_restarts``), whatever the order of the items in their ``hostpciN`` values."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gputopo.model.state import CurrentState, GuestState, MappingState
from gputopo.plan.restarts import guest_restarts


def _stopped(hostpci0: str, rebinding: set[str]) -> list[int]:
    node = SimpleNamespace(name="pve1", vms=SimpleNamespace(guests=[]))
    current = CurrentState(
        guests={301: GuestState(status="running", hostpci=[hostpci0])},
        mappings={"vmgpus": MappingState(map=["node=pve1,path=0000:81:00.0"])},
    )
    stops, starts = guest_restarts(node, current, {}, set(), rebinding)
    assert [s.vmid for s in starts] == [s.vmid for s in stops]
    return [s.vmid for s in stops]


@pytest.mark.parametrize(
    "hostpci0",
    [
        "mapping=vmgpus,pcie=1",
        "pcie=1,mapping=vmgpus",
        "x-vga=1,host=81:00.0",
        "pcie=1,81:00.0",
        "pcie=1,0000:81:00",
        "future-key=1,host=0000:91:00.0;0000:81:00.0",
    ],
)
def test_a_running_vm_on_a_rebound_device_restarts(hostpci0):
    assert _stopped(hostpci0, {"0000:81:00.0"}) == [301]


@pytest.mark.parametrize("hostpci0", ["pcie=1,mapping=other", "pcie=1,91:00.0"])
def test_a_running_vm_elsewhere_keeps_running(hostpci0):
    assert _stopped(hostpci0, {"0000:81:00.0"}) == []
