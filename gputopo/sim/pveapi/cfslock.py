"""pmxcfs's cluster-wide locks, taken the way pve-cluster takes them.

``PVE::Cluster::cfs_lock`` (src/PVE/Cluster.pm) makes the directory
``/etc/pve/priv/lock/<lockid>``: whoever creates it holds the lock, everyone else retries every
second (a tenth of what remains of the timeout, at most 1 s) and gives up after 10 s with ``got
lock request timeout``; the directory is removed afterwards, and pmxcfs expires a lock after 120 s (a holder that died). A file's lock id is
``file-<path with . and / as _>`` (``cfs_lock_file``): ``file-mapping_pci_cfg``,
``file-ha_rules_cfg``. The simulator does the same in the shared pve root, so the API servers of
every simulated node, in any process, serialise their writes as a cluster does. The simulated
tree has no other ``priv/`` content: empty lock directories are removed again, so a pve tree
looks the same before and after a locked write.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from gputopo.sim.pveapi.answers import die

ACQUIRE_TIMEOUT = 10.0
EXPIRE = 120.0


def file_lock_id(filename: str) -> str:
    """The lock id of a file under /etc/pve: ``mapping/pci.cfg`` -> ``file-mapping_pci_cfg``."""
    return "file-" + re.sub(r"[./]", "_", filename)


@contextlib.contextmanager
def cfs_lock(
    pve_root: Path,
    lockid: str,
    what: str,
    timeout: float = ACQUIRE_TIMEOUT,
    on_wait: Callable[[str], None] | None = None,
) -> Iterator[None]:
    """Hold the cluster lock ``lockid`` for the block.

    While another holds it, ``on_wait`` gets ``trying to acquire cfs lock '<lockid>' ...`` at
    the first refusal and then at most once a second (Cluster.pm prints it on STDERR, which
    pvesh shows; the call still succeeds once the lock is free). Raises ApiError 500 ``<what>:
    cfs-lock '<lockid>' error: got lock request timeout`` when another holder keeps it longer
    than ``timeout`` seconds.
    """
    lockdir = Path(pve_root) / "priv" / "lock"
    path = lockdir / lockid
    started = time.monotonic()
    deadline = started + timeout
    said = -1  # the last whole second a wait was reported in
    while True:
        try:
            lockdir.mkdir(parents=True, exist_ok=True)
            path.mkdir()
            break
        except FileNotFoundError:
            continue  # the last holder removed the empty lock directory in between
        except FileExistsError:
            try:
                age = time.time() - path.stat().st_mtime
            except FileNotFoundError:
                continue
            if age > EXPIRE:
                with contextlib.suppress(OSError):
                    path.rmdir()
                continue
            if time.monotonic() >= deadline:
                raise die(f"{what}: cfs-lock '{lockid}' error: got lock request timeout") from None
            second = int(time.monotonic() - started)
            if on_wait is not None and second > said:
                on_wait(f"trying to acquire cfs lock '{lockid}' ...")
                said = second
            # Cluster.pm $cfs_lock sleeps min(remaining, 10) * 100 ms between tries: 1 s while
            # 10 s or more of its timeout remain, less towards the end
            waited = time.monotonic() - started
            time.sleep(min(max(timeout - int(waited), 1), 10) * 0.1)
    try:
        yield
    finally:
        release(path)


def release(path: Path) -> None:
    """Give up the lock whose directory is ``path``, and its empty parents (``priv/lock``)."""
    for d in (path, path.parent, path.parent.parent):
        try:
            d.rmdir()
        except OSError:
            break  # not empty (another holder waits in it, or real content): leave it
