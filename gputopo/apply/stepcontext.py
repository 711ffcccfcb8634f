"""The context the steps of one apply or recover share: the ports, the timeouts, the binder that
moves GPUs between drivers, and what the steps read of the host root."""

from __future__ import annotations

from pathlib import Path

from gputopo.actions import StepContext, Timeouts
from gputopo.actions.base import HaRules
from gputopo.adapters.sysfs import Binder
from gputopo.adapters.systemctl import ExecSystemd
from gputopo.apply.progress import Progress
from gputopo.facts.discover import discover
from gputopo.facts.ha import read_ha, read_placement_inputs
from gputopo.facts.modalias import native_driver
from gputopo.facts.pci import read_drm_nodes
from gputopo.facts.procfs import read_holders
from gputopo.plan.ha import plan_placement
from gputopo.ports import Ports


def step_context(ports: Ports, root: str, timeouts: Timeouts, progress: Progress) -> StepContext:
    """The context the steps of one run share (its binder keeps the devices on which a write hung,
    and waits after each move until udev has processed its events, where udev runs)."""
    binder = Binder(ports.sysfs, root, timeouts.sysfs, events=ports.udev)
    ctx = StepContext(
        ports=ports,
        root=root,
        timeouts=timeouts,
        binder=binder,
        read_minors=lambda: {g.address: g.minor for g in discover(root).gpus},
        device_present=lambda address: (Path(root) / "sys/bus/pci/devices" / address).exists(),
        native_driver=lambda address: native_driver(root, address),
        note=progress.note,
        holders=lambda paths: read_holders(root, paths),
        drm_nodes=lambda address: read_drm_nodes(root, address),
        systemd=ExecSystemd(ports, timeouts),
        ha=HaRules(read=read_ha, read_inputs=read_placement_inputs, plan=plan_placement),
    )
    binder.warn = lambda text: ctx.warn(text)  # the step's warning (the runner sets ctx.warn later)
    return ctx
