"""Which refusals of a container's config PUT are failed hot-plugs (``hotplug_errors``): Proxmox's
400 whose parameter errors read ``unable to hotplug devN: ...`` (pve-container LXC/Config.pm
vmconfig_hotplug_pending, raised by API2/LXC/Config.pm update_vm), over HTTP and through pvesh."""

from __future__ import annotations

from gputopo.actions.container import hotplug_errors
from gputopo.adapters.pvesh import parse_pvesh_error
from gputopo.errors import ProxmoxError

CALL = "PUT /nodes/pve1/lxc/101/config"
MSG = "unable to hotplug dev4: move_mount failed: Operation not permitted"


def test_a_400_with_hotplug_errors_names_each_device_over_http():
    e = ProxmoxError(
        CALL, 400, "Parameter verification failed.", {"dev4": MSG + "\n", "dev6": MSG.replace("4", "6")}
    )
    assert hotplug_errors(e) == {"dev4": MSG, "dev6": MSG.replace("4", "6")}


def test_the_same_refusal_through_pvesh():
    # pve-common Exception.pm stringify: "<code> <msg>" then one "key: msg" line per error
    stderr = f"400 Parameter verification failed.\ndev4: {MSG}\n"
    e = ProxmoxError("pvesh set /nodes/pve1/lxc/101/config", *parse_pvesh_error(stderr, 255))
    assert hotplug_errors(e) == {"dev4": MSG}


def test_other_refusals_are_not_hotplug_failures():
    assert hotplug_errors(ProxmoxError(CALL, 500, "Device /dev/nvidia4 does not exist")) == {}
    assert (
        hotplug_errors(
            ProxmoxError(CALL, 400, "Parameter verification failed.", {"delete": "unknown option 'x'"})
        )
        == {}
    )
    # a hot-plug error text under another key is not that key's hot-plug
    assert hotplug_errors(ProxmoxError(CALL, 400, "Parameter verification failed.", {"dev5": MSG})) == {}
    assert hotplug_errors(ProxmoxError(CALL, 500, "detected modified configuration", {"dev4": MSG})) == {}
