"""Snapshots: capture exactly what discovery reads from a host root into a ``.tar.gz``.

The archive holds a root-relative tree (``sys/...``, ``proc/...``, ``dev/...``) with the
symlinks as they are, so ``tar xzf snap.tar.gz -C DIR`` gives a root that
``gputopo discover --root DIR`` reads like the live host; ``--root snap.tar.gz`` works too.

What is captured: ``sys/bus/pci`` (device links, driver directories with placeholder
``bind``/``unbind``/``new_id``/``remove_id`` files and their device links), the ``sys/devices``
directories of PCI functions (a fixed list of small attributes, ``config`` up to 256 bytes, and
the ``driver``/``iommu_group``/``physfn``/``virtfnN`` links, the names of the ``infiniband``,
``net`` and ``nvme`` class devices under them as empty directories), ``sys/kernel/iommu_groups``, NUMA
nodes, the module parameters discovery reads, ``proc/cmdline``, ``proc/modules``,
``proc/driver/nvidia`` (version and per-GPU ``information``), hostname, kernel release, and
``dev/vfio/*`` and ``dev/nvidia*`` as empty placeholder files (majors/minors recorded in
``dev/.devices.json``), plus ``pci.ids`` when present.

What is never captured: BAR ``resourceN`` files, ``rom``, ``vpd`` (reads can hang or be huge),
anything written (config space is only read), ``/etc``, process environments or fd contents.

The archive's first member, ``.gputopo-facts.json``, is discovery's result on the host when the
snapshot was taken, with the gputopo version that made it: a cluster plan over many snapshots
(``gputopo cluster plan --facts DIR``) reads that one member instead of unpacking and
discovering each tree (:func:`facts_of_snapshot`); a snapshot from another version is discovered
again from its tree.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import stat
import tarfile
import tempfile
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

from gputopo.errors import RootError, SnapshotError

# Attribute files copied from each PCI function's directory (all small text files).
DEVICE_ATTRS = (
    "vendor",
    "device",
    "subsystem_vendor",
    "subsystem_device",
    "class",
    "revision",
    "numa_node",
    "local_cpulist",
    "local_cpus",
    "boot_vga",
    "driver_override",
    "current_link_speed",
    "current_link_width",
    "max_link_speed",
    "max_link_width",
    "reset_method",
    "sriov_numvfs",
    "sriov_totalvfs",
    "sriov_offset",
    "sriov_stride",
    "sriov_vf_device",
    "sriov_drivers_autoprobe",
    "enable",
    "irq",
    "resource",
    "msi_bus",
    "secondary_bus_number",
    "subordinate_bus_number",
    "uevent",
)
DEVICE_LINKS_PREFIXES = ("driver", "iommu_group", "physfn", "virtfn")
CONFIG_BYTES = 256
MAX_ATTR_BYTES = 65536

# Write-only files of a driver directory: recorded as empty placeholders, never read.
DRIVER_FILES = ("bind", "unbind", "new_id", "remove_id", "uevent")
BUS_FILES = ("drivers_probe", "rescan", "drivers_autoprobe")

HOST_FILES = (
    "proc/cmdline",
    "proc/modules",
    "proc/sys/kernel/hostname",
    "proc/sys/kernel/osrelease",
    "proc/driver/nvidia/version",
)
MODULE_PARAMS = (
    "sys/module/kvm_amd/parameters/sev_snp",
    "sys/module/kvm_amd/parameters/sev",
    "sys/module/kvm_amd/parameters/sev_es",
    "sys/module/vfio_iommu_type1/parameters/allow_unsafe_interrupts",
)
PCI_IDS = ("usr/share/misc/pci.ids", "usr/share/hwdata/pci.ids", "usr/share/pci.ids")
MANIFEST = "gputopo-snapshot.json"


class _TarWriter:
    def __init__(self, tar: tarfile.TarFile):
        self.tar = tar
        self.dirs: set[str] = set()
        self.mtime = int(time.time())

    def _parents(self, rel: str) -> None:
        parts = rel.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            d = "/".join(parts[:i])
            if d not in self.dirs:
                self.dirs.add(d)
                ti = tarfile.TarInfo(d)
                ti.type, ti.mode, ti.mtime = tarfile.DIRTYPE, 0o755, self.mtime
                self.tar.addfile(ti)

    def dir(self, rel: str) -> None:
        self._parents(rel + "/x")

    def file(self, rel: str, data: bytes, mode: int = 0o644) -> None:
        self._parents(rel)
        ti = tarfile.TarInfo(rel)
        ti.size, ti.mode, ti.mtime = len(data), mode, self.mtime
        self.tar.addfile(ti, io.BytesIO(data))

    def link(self, rel: str, target: str) -> None:
        self._parents(rel)
        ti = tarfile.TarInfo(rel)
        ti.type, ti.linkname, ti.mode, ti.mtime = tarfile.SYMTYPE, target, 0o777, self.mtime
        self.tar.addfile(ti)


def _read_limited(path: str, limit: int = MAX_ATTR_BYTES) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read(limit)
    except OSError:
        return None


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
            w = _TarWriter(tar)
            if facts is not None:
                w.file(FACTS_MEMBER, facts)
            _capture(root_s, w, counts)
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


class _Capture:
    """Copies files and links of ``root`` into the archive under their root-relative names,
    counting them; what cannot be read is left out."""

    def __init__(self, root: str, w: _TarWriter, counts: dict[str, int]):
        self.root = root
        self.w = w
        self.counts = counts

    def rel(self, path: str) -> str:
        return os.path.relpath(path, self.root)

    def copy(self, path: str, limit: int = MAX_ATTR_BYTES) -> None:
        data = _read_limited(path, limit)
        if data is not None:
            self.w.file(self.rel(path), data)
            self.counts["files"] += 1

    def link(self, path: str) -> None:
        try:
            target = os.readlink(path)
        except OSError:
            return
        self.w.link(self.rel(path), target)
        self.counts["links"] += 1


def _capture(root: str, w: _TarWriter, counts: dict[str, int]) -> None:
    c = _Capture(root, w, counts)
    _capture_pci(root, c)
    _capture_host(root, c)
    _capture_dev(root, w, counts)
    w.file(
        MANIFEST,
        json.dumps(
            {"format": 1, "source_root": root, "created": w.mtime, "pci_functions": counts["pci_functions"]},
            indent=1,
        ).encode()
        + b"\n",
    )


def _capture_pci(root: str, c: _Capture) -> None:
    """``sys/bus/pci``: device links and directories with their attributes, and drivers."""
    from gputopo.facts.files import CLASS_DEVICE_DIRS, class_devices

    w, counts, rel, copy, link = c.w, c.counts, c.rel, c.copy, c.link
    bus = os.path.join(root, "sys/bus/pci")
    devdir = os.path.join(bus, "devices")
    w.dir("sys/bus/pci/devices")
    for f in BUS_FILES:
        if os.path.exists(os.path.join(bus, f)):
            w.file(f"sys/bus/pci/{f}", b"1\n" if f == "drivers_autoprobe" else b"", 0o200)
    # PCI functions: the bus link, then the real directory with its attributes.
    for name in sorted(os.listdir(devdir)):
        p = os.path.join(devdir, name)
        link(p)
        real = os.path.realpath(p)
        if not real.startswith(os.path.join(root, "sys/devices") + "/") or not os.path.isdir(real):
            continue
        counts["pci_functions"] += 1
        w.dir(rel(real))
        for attr in DEVICE_ATTRS:
            copy(os.path.join(real, attr))
        copy(os.path.join(real, "config"), CONFIG_BYTES)
        try:
            entries = os.listdir(real)
        except OSError:
            entries = []
        for e in sorted(entries):
            if e.startswith(DEVICE_LINKS_PREFIXES) and os.path.islink(os.path.join(real, e)):
                link(os.path.join(real, e))
        for klass in CLASS_DEVICE_DIRS:  # the names discovery reads: the directories, not their contents
            for name in class_devices(real, klass):
                w.dir(rel(os.path.join(real, klass, name)))
    # Drivers: directories, placeholder control files, device and module links.
    drivers = os.path.join(bus, "drivers")
    for drv in sorted(_listdir(drivers)):
        d = os.path.join(drivers, drv)
        w.dir(rel(d))
        for f in DRIVER_FILES:
            if os.path.exists(os.path.join(d, f)):
                w.file(rel(os.path.join(d, f)), b"", 0o200)
        for e in sorted(_listdir(d)):
            if os.path.islink(os.path.join(d, e)) and (e == "module" or ":" in e):
                link(os.path.join(d, e))


def _capture_host(root: str, c: _Capture) -> None:
    """IOMMU groups, NUMA nodes, modules, the procfs files discovery reads, and pci.ids."""
    w, rel, copy, link = c.w, c.rel, c.copy, c.link
    groups = os.path.join(root, "sys/kernel/iommu_groups")
    if os.path.isdir(groups):
        w.dir("sys/kernel/iommu_groups")
    for g in sorted(_listdir(groups)):
        gd = os.path.join(groups, g)
        copy(os.path.join(gd, "type"))
        w.dir(rel(os.path.join(gd, "devices")))
        for m in sorted(_listdir(os.path.join(gd, "devices"))):
            link(os.path.join(gd, "devices", m))
    # NUMA nodes.
    nodes = os.path.join(root, "sys/devices/system/node")
    for e in sorted(_listdir(nodes)):
        p = os.path.join(nodes, e)
        if e.startswith("node") and e[4:].isdigit():
            copy(os.path.join(p, "cpulist"))
        elif e in ("online", "possible", "has_cpu", "has_memory"):
            copy(p)
    # Modules: a directory per loaded module, and the parameters discovery reads.
    modules = os.path.join(root, "sys/module")
    if os.path.isdir(modules):
        w.dir("sys/module")
    for m in sorted(_listdir(modules)):
        if m.startswith(("nvidia", "vfio", "kvm")):
            w.dir(f"sys/module/{m}")
    for p in MODULE_PARAMS:
        copy(os.path.join(root, p))
    for p in HOST_FILES:
        copy(os.path.join(root, p))
    gpus = os.path.join(root, "proc/driver/nvidia/gpus")
    for g in sorted(_listdir(gpus)):
        copy(os.path.join(gpus, g, "information"))
    for p in PCI_IDS:
        copy(os.path.join(root, p), 16 * 1024 * 1024)


def _capture_dev(root: str, w: _TarWriter, counts: dict[str, int]) -> None:
    dev = os.path.join(root, "dev")
    recorded: dict[str, list] = {}
    old = _read_limited(os.path.join(dev, ".devices.json"))
    try:
        known = json.loads(old) if old else {}
    except ValueError:
        known = {}
    names: list[str] = []
    for e in sorted(_listdir(dev)):
        p = os.path.join(dev, e)
        if e.startswith("nvidia") and os.path.isdir(p):
            names += [f"{e}/{c}" for c in sorted(_listdir(p))]
        elif e.startswith("nvidia"):
            names.append(e)
    names += [f"vfio/{e}" for e in sorted(_listdir(os.path.join(dev, "vfio")))]
    for n in names:
        p = os.path.join(dev, n)
        try:
            st = os.stat(p)
        except OSError:
            continue
        if stat.S_ISCHR(st.st_mode):
            recorded[n] = ["c", os.major(st.st_rdev), os.minor(st.st_rdev)]
        elif n in known:
            recorded[n] = known[n]
        w.file(f"dev/{n}", b"")
        counts["files"] += 1
    if os.path.isdir(dev):
        w.dir("dev")
        w.file("dev/.devices.json", json.dumps(recorded, indent=1, sort_keys=True).encode() + b"\n")


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


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
