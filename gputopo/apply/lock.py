"""The host lock: one apply (or recover) at a time on a host."""

from __future__ import annotations

import fcntl
import os
import sys
import time
from pathlib import Path
from typing import Any

from gputopo.errors import LockHeld

LOCK_PATH = "run/lock/gputopo.lock"


class HostLock:
    """``flock`` on ``<root>/run/lock/gputopo.lock``; the holder's pid, command and start time
    are written into the file so a refused apply can name it. The file itself is never removed
    (removing a lock file lets two processes lock two different files)."""

    def __init__(self, root: str | os.PathLike):
        self.path = Path(root) / LOCK_PATH
        self.fd: int | None = None

    def acquire(self) -> HostLock:
        """Take the lock or raise LockHeld naming the holder."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise LockHeld(str(self.path), holder) from None
        cmd = " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(sys.argv)) or "python"
        text = f"pid {os.getpid()} ({cmd}) since {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}\n"
        os.ftruncate(fd, 0)
        os.pwrite(fd, text.encode(), 0)
        os.fsync(fd)
        self.fd = fd
        return self

    def check(self) -> None:
        """Raise LockHeld when another process holds the lock; creates nothing."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LockHeld(str(self.path), _holder(fd)) from None
        finally:
            os.close(fd)

    def release(self) -> None:
        if self.fd is not None:
            os.ftruncate(self.fd, 0)
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> HostLock:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


def _holder(fd: int) -> str:
    return os.pread(fd, 4096, 0).decode(errors="replace").strip() or "a process that wrote no details"
