"""Snapshots: capture exactly what discovery reads from a host root into a ``.tar.gz``.

The archive holds a root-relative tree (``sys/...``, ``proc/...``, ``dev/...``) with the
symlinks as they are, so ``tar xzf snap.tar.gz -C DIR`` gives a root that
``gputopo discover --root DIR`` reads like the live host; ``--root snap.tar.gz`` works too.

What is captured, and what never is: :mod:`gputopo.facts.snapcapture`.

The archive's first member, ``.gputopo-facts.json``, is discovery's result on the host when the
snapshot was taken, with the gputopo version that made it: a cluster plan over many snapshots
(``gputopo cluster plan --facts DIR``) reads that one member instead of unpacking and
discovering each tree (:func:`facts_of_snapshot`); a snapshot from another version is discovered
again from its tree.
"""

from __future__ import annotations

import contextlib
import json
import os
import tarfile
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path

from gputopo.errors import RootError, SnapshotError
from gputopo.facts.snapcapture import TarWriter, capture


def snapshot(root: str | Path, out_tar_gz: str | Path) -> dict[str, int]:
    """Write a snapshot of ``root`` to ``out_tar_gz``.

    Returns counts: {"pci_functions": N, "files": N, "links": N}. Raises :class:`RootError`
    when ``root`` has no ``sys/bus/pci/devices`` and :class:`SnapshotError` when the archive
    cannot be written.
    """
    root_s = os.path.abspath(str(root))
    devdir = os.path.join(root_s, "sys/bus/pci/devices")
    if not os.path.isdir(devdir):
        raise RootError(str(root), "no sys/bus/pci/devices")
    counts = {"pci_functions": 0, "files": 0, "links": 0}
    out = str(out_tar_gz)
    tmp = out + ".part"
    facts = _facts_member(root_s)
    try:
        with tarfile.open(tmp, "w:gz", format=tarfile.PAX_FORMAT, compresslevel=6) as tar:
            w = TarWriter(tar)
            if facts is not None:
                w.file(FACTS_MEMBER, facts)
            capture(root_s, w, counts)
        os.replace(tmp, out)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise SnapshotError(out, e.strerror or str(e)) from e
    return counts


FACTS_MEMBER = ".gputopo-facts.json"


def _facts_member(root: str) -> bytes | None:
    """``{"gputopo": version, "facts": discovery's result}`` of ``root``; None when discovery
    refuses it (the tree is still captured, and discovered when it is read)."""
    from gputopo import __version__
    from gputopo.errors import GputopoError
    from gputopo.facts.discover import discover

    try:
        facts = discover(root)
    except GputopoError:
        return None
    return json.dumps({"gputopo": __version__, "facts": json.loads(facts.to_json())}).encode()


def discover_opened(root: str, **options):
    """Discover ``root``: a host root directory, or a ``gputopo snapshot`` archive opened for
    the read; ``options`` go to :func:`gputopo.facts.discover.discover` (``all_vendors``,
    ``gpu_match``). The facts' ``root`` is ``root`` as given. Raises what discovery raises."""
    from gputopo.facts.discover import discover

    with opened_root(root) as r:
        facts = discover(r, **options)
    facts.root = root
    return facts


def facts_of_snapshot(path: str | Path):
    """The facts recorded in snapshot ``path`` when it was taken (its first member), or None
    when it has none or another gputopo version made them. Reads only that member."""
    from gputopo import __version__
    from gputopo.model.facts import Facts

    try:
        with tarfile.open(path, "r:gz") as tar:
            first = tar.next()
            if first is None or first.name != FACTS_MEMBER or not first.isfile():
                return None
            f = tar.extractfile(first)
            data = json.loads(f.read()) if f is not None else None
    except (tarfile.TarError, OSError, EOFError, zlib.error, ValueError):
        return None
    if (
        not isinstance(data, dict)
        or data.get("gputopo") != __version__
        or not isinstance(data.get("facts"), dict)
    ):
        return None
    # the root it was read from is the archive now (the host's root path means nothing here)
    return Facts.model_validate({**data["facts"], "root": str(path)})


def is_snapshot(path: str | Path) -> bool:
    """True when ``path`` is a file that looks like a snapshot archive (``.tar.gz``/``.tgz``)."""
    p = str(path)
    return os.path.isfile(p) and p.endswith((".tar.gz", ".tgz"))


def extract(tar_path: str | Path, dest: str | Path) -> Path:
    """Extract a snapshot into ``dest`` and return it (the root).

    Refuses members that would land outside ``dest`` (absolute paths, ``..``, links pointing
    out). Raises :class:`SnapshotError` for an unreadable or unsafe archive.
    """
    dest_p = Path(dest)
    dest_p.mkdir(parents=True, exist_ok=True)
    base = os.path.realpath(dest_p)
    try:
        with tarfile.open(tar_path, "r:*") as tar:
            members = tar.getmembers()
            for m in members:
                target = os.path.normpath(os.path.join(base, m.name))
                if os.path.isabs(m.name) or not (target + "/").startswith(base + "/"):
                    raise SnapshotError(str(tar_path), f"member {m.name!r} leaves the root")
                if m.issym():
                    lt = os.path.normpath(os.path.join(os.path.dirname(target), m.linkname))
                    if os.path.isabs(m.linkname) or not (lt + "/").startswith(base + "/"):
                        raise SnapshotError(str(tar_path), f"link {m.name!r} points outside the root")
                elif not (m.isdir() or m.isfile()):
                    raise SnapshotError(str(tar_path), f"member {m.name!r} is not a file, directory or link")
            if hasattr(tarfile, "fully_trusted_filter"):
                tar.extractall(base, members=members, filter="fully_trusted")
            else:
                tar.extractall(base, members=members)
    except (tarfile.TarError, OSError, EOFError, zlib.error) as e:  # a truncated gzip ends in EOFError
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SnapshotError(str(tar_path), f"cannot read snapshot: {first.rstrip(':')}") from e
    return dest_p


@contextlib.contextmanager
def opened_root(path: str | Path, tmp_dir: str | Path | None = None) -> Iterator[str]:
    """Yield a directory root for ``path``: the path itself, or a temporary extraction of a
    snapshot archive under ``tmp_dir`` (removed afterwards). Raises :class:`SnapshotError`
    for a bad archive."""
    if not is_snapshot(path):
        yield str(path)
        return
    with tempfile.TemporaryDirectory(prefix="gputopo-snap-", dir=tmp_dir) as tmp:
        extract(path, tmp)
        yield tmp
