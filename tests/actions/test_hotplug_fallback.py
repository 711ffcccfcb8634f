"""Which refusals of a container's config PUT are failed hot-plugs (``hotplug_errors``): Proxmox's
400 whose parameter errors read ``unable to hotplug devN: ...`` (pve-container LXC/Config.pm
vmconfig_hotplug_pending, raised by API2/LXC/Config.pm update_vm), over HTTP and through pvesh;
and the fallback as ``plan --commands`` prints it."""

from __future__ import annotations

from gputopo.actions import RestartFallback, UpdateContainer
from gputopo.actions.container import hotplug_errors
from gputopo.actions.shell import CommandContext
from gputopo.adapters.pvesh import parse_pvesh_error
from gputopo.errors import ProxmoxError
from gputopo.model.state import ContainerState, CurrentState

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


def _commands(**kw) -> list[str]:
    cur = CurrentState(containers={101: ContainerState(config={"dev0": "/dev/nvidia0"})})
    return UpdateContainer(vmid=101, **kw).commands(CommandContext(facts=None, current=cur, node="pve1"))


def test_the_commands_of_a_live_addition_say_what_to_do_when_its_hot_plug_is_refused():
    fallback = RestartFallback(shutdown_timeout=90, force_stop=True)
    assert _commands(set={"dev1": "/dev/nvidia1"}, live=True, fallback=fallback) == [
        "pct set 101 --dev1 /dev/nvidia1",
        "# if it answers 'unable to hotplug devN: ...' (nothing written): pct shutdown 101 --timeout 90 "
        "--forceStop 1, the pct set above again, pct start 101",
    ]
    # policy.hotplug_failure: rollback, or a removal only: nothing to fall back to
    assert _commands(set={"dev1": "/dev/nvidia1"}, live=True) == ["pct set 101 --dev1 /dev/nvidia1"]
    assert _commands(delete=["dev0"], live=True, fallback=fallback) == ["pct set 101 --delete dev0"]


def test_the_undo_commands_of_a_live_change_revert_what_it_left_pending_first():
    cur = CurrentState(containers={101: ContainerState(config={"dev0": "/dev/nvidia0"})})
    step = UpdateContainer(vmid=101, set={"dev0": "/dev/nvidia1", "dev1": "/dev/nvidia2"}, live=True)
    undo = step.undo_commands(CommandContext(facts=None, current=cur, node="pve1"))
    # the revert comes first: Proxmox refuses a key reverted and set or deleted in one call
    assert undo[:2] == ["pct set 101 --revert dev0,dev1", "pct set 101 --dev0 /dev/nvidia0 --delete dev1"]
    # a change made on a stopped container has nothing pending to revert
    stopped = UpdateContainer(vmid=101, set={"dev1": "/dev/nvidia2"})
    assert stopped.undo_commands(CommandContext(facts=None, current=cur, node="pve1")) == [
        "pct set 101 --delete dev1"
    ]
