"""What a snapshot captures of a host root, written into its archive: exactly what discovery
reads, with the symlinks as they are.

What is captured: ``sys/bus/pci`` (device links, driver directories with placeholder
``bind``/``unbind``/``new_id``/``remove_id`` files and their device links), the ``sys/devices``
directories of PCI functions (a fixed list of small attributes, ``config`` up to 256 bytes, and
the ``driver``/``iommu_group``/``physfn``/``virtfnN`` links, the names of the ``infiniband``,
``net`` and ``nvme`` class devices under them as empty directories), ``sys/kernel/iommu_groups``, NUMA
nodes, the module parameters discovery reads, ``proc/cmdline``, ``proc/modules``, ``proc/devices``,
``proc/driver/nvidia`` (version and per-GPU ``information``), hostname, kernel release, and
``dev/vfio/*`` and ``dev/nvidia*`` as empty placeholder files (majors/minors recorded in
``dev/.devices.json``), plus ``pci.ids`` when present.

What is never captured: BAR ``resourceN`` files, ``rom``, ``vpd`` (reads can hang or be huge),
anything written (config space is only read), ``/etc``, process environments or fd contents.
"""

from __future__ import annotations

import io
import json
import os
import stat
import tarfile
import time

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
    "proc/devices",
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


class TarWriter:
    """Adds files, directories and links to the archive under root-relative names, each parent
    directory once, all with the time the snapshot was taken."""

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


class _Capture:
    """Copies files and links of ``root`` into the archive under their root-relative names,
    counting them; what cannot be read is left out."""

    def __init__(self, root: str, w: TarWriter, counts: dict[str, int]):
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


def capture(root: str, w: TarWriter, counts: dict[str, int]) -> None:
    """Write what discovery reads of ``root`` into ``w``, and the manifest; ``counts`` (PCI
    functions, files, links) grows with what is written."""
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


def _capture_dev(root: str, w: TarWriter, counts: dict[str, int]) -> None:
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
