"""Discover and snapshot: read-only views of a host root (a directory, or a snapshot archive
for discover)."""

from __future__ import annotations

from dataclasses import dataclass

from gputopo.errors import ConfigError
from gputopo.model.documents import SnapshotDoc
from gputopo.model.facts import Facts
from gputopo.usecases.connect import Connection, host_root


@dataclass(frozen=True)
class DiscoverRequest:
    """``gputopo discover``: the root, which devices count as GPUs (``all_vendors``,
    ``gpu_match``: ``VENDOR[:CLASSPREFIX]`` each), and ``addresses`` to show only those."""

    conn: Connection
    addresses: tuple[str, ...] = ()
    all_vendors: bool = False
    gpu_match: tuple[str, ...] = ()


def _only(facts: Facts, addresses: tuple[str, ...]) -> list:
    """The GPUs of ``facts`` at ``addresses``. Raises ConfigError naming one that is no GPU here."""
    wanted = list(addresses)
    have = {g.address for g in facts.gpus}
    for a in wanted:
        if a not in have:
            raise ConfigError(f"{a}: not a GPU of this host (have {', '.join(sorted(have)) or 'none'})")
    return [g for g in facts.gpus if g.address in wanted]


def discover(req: DiscoverRequest) -> Facts:
    """The facts of the root (``gputopo schema facts``). Raises RootError, ConfigError."""
    from gputopo.facts.discover import parse_gpu_match
    from gputopo.facts.snapshot import discover_opened

    matches = [parse_gpu_match(v) for v in req.gpu_match] if req.gpu_match else None
    facts = discover_opened(host_root(req.conn), all_vendors=req.all_vendors, gpu_match=matches)
    if req.addresses:
        facts.gpus = _only(facts, req.addresses)
    return facts


def snapshot_path(name: str) -> str:
    """``name`` as the archive's file name: ``NAME`` without ``.tar.gz`` or ``.tgz`` gets ``.tar.gz``."""
    return name if name.endswith((".tar.gz", ".tgz")) else name + ".tar.gz"


def snapshot(conn: Connection, path: str) -> SnapshotDoc:
    """Capture what discovery reads under the root into the archive ``path`` (the caller checked
    it may be written). Raises RootError, OSError's GputopoError."""
    from gputopo.facts.snapshot import snapshot as take

    counts = take(host_root(conn), path)
    return SnapshotDoc(
        path=path, pci_functions=counts["pci_functions"], files=counts["files"], links=counts["links"]
    )
