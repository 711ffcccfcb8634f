"""Discovery: read a host root (sysfs, procfs, dev) and return :class:`gputopo.model.facts.Facts`.

Read-only. Every function takes the host ``root`` (a directory holding ``sys/``, ``proc/``,
``dev/``); nothing hard-codes ``/sys``. Raw text is gathered by the ``_read*`` helpers and
handed to pure ``parse_*`` functions, which are tested with literal strings.

Public entry points:

* :func:`discover` -- everything the planner needs (GPUs, NVSwitches, host facts);
* :func:`list_pci_functions` / :func:`read_pci_function` -- plain PCI functions;
* :func:`find_holders` -- processes holding device nodes open (apply's preflight).

Model names come from the root's ``pci.ids``; on the live root ``/`` udev's hwdb (through
pyudev) names what ``pci.ids`` does not know, and the nvidia driver's "Model:" line is the last
resort. None of them is required.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal

from gputopo.errors import AddressError, RootError
from gputopo.model.facts import (
    NVIDIA_VENDOR,
    Facts,
    Gpu,
    GroupMember,
    HostFacts,
    Link,
    MemberRole,
    Modules,
    NumaNode,
    PciFunction,
    address_key,
    format_cpulist,
    normalize_address,
    parse_cpulist,
    slot_of,
)

PCI_DEVICES = "sys/bus/pci/devices"
IOMMU_GROUPS = "sys/kernel/iommu_groups"
NODE_DIR = "sys/devices/system/node"
NVIDIA_GPUS = "proc/driver/nvidia/gpus"

# Where distributions keep the PCI id database, relative to the root.
PCI_IDS_PATHS = ("usr/share/misc/pci.ids", "usr/share/hwdata/pci.ids", "usr/share/pci.ids")

DEFAULT_GPU_MATCH: list[tuple[str | None, str | None]] = [(NVIDIA_VENDOR, "0x03")]


# --- pure parsers ------------------------------------------------------------------------


def parse_hex_id(text: str | None, width: int = 4, zero_ok: bool = False) -> str | None:
    """``'0x10de\\n'`` -> ``'0x10de'``; None for missing, malformed, all-ones or all-zero ids.

    ``width`` is the number of hex digits (4 for vendor/device ids, 6 for the class).
    ``zero_ok`` keeps an all-zero id: a subsystem id of 0x0000 is a real value (Intel's X710
    reads ``8086:0000``), while a vendor or device id of 0 means the read failed.
    """
    if text is None:
        return None
    t = text.strip().lower()
    if not re.fullmatch(r"0x[0-9a-f]+", t):
        return None
    value = int(t, 16)
    if (value == 0 and not zero_ok) or value >= (1 << (4 * width)) - 1:
        return None
    return f"0x{value:0{width}x}"


def parse_subsystem_id(text: str | None) -> str | None:
    """A ``subsystem_vendor``/``subsystem_device`` attribute: like :func:`parse_hex_id`, but
    ``0x0000`` is kept."""
    return parse_hex_id(text, zero_ok=True)


def parse_int(text: str | None) -> int | None:
    """A decimal integer attribute (``'-1\\n'`` -> -1); None when missing or malformed."""
    if text is None:
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None


def parse_modules(text: str) -> set[str]:
    """Module names from ``/proc/modules`` (first field of each line)."""
    return {line.split()[0] for line in text.splitlines() if line.strip()}


def parse_iommu_mode(cmdline: str) -> str | None:
    """The IOMMU mode the kernel command line asks for: ``'pt'``, ``'off'`` or None.

    ``iommu=pt``, ``amd_iommu=pt`` or ``intel_iommu=on,pt`` => pt; ``iommu=off``,
    ``amd_iommu=off`` or ``intel_iommu=off`` => off (off wins over pt). None when the command
    line says neither.
    """
    mode = None
    for token in cmdline.split():
        key, _, value = token.partition("=")
        if key not in ("iommu", "amd_iommu", "intel_iommu"):
            continue
        values = {v.strip().lower() for v in value.split(",")}
        if "off" in values:
            return "off"
        if "pt" in values:
            mode = "pt"
    return mode


def parse_bool_param(text: str | None) -> bool | None:
    """A module parameter shown as ``Y``/``N`` or ``1``/``0``; None when missing or odd."""
    if text is None:
        return None
    t = text.strip().upper()
    if t in ("Y", "1"):
        return True
    if t in ("N", "0"):
        return False
    return None


_NV_VERSION_RE = re.compile(r"Kernel Module.*?\s(\d+\.\d+(?:\.\d+)*)\s")


def parse_nvidia_version(text: str | None) -> str | None:
    """The driver version from ``/proc/driver/nvidia/version`` (``'570.133.20'``), or None."""
    if not text:
        return None
    m = _NV_VERSION_RE.search(text + " ")
    return m.group(1) if m else None


def parse_nvidia_information(text: str) -> dict[str, str]:
    """``/proc/driver/nvidia/gpus/<bdf>/information`` -> {field: value}.

    Each line is ``Key:<spaces/tabs>value``; keys keep their spelling (``'GPU UUID'``,
    ``'Device Minor'``). Lines without a colon are ignored.
    """
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip():
            out[key.strip()] = value.strip()
    return out


def parse_reset_method(text: str | None) -> list[str] | None:
    """``'flr bus\\n'`` -> ['flr', 'bus']; None when missing; [] when empty."""
    if text is None:
        return None
    return text.split()


def parse_pci_ids(text: str, wanted: set[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """Device names from a ``pci.ids`` database for the wanted ``('10de', '2bb5')`` pairs.

    Returns {(vendor, device): name}; ids are 4 lowercase hex digits without ``0x``.
    Stops reading at the class section (``C xx``), where names are no longer device names.
    """
    want_vendors = {v for v, _ in wanted}
    names: dict[tuple[str, str], str] = {}
    vendor: str | None = None
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        if line[0] != "\t":
            if line.startswith("C "):
                break
            vid = line[:4].lower()
            vendor = vid if vid in want_vendors else None
            continue
        if vendor is None or line.startswith("\t\t"):
            continue
        did = line[1:5].lower()
        if (vendor, did) in wanted:
            names[(vendor, did)] = line[5:].strip()
    return names


# --- reading -----------------------------------------------------------------------------


def _read(path: str) -> str | None:
    """The text of a small attribute file, or None when it cannot be read."""
    try:
        with open(path, "rb") as f:
            return f.read(65536).decode("utf-8", "replace")
    except OSError:
        return None


def _strip(text: str | None) -> str | None:
    return text.strip() if text is not None else None


def _link_name(path: str) -> str | None:
    try:
        return os.path.basename(os.readlink(path))
    except OSError:
        return None


def _pci_dir(root: str | Path) -> str:
    d = os.path.join(str(root), PCI_DEVICES)
    if not os.path.isdir(d):
        raise RootError(str(root), f"no {PCI_DEVICES}")
    return d


def _listdir(path: str) -> list[str]:
    """The entries of ``path``; [] when it is missing or cannot be listed."""
    try:
        return os.listdir(path)
    except OSError:
        return []


def _addresses_in(path: str) -> dict[str, str]:
    """{normalised address: entry name} for the entries of ``path`` named like PCI addresses
    (any spelling, e.g. ``00000000:E1:00.0``); {} when ``path`` cannot be listed."""
    out: dict[str, str] = {}
    for name in _listdir(path):
        try:
            out[normalize_address(name)] = name
        except AddressError:
            continue
    return out


def _list_addresses(devdir: str) -> list[tuple[str, str]]:
    """(normalised address, directory entry name) pairs, sorted by address."""
    return sorted(_addresses_in(devdir).items(), key=lambda p: address_key(p[0]))


class _Reader:
    """Reads each attribute of a root's PCI functions at most once (discovery looks at some
    attributes of every function before it reads the GPUs whole)."""

    def __init__(self, root: str, devdir: str):
        self.root = root
        self.devdir = devdir
        self.cache: dict[tuple[str, str], str | None] = {}

    def attr(self, name: str, attr: str) -> str | None:
        """The text of ``<devdir>/<name>/<attr>``; None when it cannot be read."""
        key = (name, attr)
        if key not in self.cache:
            self.cache[key] = _read(f"{self.devdir}/{name}/{attr}")
        return self.cache[key]

    def link(self, name: str, attr: str) -> str | None:
        """The last component of the ``<devdir>/<name>/<attr>`` link; None when it is not one."""
        return _link_name(f"{self.devdir}/{name}/{attr}")


def _read_function(rd: _Reader, name: str, address: str) -> PciFunction:
    """Read the attributes of the device directory ``name`` into a PciFunction (model unset)."""
    vendor = parse_hex_id(rd.attr(name, "vendor"))
    device = parse_hex_id(rd.attr(name, "device"))
    klass = parse_hex_id(rd.attr(name, "class"), 6)
    override = _strip(rd.attr(name, "driver_override"))
    group = rd.link(name, "iommu_group")
    numa = parse_int(rd.attr(name, "numa_node"))
    return PciFunction(
        address=address,
        vendor=vendor,
        device=device,
        **{"class": klass},
        subsystem_vendor=parse_subsystem_id(rd.attr(name, "subsystem_vendor")),
        subsystem_device=parse_subsystem_id(rd.attr(name, "subsystem_device")),
        driver=rd.link(name, "driver"),
        driver_override=None if override in (None, "", "(null)") else override,
        iommu_group=int(group) if group is not None and group.isdigit() else None,
        numa_node=numa if numa is not None and numa >= 0 else None,
        readable=vendor is not None and device is not None,
    )


def list_pci_functions(root: str | Path = "/") -> list[PciFunction]:
    """Every PCI function under ``<root>/sys/bus/pci/devices``, sorted by address.

    Unreadable ids (missing, 0xffff, 0x0000) come back as None with ``readable=False``;
    ``numa_node`` -1 comes back as None; ``model`` is not looked up here.
    Raises :class:`RootError` when the root has no ``sys/bus/pci/devices``.
    """
    devdir = _pci_dir(root)
    rd = _Reader(str(root), devdir)
    return [_read_function(rd, name, addr) for addr, name in _list_addresses(devdir)]


def read_pci_function(root: str | Path, address: str) -> PciFunction | None:
    """One PCI function by address (any accepted spelling), or None when it is not there.

    Raises :class:`RootError` for a root without ``sys/bus/pci/devices`` and
    :class:`gputopo.errors.AddressError` for a malformed address.
    """
    devdir = _pci_dir(root)
    addr = normalize_address(address)
    for name in (addr, _wide_domain(addr)):
        if os.path.isdir(os.path.join(devdir, name)):
            return _read_function(_Reader(str(root), devdir), name, addr)
    return None


def _wide_domain(address: str) -> str:
    """The 8-digit-domain spelling some tools use (``00000000:01:00.0``)."""
    dom, rest = address.split(":", 1)
    return f"{int(dom, 16):08x}:{rest}"


def find_holders(root: str | Path, device_paths: list[str]) -> dict[str, list[tuple[int, str]]]:
    """Which processes hold the given device nodes open, from ``<root>/proc/<pid>/fd/*``.

    ``device_paths`` are host paths like ``/dev/nvidia3``. A link target is matched as written
    or with the root prefix removed (a simulated host may link into its root). Returns
    {path: [(pid, comm), ...]} holding only the paths that have a holder, each list sorted by
    pid and without duplicates. Processes that vanish or deny access mid-scan are skipped.
    """
    root_s = os.path.abspath(str(root))
    wanted = {os.path.normpath(p): p for p in device_paths}
    found: dict[str, set[tuple[int, str]]] = {}
    proc = os.path.join(root_s, "proc")
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit()]
    except OSError:
        return {}
    for pid in pids:
        fd_dir = os.path.join(proc, pid, "fd")
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        comm: str | None = None
        for fd in fds:
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if root_s != "/" and target.startswith(root_s + "/"):
                target = target[len(root_s):]
            key = wanted.get(os.path.normpath(target)) if target.startswith("/") else None
            if key is None:
                continue
            if comm is None:
                comm = _strip(_read(os.path.join(proc, pid, "comm"))) or "?"
            found.setdefault(key, set()).add((int(pid), comm))
    return {k: sorted(v) for k, v in found.items()}


# --- discovery ---------------------------------------------------------------------------


def parse_gpu_match(text: str) -> tuple[str | None, str | None]:
    """``'0x1234:0x03'`` / ``'1234'`` / ``':0x0302'`` -> (vendor, class prefix), lowercased.

    Empty parts mean "any". Raises :class:`gputopo.errors.InputError` for hex that is not hex.
    """
    from gputopo.errors import InputError

    vendor, _, klass = text.strip().partition(":")
    out: list[str | None] = []
    for part, what in ((vendor, "vendor"), (klass, "class prefix")):
        part = part.strip().lower()
        if not part:
            out.append(None)
            continue
        digits = part[2:] if part.startswith("0x") else part
        if not re.fullmatch(r"[0-9a-f]{1,6}", digits):
            raise InputError(f"--gpu-match {text!r}: {what} {part!r} is not hex")
        out.append("0x" + (digits.zfill(4) if what == "vendor" else digits))
    return out[0], out[1]


def _matches(vendor: str | None, klass: str | None, rules: list[tuple[str | None, str | None]]) -> bool:
    for v, c in rules:
        if v is not None and vendor != v:
            continue
        if c is not None and not (klass and klass.startswith(c)):
            continue
        return True
    return False


def _read_groups(root: str) -> dict[str, int]:
    """address -> IOMMU group number, from one listing of ``sys/kernel/iommu_groups``."""
    out: dict[str, int] = {}
    gdir = os.path.join(root, IOMMU_GROUPS)
    for g in _listdir(gdir):
        if not g.isdigit():
            continue
        for addr in _addresses_in(os.path.join(gdir, g, "devices")):
            out[addr] = int(g)
    return out


def _read_numa(root: str, warnings: list[str]) -> dict[int, set[int]]:
    out: dict[int, set[int]] = {}
    ndir = os.path.join(root, NODE_DIR)
    for n in _listdir(ndir):
        m = re.fullmatch(r"node(\d+)", n)
        if not m:
            continue
        text = _read(os.path.join(ndir, n, "cpulist"))
        try:
            out[int(m.group(1))] = parse_cpulist(text)
        except ValueError:
            warnings.append(f"{NODE_DIR}/{n}/cpulist: not a cpulist: {(text or '').strip()!r}")
            out[int(m.group(1))] = set()
    return dict(sorted(out.items()))


def numa_from_cpulist(local: set[int], nodes: dict[int, set[int]]) -> int | None:
    """The one node whose CPUs include every CPU of ``local``; None when ``local`` is empty,
    spans several nodes, or covers the CPUs of every node (a useless "all CPUs" answer)."""
    with_cpus = {n: c for n, c in nodes.items() if c}
    if not local or not with_cpus:
        return None
    if len(with_cpus) > 1 and local >= set().union(*with_cpus.values()):
        return None
    hits = [n for n, cpus in with_cpus.items() if local <= cpus]
    return hits[0] if len(hits) == 1 else None


def _load_pci_names(root: str, wanted: set[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """Names from the root's ``pci.ids``; on the live root ``/``, udev's hwdb fills the ids
    that ``pci.ids`` lacks (a distribution's ``pci.ids`` often predates the newest GPUs)."""
    names: dict[tuple[str, str], str] = {}
    for rel in PCI_IDS_PATHS:
        text = _read_big(os.path.join(root, rel)) if wanted else None
        if text is not None:
            names = parse_pci_ids(text, wanted)
            break
    missing = wanted - set(names)
    if missing and os.path.realpath(root) == "/":
        names.update(udev_hwdb_names(missing))
    return names


def _read_big(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def hwdb_modalias(vendor: str, device: str) -> str:
    """The hwdb lookup key for a PCI id: ``('10de', '2bb5')`` -> ``'pci:v000010DEd00002BB5'``."""
    return f"pci:v{int(vendor, 16):08X}d{int(device, 16):08X}"


def udev_hwdb_names(wanted: set[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """Device names (``ID_MODEL_FROM_DATABASE``) from the live host's udev hwdb, via pyudev.

    ``wanted`` holds ``('10de', '2bb5')`` pairs. Returns {pair: name} for the pairs the hwdb
    knows; {} when pyudev, libudev or a compiled hwdb (``hwdb.bin``) is unavailable. Never
    raises: a model name is a nicety, never required.
    """
    try:
        import pyudev
        from pyudev._util import udev_list_iterate

        ctx = pyudev.Context()
        # pyudev has no public hwdb API; its libudev binding declares the hwdb calls.
        lib = ctx._libudev
        hwdb = lib.udev_hwdb_new(ctx)
    except Exception:
        return {}
    if not hwdb:
        return {}
    out: dict[tuple[str, str], str] = {}
    try:
        for vendor, device in sorted(wanted):
            entry = lib.udev_hwdb_get_properties_list_entry(hwdb, hwdb_modalias(vendor, device).encode(), 0)
            props = dict(udev_list_iterate(lib, entry))
            name = props.get(b"ID_MODEL_FROM_DATABASE")
            if name:
                out[(vendor, device)] = name.decode("utf-8", "replace")
    except Exception:
        return out
    finally:
        lib.udev_hwdb_unref(hwdb)
    return out


def _nvidia_info_dirs(root: str) -> dict[str, str]:
    """normalised address -> directory name under proc/driver/nvidia/gpus."""
    return _addresses_in(os.path.join(root, NVIDIA_GPUS))


def _host_facts(root: str, groups: dict[str, int], nodes: dict[int, set[int]], warnings: list[str]) -> HostFacts:
    cmdline = (_read(os.path.join(root, "proc/cmdline")) or "").strip()
    group_count = len(set(groups.values()))
    mode = parse_iommu_mode(cmdline)
    if mode is None and group_count:
        mode = "translated"
    modules_text = _read(os.path.join(root, "proc/modules"))
    loaded = parse_modules(modules_text) if modules_text is not None else set()
    if modules_text is None:
        warnings.append("proc/modules: unreadable; modules reported as not loaded")
    vfio_groups = []
    try:
        vfio_groups = sorted(int(n) for n in os.listdir(os.path.join(root, "dev/vfio")) if n.isdigit())
    except OSError:
        pass
    nv_nodes = []
    try:
        for n in os.listdir(os.path.join(root, "dev")):
            if not n.startswith("nvidia"):
                continue
            p = os.path.join(root, "dev", n)
            if os.path.isdir(p):
                nv_nodes += [f"{n}/{c}" for c in os.listdir(p)]
            else:
                nv_nodes.append(n)
    except OSError:
        pass
    sev = parse_bool_param(_read(os.path.join(root, "sys/module/kvm_amd/parameters/sev_snp")))
    if sev is None and "kvm_amd" not in loaded and os.path.isdir(os.path.join(root, "sys/module")):
        # kvm_amd not loaded (or an Intel host): SEV-SNP cannot be active.
        sev = False if modules_text is not None else None
    return HostFacts(
        hostname=_strip(_read(os.path.join(root, "proc/sys/kernel/hostname"))),
        kernel=_strip(_read(os.path.join(root, "proc/sys/kernel/osrelease"))),
        cmdline=cmdline,
        iommu_enabled=group_count > 0,
        iommu_group_count=group_count,
        iommu_mode=mode,
        modules=Modules(**{f: f in loaded for f in Modules.model_fields}),
        sev_snp=sev,
        nvidia_driver_version=parse_nvidia_version(_read(os.path.join(root, "proc/driver/nvidia/version"))),
        numa_nodes=[NumaNode(id=n, cpulist=format_cpulist(c), has_cpus=bool(c)) for n, c in nodes.items()],
        vfio_groups=vfio_groups,
        nvidia_device_nodes=sorted(nv_nodes, key=_natural),
    )


def _natural(s: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


def _gpu_numa(
    rd: _Reader, name: str, addr: str, nodes: dict[int, set[int]], warnings: list[str]
) -> tuple[int | None, Literal["sysfs", "cpulist"] | None]:
    """(NUMA node, where it came from): sysfs ``numa_node`` when the firmware gave one, else
    the one node holding every CPU of ``local_cpulist``; (None, None) with a warning otherwise."""
    raw_numa = parse_int(rd.attr(name, "numa_node"))
    if raw_numa is not None and raw_numa >= 0:
        if nodes and raw_numa not in nodes:
            warnings.append(f"{addr}: numa_node {raw_numa} is not a node under {NODE_DIR}")
        return raw_numa, "sysfs"
    local_text = rd.attr(name, "local_cpulist")
    try:
        local = parse_cpulist(local_text)
    except ValueError:
        local = set()
    node = numa_from_cpulist(local, nodes)
    if node is not None:
        return node, "cpulist"
    warnings.append(f"{addr}: NUMA node unknown (numa_node {raw_numa if raw_numa is not None else 'missing'}, "
                    f"local_cpulist {(local_text or 'missing').strip()!r} names no single node)")
    return None, None


def _group_members(
    rd: _Reader,
    addr: str,
    group: list[str],
    ids: dict[str, tuple[str | None, str | None, str | None]],
    name_of: dict[str, str],
) -> list[GroupMember]:
    """The devices of ``group`` other than ``addr``, by address, each with its role: another
    function of the same card, a bridge, or a foreign device."""
    members = []
    for m in sorted(group, key=address_key):
        if m == addr:
            continue
        mv, md, mc = ids.get(m, (None, None, None))
        mname = name_of.get(m)
        if slot_of(m) == slot_of(addr):
            role = MemberRole.FUNCTION
        elif mc and mc.startswith("0x0604"):
            role = MemberRole.BRIDGE
        else:
            role = MemberRole.FOREIGN
        members.append(GroupMember(
            address=m, role=role, vendor=mv, device=md, **{"class": mc},
            driver=rd.link(mname, "driver") if mname else None,
            subsystem_vendor=parse_subsystem_id(rd.attr(mname, "subsystem_vendor")) if mname else None,
            subsystem_device=parse_subsystem_id(rd.attr(mname, "subsystem_device")) if mname else None,
        ))
    return members


def _add_nvidia_information(g: Gpu, root: str, info_dir: str | None, warnings: list[str]) -> None:
    """Set ``g``'s minor, UUID and (when pci.ids had none) model from the nvidia driver's
    ``information`` file under ``info_dir``; warn when a GPU on nvidia has none."""
    if info_dir is None:
        if g.driver == "nvidia":
            warnings.append(f"{g.address}: bound to nvidia but not listed under {NVIDIA_GPUS}")
        return
    text = _read(os.path.join(root, NVIDIA_GPUS, info_dir, "information"))
    if text is None:
        warnings.append(f"{g.address}: {NVIDIA_GPUS}/{info_dir}/information unreadable")
        return
    info = parse_nvidia_information(text)
    g.minor = parse_int(info.get("Device Minor"))
    g.uuid = info.get("GPU UUID") or None
    if g.model is None and info.get("Model"):
        g.model = info["Model"]


def discover(
    root: str | Path = "/",
    *,
    all_vendors: bool = False,
    gpu_match: list[tuple[str | None, str | None]] | None = None,
) -> Facts:
    """Read the host under ``root`` and return its :class:`Facts`.

    GPUs are the functions matching ``gpu_match`` ((vendor, class prefix) pairs, None = any;
    default NVIDIA display class); ``all_vendors`` adds every display-class function.
    NVIDIA NVSwitches go to ``facts.nvswitches``. Anything unreadable is null and, where it
    matters, explained in ``facts.warnings``; discovery itself does not fail on odd devices.
    Raises :class:`RootError` when ``root`` holds no ``sys/bus/pci/devices``.
    """
    root_s = str(root)
    devdir = _pci_dir(root_s)
    rules = list(gpu_match) if gpu_match is not None else list(DEFAULT_GPU_MATCH)
    if all_vendors:
        rules.append((None, "0x03"))
    warnings: list[str] = []
    rd = _Reader(root_s, devdir)
    entries = _list_addresses(devdir)
    name_of = dict(entries)
    ids: dict[str, tuple[str | None, str | None, str | None]] = {}
    by_slot: dict[str, list[str]] = {}
    gpu_addrs, nvswitch_addrs = [], []
    for addr, name in entries:
        vendor = parse_hex_id(rd.attr(name, "vendor"))
        device = parse_hex_id(rd.attr(name, "device"))
        klass = parse_hex_id(rd.attr(name, "class"), 6)
        ids[addr] = (vendor, device, klass)
        by_slot.setdefault(slot_of(addr), []).append(addr)
        if vendor is None or device is None:
            warnings.append(f"{addr}: vendor/device ids unreadable (0xffff, 0x0000 or missing); "
                            "the device may have fallen off the bus")
            continue
        if vendor == NVIDIA_VENDOR and klass and klass.startswith("0x0680"):
            nvswitch_addrs.append(addr)
        elif _matches(vendor, klass, rules):
            gpu_addrs.append(addr)

    groups = _read_groups(root_s)
    members_of: dict[int, list[str]] = {}
    for a, g in groups.items():
        members_of.setdefault(g, []).append(a)
    nodes = _read_numa(root_s, warnings)
    host = _host_facts(root_s, groups, nodes, warnings)
    if not groups:
        warnings.append(f"no IOMMU groups under {IOMMU_GROUPS}: the IOMMU is off; passthrough is impossible")
    nv_dirs = _nvidia_info_dirs(root_s)
    names = _load_pci_names(root_s, {(ids[a][0][2:], ids[a][1][2:]) for a in gpu_addrs + nvswitch_addrs})

    def full(addr: str) -> PciFunction:
        f = _read_function(rd, name_of[addr], addr)
        v, d = f.vendor, f.device
        if v and d:
            f.model = names.get((v[2:], d[2:]))
        f.iommu_group = groups.get(addr, f.iommu_group)
        return f

    gpus: list[Gpu] = []
    for addr in gpu_addrs:
        name = name_of[addr]
        base = full(addr)
        g = Gpu(**base.model_dump(by_alias=True))
        g.numa_node, g.numa_source = _gpu_numa(rd, name, addr, nodes, warnings)
        if g.iommu_group is not None:
            g.iommu_members = _group_members(rd, addr, members_of.get(g.iommu_group, []), ids, name_of)
        g.functions = [a for a in by_slot[slot_of(addr)] if a != addr]
        boot = parse_int(rd.attr(name, "boot_vga"))
        if boot is not None:
            g.boot_vga = boot == 1
        elif g.class_ and g.class_.startswith("0x03") and not g.class_.startswith("0x0300"):
            # The kernel offers boot_vga only on VGA-class functions; a 3D controller never is.
            g.boot_vga = False
        g.link = Link(
            current_speed=_strip(rd.attr(name, "current_link_speed")),
            current_width=parse_int(rd.attr(name, "current_link_width")),
            max_speed=_strip(rd.attr(name, "max_link_speed")),
            max_width=parse_int(rd.attr(name, "max_link_width")),
        )
        g.sriov_numvfs = parse_int(rd.attr(name, "sriov_numvfs"))
        g.sriov_totalvfs = parse_int(rd.attr(name, "sriov_totalvfs"))
        g.reset_method = parse_reset_method(rd.attr(name, "reset_method"))
        _add_nvidia_information(g, root_s, nv_dirs.get(addr), warnings)
        gpus.append(g)

    facts = Facts(
        root=root_s,
        gpus=gpus,
        nvswitches=[full(a) for a in nvswitch_addrs],
        host=host,
        warnings=warnings,
    )
    from gputopo.facts.tree import add_topology  # here: tree.py uses this module's pci.ids parser

    add_topology(root_s, facts)
    return facts
