"""Which ``gputopo sim serve`` serves a simulated host directory: one at a time.

Each start of the API makes new credentials, and ``sim serve`` writes them to ``run/``'s
secret files: a second server on the same directory would replace the files the first one's
clients read. The server that serves a directory holds an exclusive ``flock`` on
``run/serve.json`` for as long as it runs, and the file names it (its pid and URL). The kernel
drops the lock when that process ends, however it ends, so a record left by a server that died
(SIGKILL, a crash) holds no lock and is taken over; a lock that is held is a process alive.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

from gputopo.errors import SimHostError

RECORD = "serve.json"


class ServeRecord:
    """The lock and record of the server of one directory (:func:`claim`)."""

    def __init__(self, fd: int, path: Path):
        self._fd = fd
        self.path = path

    def announce(self, url: str) -> None:
        """Write who serves now: this process's pid and ``url``."""
        data = json.dumps({"pid": os.getpid(), "url": url}) + "\n"
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data.encode(), 0)

    def release(self) -> None:
        """Remove the record and drop the lock (safe to call twice)."""
        if self._fd < 0:
            return
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        os.close(self._fd)  # closing the only descriptor drops the flock
        self._fd = -1


def claim(run_dir: Path, where: str, record: str = RECORD, by: str = "gputopo sim serve") -> ServeRecord:
    """Take the serving of the host whose state is in ``run_dir``. Raises SimHostError (exit 2)
    naming the server that holds it (pid, URL) while that one runs; a record whose server is
    gone is taken over. ``record`` and ``by``: another kind of server's record file and name
    (``gputopo sim cluster-ssh``)."""
    path = Path(run_dir) / record
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read(fd)
        os.close(fd)
        who = f"pid {holder.get('pid', '?')}" + (f" at {holder['url']}" if holder.get("url") else "")
        raise SimHostError(
            where,
            f"already served by '{by}' ({who}); use that one, or stop it first",
        ) from None
    return ServeRecord(fd, path)


def _read(fd: int) -> dict:
    try:
        data = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
