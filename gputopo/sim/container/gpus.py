"""The host's nvidia GPUs as a container's nvidia-smi shows them, and their memory.

A GPU's memory.total comes from its device id (:data:`MEMORY_TOTAL_MIB`). While the inference
service runs, its first ``tp`` GPUs carry what its model's load gives
(:mod:`gputopo.sim.container.footprint`, calibrated on :data:`SEED_LOAD_MIB`, the seed host's
log); a service whose model directory the simulator cannot read shows :data:`SEED_LOAD_MIB`
cycled over the GPUs and scaled to each GPU's memory.total (``round(seed * total / 97887)``);
an idle GPU shows :data:`IDLE_MIB`.
"""

from __future__ import annotations

import os
import uuid as _uuid
from dataclasses import dataclass
from pathlib import Path

from gputopo.facts.discover import parse_nvidia_information
from gputopo.model.facts import normalize_address
from gputopo.sim.container.paths import read_text

# The seed host's per-GPU load with four GPUs serving (MiB of 97887), from the operator's log.
SEED_LOAD_MIB = (79043, 78369, 78369, 78193)
SEED_TOTAL_MIB = 97887
IDLE_MIB = 1  # what nvidia-smi shows for a GPU with no context (real captures: "1MiB")

# FB memory (MiB) nvidia-smi reports per device id; others get DEFAULT_TOTAL_MIB.
MEMORY_TOTAL_MIB = {
    "0x2bb5": 97887,  # RTX PRO 6000 Blackwell Server Edition (seed host log)
    "0x2330": 81559,  # H100 80GB HBM3 (thamada capture)
    "0x2235": 46068,  # A40 (thamada capture)
    "0x26b1": 49140,  # RTX 6000 Ada
    "0x1eb8": 15360,  # Tesla T4
}
DEFAULT_TOTAL_MIB = 24576


@dataclass
class HostGpu:
    address: str
    minor: int | None
    name: str
    uuid: str
    driver: str | None
    device_id: str | None

    @property
    def memory_total(self) -> int:
        return MEMORY_TOTAL_MIB.get(self.device_id or "", DEFAULT_TOTAL_MIB)

    @property
    def nvml_bus_id(self) -> str:
        dom, bus, rest = self.address.split(":")
        return f"{int(dom, 16):08X}:{bus.upper()}:{rest.upper()}"


def host_nvidia_gpus(root: Path) -> list[HostGpu]:
    """GPUs the host's nvidia driver knows (``proc/driver/nvidia/gpus/*/information``).

    The driver of each comes from the sysfs ``driver`` link (None when unbound).
    """
    out = []
    for info in sorted((root / "proc/driver/nvidia/gpus").glob("*/information")):
        text = read_text(info)
        if text is None:
            continue  # the GPU left nvidia between the listing and the read (an unbind finishing)
        fields = parse_nvidia_information(text)
        try:
            address = normalize_address(fields.get("Bus Location") or info.parent.name)
        except Exception:
            continue
        minor = fields.get("Device Minor", "")
        dev = root / "sys/bus/pci/devices" / address
        link = dev / "driver"
        driver = os.path.basename(os.readlink(link)) if link.is_symlink() else None
        device_id = (read_text(dev / "device") or "").strip() or None
        out.append(
            HostGpu(
                address=address,
                minor=int(minor) if minor.isdigit() else None,
                name=fields.get("Model") or "NVIDIA Graphics Device",
                uuid=fields.get("GPU UUID") or f"GPU-{_uuid.uuid5(_uuid.NAMESPACE_URL, address)}",
                driver=driver,
                device_id=device_id,
            )
        )
    return out
