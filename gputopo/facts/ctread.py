"""Bounded reads of files inside a container through ``pct exec`` (the
:class:`gputopo.ports.ContainerFilesPort` where the container's root cannot be reached).

A read of at most 64 bytes is binary (a safetensors file's 8-byte header length): ``od -An -v
-tx1 -j OFFSET -N LENGTH``, hex back to bytes. A longer one is text (``config.json``, the index,
a header's JSON): ``tail -c +OFFSET+1 | head -c LENGTH``. Both exit 3 for a missing file, told
apart from a failing command.
"""

from __future__ import annotations

from gputopo.errors import ExecError
from gputopo.model.reads import EXEC_TIMEOUT
from gputopo.ports import ExecPort

_ABSENT = 3
_OD = '[ -e "$1" ] || exit 3; exec od -An -v -tx1 -j "$2" -N "$3" "$1"'
_TEXT = '[ -e "$1" ] || exit 3; tail -c +"$2" "$1" | head -c "$3"'


class ExecContainerFiles:
    """ContainerFilesPort over an ExecPort (``pct exec``)."""

    def __init__(self, exec: ExecPort, timeout: float = EXEC_TIMEOUT):
        self.exec = exec
        self.timeout = timeout

    def read(self, vmid: int, path: str, offset: int, length: int) -> bytes | None:
        """See :class:`gputopo.ports.ContainerFilesPort`. Raises ExecError when the command fails."""
        if length <= 64:
            argv = ["sh", "-c", _OD, "sh", path, str(offset), str(length)]
        else:
            argv = ["sh", "-c", _TEXT, "sh", path, str(offset + 1), str(length)]
        res = self.exec.run(vmid, argv, self.timeout)
        if res.rc == _ABSENT:
            return None
        if res.rc != 0:
            raise ExecError(vmid, ["od" if length <= 64 else "tail", path], res.rc, res.stderr)
        if length <= 64:
            return bytes.fromhex("".join(res.stdout.split()))
        return res.stdout.encode()
