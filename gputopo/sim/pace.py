"""A real server's pace for a simulated host: the latencies an operator waits for, and
:func:`set_latencies`, which gives them to the host's kernel and tasks."""

from __future__ import annotations

from pathlib import Path

from gputopo.sim import state

# A real server's pace (seconds), used by set_latencies(): what an operator waits for.
SERVICE_STOP, SERVICE_START = 3.0, 20.0
CT_STOP, CT_START = 4.0, 6.0
VFIO_BIND, NVIDIA_BIND = 0.3, 0.5
UNBIND_MIN, UNBIND_MAX = 1.0, 3.0
# A guest OS's own shutdown after Proxmox's ACPI powerdown (qmshutdown): its services stop, its
# filesystems sync and unmount. Seconds to tens of seconds: a graceful guest stop "typically takes
# 30 to 60 seconds" (HP Integrity Virtual Machines Manager 4.1 user guide, "Stopping virtual
# machines"), and Proxmox waits 60 s for it by default (qemu-server QemuServer.pm _do_vm_stop;
# 180 s for its start/stop order, pve-docs qm.adoc "Shutdown timeout"). 20 s is a Linux guest
# stopping its own inference server (as the container's does, 3 s) and the rest of its units.
VM_SHUTDOWN = 20.0
# The HA manager's delay between a hastart/hastop task's OK and the guest's move: the CRM and
# the LRM each work in 10 s rounds (pve-ha-manager src/PVE/HA/CRM.pm / LRM.pm, $max_time = 10);
# a request waits on average half a round for each.
HA_CRM = 10.0


def set_latencies(
    root: Path,
    run: Path,
    scale: float = 1.0,
    moving: list[str] | None = None,
    vm_shutdown: float = VM_SHUTDOWN,
) -> dict[str, float]:
    """Give the host whose root is ``root`` and runtime state ``run`` a real server's pace; see
    :meth:`gputopo.sim.host.SimHost.set_latencies`."""
    from gputopo.sim.kernel import SimKernel

    moving = moving or []
    step = (UNBIND_MAX - UNBIND_MIN) / max(1, len(moving) - 1)
    unbind = {a: UNBIND_MIN + i * step for i, a in enumerate(moving)}
    SimKernel(str(root)).configure(
        time_scale=scale,
        latency={"vfio-pci.bind": VFIO_BIND, "nvidia.bind": NVIDIA_BIND, "nvidia.unbind": UNBIND_MIN},
        address_latency={a: {"unbind": v} for a, v in unbind.items()},
    )
    state.write_state(
        run,
        "latencies",
        {
            "vzshutdown": CT_STOP * scale,
            "vzstop": CT_STOP * scale,
            "vzstart": CT_START * scale,
            "service.stop": SERVICE_STOP * scale,
            "service.start": SERVICE_START * scale,
            "qmshutdown": vm_shutdown * scale,
            "ha.crm": HA_CRM * scale,
        },
    )
    out = {
        "service.stop": SERVICE_STOP,
        "service.start": SERVICE_START,
        "ct.stop": CT_STOP,
        "ct.start": CT_START,
        "vm.shutdown": vm_shutdown,
        "ha.crm": HA_CRM,
        "vfio-pci.bind": VFIO_BIND,
        "nvidia.bind": NVIDIA_BIND,
    }
    out.update({f"unbind:{a}": v for a, v in unbind.items()})
    return out
