"""Host facts: loaded modules, the kernel command line and IOMMU mode, IOMMU groups, NUMA
nodes, SEV-SNP, the nvidia driver version and the device nodes under ``dev/``.

Pure ``parse_*`` functions first, then the readers; every reader takes the host ``root``.
"""

from __future__ import annotations

import os

from gputopo.facts.files import addresses_in, list_dir, read_text, stripped
from gputopo.model.facts import HostFacts, Modules, NumaNode, format_cpulist, parse_cpulist

IOMMU_GROUPS = "sys/kernel/iommu_groups"
NODE_DIR = "sys/devices/system/node"


# --- pure parsers ------------------------------------------------------------------------


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


def parse_nvidia_version(text: str | None) -> str | None:
    """The driver version from ``/proc/driver/nvidia/version`` (``'570.133.20'``): the first
    word after "Kernel Module" on its line that is a dotted number; None without one."""
    for line in (text or "").splitlines():
        _, found, rest = line.partition("Kernel Module")
        if not found:
            continue
        for word in rest.split():
            parts = word.split(".")
            if len(parts) >= 2 and all(p.isascii() and p.isdigit() for p in parts):
                return word
    return None


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


def _natural(s: str) -> list:
    """Sort key: 'nvidia10' after 'nvidia9'."""
    parts: list = []
    run = ""  # the digits or the other characters read since the last change between them
    for c in s:
        if run and c.isdigit() != run[-1].isdigit():
            parts.append(int(run) if run[-1].isdigit() else run)
            run = ""
        run += c
    if run:
        parts.append(int(run) if run[-1].isdigit() else run)
    return parts


# --- reading -----------------------------------------------------------------------------


def read_groups(root: str) -> dict[str, int]:
    """address -> IOMMU group number, from one listing of ``sys/kernel/iommu_groups``."""
    out: dict[str, int] = {}
    gdir = os.path.join(root, IOMMU_GROUPS)
    for g in list_dir(gdir):
        if not g.isdigit():
            continue
        for addr in addresses_in(f"{gdir}/{g}/devices"):  # f-string: a large host has thousands
            out[addr] = int(g)
    return out


class IommuGroups:
    """The IOMMU groups of a root, ``sys/kernel/iommu_groups/<n>/devices/<address>``: the
    groups' own listings are the truth, but each is read only when asked for, since discovery
    needs the groups of its GPUs and a large host has thousands. A device's ``iommu_group``
    link says where to look first; without one, or when that group does not list the device,
    every group is read."""

    def __init__(self, root: str):
        self.root = root
        self.dir = os.path.join(root, IOMMU_GROUPS)
        self.numbers = sorted(int(g) for g in list_dir(self.dir) if g.isdigit())
        self._members: dict[int, list[str]] = {}
        self._all: dict[str, int] | None = None

    @property
    def count(self) -> int:
        """How many groups there are (the kernel removes a group with its last device)."""
        return len(self.numbers)

    def members(self, group: int) -> list[str]:
        """The addresses ``group`` lists; [] for a group that is not there."""
        if group not in self._members:
            self._members[group] = list(addresses_in(f"{self.dir}/{group}/devices"))
        return self._members[group]

    def group_of(self, address: str, hint: int | None = None) -> int | None:
        """The group that lists ``address`` (``hint`` looked at first); None when none does."""
        if hint is not None and address in self.members(hint):
            return hint
        if self._all is None:
            self._all = read_groups(self.root)
        return self._all.get(address)


def read_numa(root: str, warnings: list[str]) -> dict[int, set[int]]:
    """NUMA node -> its CPUs, from ``sys/devices/system/node/node<n>/cpulist``, by node.

    A cpulist that does not parse counts as no CPUs, with a line added to ``warnings``.
    """
    out: dict[int, set[int]] = {}
    ndir = os.path.join(root, NODE_DIR)
    for n in list_dir(ndir):
        number = n[4:]
        if not (n.startswith("node") and number.isascii() and number.isdigit()):
            continue
        text = read_text(os.path.join(ndir, n, "cpulist"))
        try:
            out[int(number)] = parse_cpulist(text)
        except ValueError:
            warnings.append(f"{NODE_DIR}/{n}/cpulist: not a cpulist: {(text or '').strip()!r}")
            out[int(number)] = set()
    return dict(sorted(out.items()))


