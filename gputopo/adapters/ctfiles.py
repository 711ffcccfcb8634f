"""Files inside a running container read through its root on the node: the real
:class:`gputopo.ports.ContainerFilesPort` where the root is reachable, ``pct exec`` otherwise.

A running container's root is ``/proc/<init pid>/root`` on the node (the kernel resolves paths
there inside the container's mount namespace; lxc's ``lxc-info -n VMID -p -H`` prints the init
pid, lxc ``src/lxc/tools/lxc_info.c``). Reading there costs no process inside the container and
no hex round trip: a model's safetensors headers are read in one ``open`` each.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from gputopo.errors import ExecError, GputopoError
from gputopo.ports import ContainerFilesPort, HostCommandPort


class RootContainerFiles:
    """ContainerFilesPort over a directory per container (``root_of(vmid)``, None: not reachable),
    falling back to ``fallback`` (reads through pct exec) when it is not."""

    def __init__(self, root_of: Callable[[int], str | None], fallback: ContainerFilesPort | None = None):
        self.root_of = root_of
        self.fallback = fallback

    def read(self, vmid: int, path: str, offset: int, length: int) -> bytes | None:
        """See :class:`gputopo.ports.ContainerFilesPort`."""
        root = self.root_of(vmid)
        if root is None or not os.path.isdir(root):
            if self.fallback is None:
                raise ExecError(vmid, ["read", path], 1, "the container's root is not reachable here")
            return self.fallback.read(vmid, path, offset, length)
        full = os.path.join(root, path.lstrip("/"))
        try:
            with open(full, "rb") as f:
                f.seek(offset)
                return f.read(length)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise ExecError(vmid, ["read", path], 1, e.strerror or str(e)) from None


def proc_root(host: HostCommandPort | None, root: str = "/") -> Callable[[int], str | None]:
    """``vmid`` -> ``/proc/<init pid>/root`` under ``root`` (lxc-info through ``host``); None
    when no host command runs here or the container has no init process."""

    def root_of(vmid: int) -> str | None:
        if host is None:
            return None
        try:
            res = host.run(["lxc-info", "-n", str(int(vmid)), "-p", "-H"], 10.0)
        except GputopoError:  # lxc-info missing or failing: read through pct instead
            return None
        pid = res.stdout.strip()
        if res.rc != 0 or not pid.isdigit():
            return None
        return os.path.join(root, "proc", pid, "root")

    return root_of
