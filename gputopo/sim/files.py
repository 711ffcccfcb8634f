"""Replacing a file of the simulated host in one step.

Every simulator writes its files this way (runtime state, Proxmox configs, kernel attributes,
files pushed into a container): a reader in another process, or the next run after a killed
one, sees the old content or the new one, never half of it. Unlike the real host files port
(:class:`gputopo.adapters.hostfiles.RealHostFiles`) it does not fsync: a simulated host need
not survive a power cut, and its many small writes stay fast.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

# Every (non-private) file under /etc/pve reads as 0640 root:www-data, whoever wrote it: pmxcfs
# masks the mode itself (pve-cluster src/pmxcfs/pmxcfs.c cfs_fuse_getattr: 0666 from the memdb
# & 0777750 for files outside priv/).
PMXCFS_MODE = 0o640


def atomic_write(path: str | os.PathLike, text: str, mode: int | None = None) -> None:
    """Replace ``path`` with ``text`` (temp file in the same directory, then rename).

    The directory is created when missing. ``mode`` sets the file's permission bits; without it
    the file is readable by its owner only (0600). Raises OSError when the file cannot be
    written; the temp file is removed then.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        if mode is not None:
            os.fchmod(fd, mode)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