def _read_device_nodes(root: str) -> tuple[list[int], list[str]]:
    """(VFIO group numbers under ``dev/vfio``, ``dev/nvidia*`` names with ``dir/child`` for
    directories such as ``nvidia-caps``), both sorted."""
    vfio_groups = sorted(int(n) for n in list_dir(os.path.join(root, "dev/vfio")) if n.isdigit())
    nv_nodes = []
    for n in list_dir(os.path.join(root, "dev")):
        if not n.startswith("nvidia"):
            continue
        p = os.path.join(root, "dev", n)
        if os.path.isdir(p):
            nv_nodes += [f"{n}/{c}" for c in list_dir(p)]
        else:
            nv_nodes.append(n)
    return vfio_groups, sorted(nv_nodes, key=_natural)


NVIDIA_DYNAMIC = ("nvidia-uvm", "nvidia-caps")


def parse_char_majors(text: str | None, names: tuple[str, ...] = NVIDIA_DYNAMIC) -> dict[str, int]:
    """name -> major of each of ``names`` in ``/proc/devices`` text (its "Character devices:"
    section, fs/char_dev.c chrdev_show). These majors are dynamic (alloc_chrdev_region in
    open-gpu-kernel-modules kernel-open/nvidia-uvm/uvm.c l.1136 and kernel-open/nvidia/nv-caps.c
    l.823): they differ between hosts and only this file says which they are."""
    out: dict[str, int] = {}
    section = False
    for line in (text or "").splitlines():
        if line.strip() == "Character devices:":
            section = True
        elif section and not line.strip():
            break
        elif section:
            parts = line.split()
            if len(parts) == 2 and parts[0].isdigit() and parts[1] in names:
                out[parts[1]] = int(parts[0])
    return out


def read_host_facts(
    root: str, groups: IommuGroups, nodes: dict[int, set[int]], warnings: list[str]
) -> HostFacts:
    """The :class:`HostFacts` of ``root``, given its IOMMU ``groups`` and NUMA ``nodes``
    (:func:`read_numa`). Unreadable facts are None; an unreadable ``proc/modules`` adds a line
    to ``warnings``. Raises nothing."""
    cmdline = (read_text(os.path.join(root, "proc/cmdline")) or "").strip()
    group_count = groups.count
    mode = parse_iommu_mode(cmdline)
    if mode is None and group_count:
        mode = "translated"
    modules_text = read_text(os.path.join(root, "proc/modules"))
    loaded = parse_modules(modules_text) if modules_text is not None else set()
    if modules_text is None:
        warnings.append("proc/modules: unreadable; modules reported as not loaded")
    vfio_groups, nv_nodes = _read_device_nodes(root)
    sev = parse_bool_param(read_text(os.path.join(root, "sys/module/kvm_amd/parameters/sev_snp")))
    if sev is None and "kvm_amd" not in loaded and os.path.isdir(os.path.join(root, "sys/module")):
        # kvm_amd not loaded (or an Intel host): SEV-SNP cannot be active.
        sev = False if modules_text is not None else None
    return HostFacts(
        hostname=stripped(read_text(os.path.join(root, "proc/sys/kernel/hostname"))),
        kernel=stripped(read_text(os.path.join(root, "proc/sys/kernel/osrelease"))),
        cmdline=cmdline,
        iommu_enabled=group_count > 0,
        iommu_group_count=group_count,
        iommu_mode=mode,
        modules=Modules(**{f: f in loaded for f in Modules.model_fields}),
        sev_snp=sev,
        nvidia_driver_version=parse_nvidia_version(
            read_text(os.path.join(root, "proc/driver/nvidia/version"))
        ),
        numa_nodes=[NumaNode(id=n, cpulist=format_cpulist(c), has_cpus=bool(c)) for n, c in nodes.items()],
        vfio_groups=vfio_groups,
        nvidia_device_nodes=nv_nodes,
        char_majors=parse_char_majors(read_text(os.path.join(root, "proc/devices"))),
    )


def node_name(root: str) -> str:
    """This host's name as Proxmox names its node: the short hostname under ``root``
    (``proc/sys/kernel/hostname``), else this machine's."""
    name = stripped(read_text(os.path.join(root, "proc/sys/kernel/hostname"))) or ""
    if not name:
        import socket  # here: importing it costs discovery's start-up a sixth, for a fallback

        name = socket.gethostname()
    return name.split(".")[0]
