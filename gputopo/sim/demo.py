"""What the demo reads inside its guests: ``nvidia-smi`` in the container and, through the QEMU
guest agent, in the VM (the flow itself is :mod:`gputopo.usecases.demo`'s)."""

from __future__ import annotations

import time

from gputopo.ports import Ports

NVIDIA_SMI_QUERY = [
    "nvidia-smi",
    "--query-gpu=index,pci.bus_id,memory.used,memory.total,utilization.gpu",
    "--format=csv,noheader",
]

GUEST_NVSMI = ["nvidia-smi", "--query-gpu=index,pci.bus_id,name,memory.total", "--format=csv,noheader"]


def guest_nvidia_smi(ports: Ports, vm: int, timeout: float = 60.0) -> str:
    """What ``nvidia-smi`` prints in VM ``vm``'s guest, run through its QEMU guest agent."""
    px = ports.proxmox
    pid = px.agent_exec(vm, GUEST_NVSMI)
    deadline = time.monotonic() + timeout
    while True:
        st = px.agent_exec_status(vm, pid)
        if st.get("exited") or time.monotonic() >= deadline:
            return str(st.get("out-data") or st.get("err-data") or "")
        time.sleep(0.1)
