"""Where the simulated containers live on the simulated network.

Container ``vmid`` has the address ``10.0.<vmid // 256>.<vmid % 256>`` (``/24``) on its ``eth0``:
the simulated Proxmox API reports it in ``GET .../lxc/{vmid}/interfaces`` and
:class:`gputopo.sim.http.SimHttp` routes requests for it to the container's endpoint.
"""

from __future__ import annotations

import re

_ADDR = re.compile(r"^10\.0\.(\d{1,3})\.(\d{1,3})$")


def container_address(vmid: int) -> str:
    return f"10.0.{(int(vmid) >> 8) & 255}.{int(vmid) & 255}"


def vmid_of_address(host: str | None) -> int | None:
    """The vmid whose container has address ``host``; None for any other host."""
    m = _ADDR.match(host or "")
    if not m:
        return None
    hi, lo = int(m.group(1)), int(m.group(2))
    if hi > 255 or lo > 255:
        return None
    return (hi << 8) | lo
