"""A rollback binds the GPUs a plan sent to vfio-pci back to nvidia in the order of the minors they
had: the driver gives each probe the lowest free minor (open-gpu-kernel-modules
``kernel-open/nvidia/nv.c`` nv_linux_assign_minor_locked), so that order gives each GPU its own
minor again (:meth:`gputopo.actions.ActionModel.undo_rank`)."""

from __future__ import annotations

from gputopo.actions import Rebind, StopGuest, UpdateContainer, undo_order

# the seed host's NUMA-1 GPUs and their minors: e1 has 7, f1 has 6 (not bus order)
MINORS = {"0000:81:00.0": 4, "0000:91:00.0": 5, "0000:e1:00.0": 7, "0000:f1:00.0": 6}


def _to_vfio(address: str, minor: int | None) -> Rebind:
    return Rebind(
        address=address,
        members=[address],
        from_drivers={address: "nvidia"},
        to_driver="vfio-pci",
        minor=minor,
    )


def test_rebinds_back_to_nvidia_go_in_the_order_of_their_old_minors() -> None:
    steps = [
        StopGuest(guest="lxc", vmid=101),
        *(_to_vfio(a, m) for a, m in MINORS.items()),
        UpdateContainer(vmid=101, delete=["dev4", "dev5", "dev6", "dev7"]),
    ]
    order = undo_order([(i, steps[i]) for i in reversed(range(len(steps)))])
    rebinds = [steps[n].address for n in order if isinstance(steps[n], Rebind)]
    assert rebinds == ["0000:81:00.0", "0000:91:00.0", "0000:f1:00.0", "0000:e1:00.0"]
    # the container's undo still waits for the drivers, the container's start comes last
    assert isinstance(steps[order[-1]], StopGuest)
    assert order.index(5) > max(order.index(n) for n in range(1, 5))


def test_without_minors_the_newest_is_undone_first() -> None:
    steps = [_to_vfio(a, None) for a in MINORS]
    order = undo_order([(i, steps[i]) for i in reversed(range(len(steps)))])
    assert order == [3, 2, 1, 0]
