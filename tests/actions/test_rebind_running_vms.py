"""Rebind's preflight sees a running VM that passes a device of the group, whatever the order of
the items in its ``hostpciN`` value (``Rebind._running_vms``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gputopo.actions import Rebind
from gputopo.actions.base import PreflightContext
from gputopo.model.state import CurrentState, MappingState

GROUP = ["0000:81:00.0", "0000:81:00.1"]


class _Proxmox:
    def __init__(self, configs):
        self.configs = configs

    def list_guests(self, kind):
        return [{"vmid": v} for v in self.configs] if kind == "qemu" else []

    def guest_status(self, kind, vmid):
        return "running"

    def qemu_config(self, vmid):
        return dict(self.configs[vmid])


def _problems(hostpci0: str) -> list[str]:
    ctx = PreflightContext(
        facts=None,
        current=CurrentState(mappings={"vmgpus": MappingState(map=["node=pve1,path=0000:81:00.0"])}),
        ports=SimpleNamespace(proxmox=_Proxmox({301: {"hostpci0": hostpci0, "memory": 4096}})),
        actions=[],
        api_ok=True,
        driver_loaded=lambda name: True,
        holders=lambda nodes: {},
        drm_nodes=lambda addr: [],
    )
    step = Rebind(
        address=GROUP[0],
        members=GROUP,
        from_drivers={m: "nvidia" for m in GROUP},
        to_driver="vfio-pci",
    )
    return step._running_vms(ctx)


@pytest.mark.parametrize(
    "hostpci0, hits",
    [
        ("mapping=vmgpus,pcie=1", "0000:81:00.0"),
        ("pcie=1,mapping=vmgpus", "0000:81:00.0"),
        ("x-vga=1,host=81:00.0", "0000:81:00.0"),
        ("pcie=1,0000:81:00.1", "0000:81:00.1"),
        ("pcie=1,host=81:00", "0000:81:00.0, 0000:81:00.1"),
    ],
)
def test_a_running_vm_on_the_group_is_named(hostpci0, hits):
    assert _problems(hostpci0) == [
        f"VM 301 is running with {hits} (hostpci0) and the plan does not stop it; shut it down or "
        "list it in the spec's vms.guests"
    ]


@pytest.mark.parametrize("hostpci0", ["pcie=1,mapping=other", "x-vga=1,host=91:00.0"])
def test_a_running_vm_elsewhere_is_not(hostpci0):
    assert _problems(hostpci0) == []
