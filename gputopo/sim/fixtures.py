"""Host fixtures: compact YAML host descriptions and a builder for real-layout host roots.

A description (``fixtures/hosts/<name>.yaml``) lists the PCI functions flat, each with an
``addr``, the ``parent`` bridge it sits behind and a ``preset`` (ids, class, driver, link);
:func:`materialize` turns it into a tree with the layout the kernel shows (nested
``sys/devices/pciDDDD:BB/...`` directories, relative symlinks in ``sys/bus/pci/devices``,
``driver`` and ``iommu_group`` links, ``sys/kernel/iommu_groups``, NUMA nodes, modules, a
binary ``config`` header, ``proc/driver/nvidia`` and ``dev`` placeholders), so discovery,
``lspci -A linux-sysfs`` and the simulated kernel all read the same thing.

IOMMU groups are assigned like on a host with ACS everywhere: one group per slot (all
functions of a card together), each SR-IOV VF alone, unless devices name a shared ``group``
label. A host with ``iommu: false`` has no groups at all.

A description may name a ``generator`` (see :data:`GENERATORS`) that adds devices from a
few parameters instead of thousands of hand-written lines.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gputopo.errors import FixtureError
from gputopo.model.facts import address_key, format_cpulist, normalize_address, parse_cpulist, slot_of
from gputopo.resources import fixtures_dir
from gputopo.plan.spec import SpecError, format_validation_error, load_yaml


# --- presets -----------------------------------------------------------------------------

# PCIe capability device/port types (PCIe base spec, "Device/Port Type").
EP, LEGACY_EP, ROOT_PORT, UPSTREAM, DOWNSTREAM, RCIEP = 0, 1, 4, 5, 6, 9

LINK_SPEEDS = {1: "2.5 GT/s PCIe", 2: "5.0 GT/s PCIe", 3: "8.0 GT/s PCIe", 4: "16.0 GT/s PCIe",
               5: "32.0 GT/s PCIe", 6: "64.0 GT/s PCIe"}

# name -> defaults. ``name`` is the pci.ids device name (written to the root's pci.ids);
# ``gpu_model`` is what the nvidia driver prints as "Model:"; ``port`` is the PCIe port type
# (None: no PCIe capability, e.g. a conventional PCI function).
PRESETS: dict[str, dict[str, Any]] = {
    "rtx-pro-6000": dict(vendor=0x10DE, device=0x2BB5, cls=0x030200, sv=0x10DE, sd=0x204E, rev=0xA1,
                         driver="nvidia", name="GB202GL [RTX PRO 6000 Blackwell Server Edition]",
                         gpu_model="NVIDIA RTX PRO 6000 Blackwell Server Edition", vbios="98.02.52.00.02",
                         speed=5, width=16, reset="flr bus", port=EP),
    "rtx-6000-ada": dict(vendor=0x10DE, device=0x26B1, cls=0x030000, sv=0x10DE, sd=0x16A1, rev=0xA1,
                         driver="nvidia", name="AD102GL [RTX 6000 Ada Generation]",
                         gpu_model="NVIDIA RTX 6000 Ada Generation", vbios="95.02.5d.00.01",
                         speed=4, width=16, reset="flr bus", port=LEGACY_EP),
    "rtx-6000-ada-audio": dict(vendor=0x10DE, device=0x22BA, cls=0x040300, sv=0x10DE, sd=0x16A1, rev=0xA1,
                               driver="snd_hda_intel", name="AD102 High Definition Audio Controller",
                               speed=4, width=16, reset="flr bus", port=EP),
    "h100-sxm": dict(vendor=0x10DE, device=0x2330, cls=0x030200, sv=0x10DE, sd=0x16C1, rev=0xA1,
                     driver="nvidia", name="GH100 [H100 SXM5 80GB]", gpu_model="NVIDIA H100 80GB HBM3",
                     vbios="96.00.99.00.01", speed=5, width=16, reset="flr bus", port=EP, sriov=0),
    "rtx-pro-6000-vf": dict(vendor=0x10DE, device=0x2BB5, cls=0x030200, sv=0x10DE, sd=0x204E, rev=0xA1,
                            driver=None, name="GB202GL [RTX PRO 6000 Blackwell Server Edition]",
                            speed=5, width=16, reset="flr", port=EP),
    "nvswitch": dict(vendor=0x10DE, device=0x22A3, cls=0x068000, sv=0x10DE, sd=0x1796, rev=0xA1,
                     driver="nvidia", name="GH100 [H100 NVSwitch]", speed=4, width=2, reset="bus", port=EP),
    "aspeed-vga": dict(vendor=0x1A03, device=0x2000, cls=0x030000, sv=0x1A03, sd=0x2000, rev=0x52,
                       driver="ast", name="ASPEED Graphics Family", speed=None, width=None, port=None),
    "aspeed-bridge": dict(vendor=0x1A03, device=0x1150, cls=0x060400, rev=0x06, driver=None,
                          name="AST1150 PCI-to-PCI Bridge", speed=1, width=1, port=UPSTREAM),
    "nvme": dict(vendor=0x144D, device=0xA80A, cls=0x010802, sv=0x144D, sd=0xA801, rev=0x00, driver="nvme",
                 name="NVMe SSD Controller PM9A1/PM9A3/980PRO", speed=4, width=4, reset="flr bus", port=EP),
    "nvme-pm983": dict(vendor=0x144D, device=0xA808, cls=0x010802, sv=0x144D, sd=0xA801, rev=0x00,
                       driver="nvme", name="NVMe SSD Controller SM981/PM981/PM983", speed=3, width=4,
                       reset="flr bus", port=EP),
    "mellanox-cx7": dict(vendor=0x15B3, device=0x1021, cls=0x020000, sv=0x15B3, sd=0x0040, rev=0x00,
                         driver="mlx5_core", name="MT2910 Family [ConnectX-7]", speed=5, width=16,
                         reset="flr bus", port=EP, sriov=127, vf_preset="mellanox-cx7-vf", vf_offset=2),
    "mellanox-cx7-vf": dict(vendor=0x15B3, device=0x101E, cls=0x020000, sv=0x15B3, sd=0x0040, rev=0x00,
                            driver="mlx5_core", name="ConnectX Family mlx5Gen Virtual Function",
                            speed=5, width=16, reset="flr", port=EP),
    "intel-x710": dict(vendor=0x8086, device=0x15FF, cls=0x020000, sv=0x8086, sd=0x0000, rev=0x02,
                       driver="i40e", name="Ethernet Controller X710 for 10GBASE-T", speed=3, width=8,
                       reset="flr bus", port=EP),
    "intel-i350": dict(vendor=0x8086, device=0x1521, cls=0x020000, sv=0x8086, sd=0x0001, rev=0x01,
                       driver="igb", name="I350 Gigabit Network Connection", speed=2, width=4,
                       reset="flr bus", port=EP),
    "intel-vmd": dict(vendor=0x8086, device=0x28C0, cls=0x010400, sv=0x8086, sd=0x0000, rev=0x04,
                      driver="vmd", name="Volume Management Device NVMe RAID Controller", port=RCIEP),
    "intel-root-port": dict(vendor=0x8086, device=0x352A, cls=0x060400, rev=0x04, driver="pcieport",
                            speed=5, width=16, port=ROOT_PORT),
    "amd-root-complex": dict(vendor=0x1022, device=0x14A4, cls=0x060000, rev=0x01, driver=None, port=None),
    "amd-iommu": dict(vendor=0x1022, device=0x14A6, cls=0x080600, rev=0x00, driver=None, port=RCIEP),
    "amd-dummy-bridge": dict(vendor=0x1022, device=0x149F, cls=0x060000, rev=0x00, driver=None, port=None),
    "pcie-root-port": dict(vendor=0x1022, device=0x14AB, cls=0x060400, rev=0x00, driver="pcieport",
                           speed=5, width=16, port=ROOT_PORT),
    "amd-internal-bridge": dict(vendor=0x1022, device=0x14A7, cls=0x060400, rev=0x00, driver="pcieport",
                                speed=5, width=16, port=ROOT_PORT),
    "amd-dummy-function": dict(vendor=0x1022, device=0x14AC, cls=0x130000, sv=0x1022, sd=0x14AC, rev=0x01,
                               driver=None, speed=5, width=16, port=EP),
    "amd-psp": dict(vendor=0x1022, device=0x14CA, cls=0x108000, sv=0x1022, sd=0x14CA, rev=0x00,
                    driver="ccp", name="Genoa CCP/PSP 4.0 Device", speed=5, width=16, port=EP),
    "amd-xhci": dict(vendor=0x1022, device=0x14C9, cls=0x0C0330, sv=0x1022, sd=0x14C9, rev=0xDA,
                     driver="xhci_hcd", speed=5, width=16, port=EP),
    "amd-smbus": dict(vendor=0x1022, device=0x790B, cls=0x0C0500, sv=0x1022, sd=0x790B, rev=0x71,
                      driver="piix4_smbus", name="FCH SMBus Controller", port=None),
    "amd-lpc": dict(vendor=0x1022, device=0x790E, cls=0x060100, sv=0x1022, sd=0x790E, rev=0x51,
                    driver=None, name="FCH LPC Bridge", port=None),
    "amd-data-fabric": dict(vendor=0x1022, device=0x14AD, cls=0x060000, rev=0x00, driver=None, port=None),
    "pex-switch-upstream": dict(vendor=0x1000, device=0xC030, cls=0x060400, rev=0xB0, driver="pcieport",
                                name="PEX890xx PCIe Gen 5 Switch", speed=5, width=16, port=UPSTREAM),
    "pex-switch-downstream": dict(vendor=0x1000, device=0xC030, cls=0x060400, rev=0xB0, driver="pcieport",
                                  name="PEX890xx PCIe Gen 5 Switch", speed=5, width=16, port=DOWNSTREAM),
    "highpoint-ssd7540": dict(vendor=0x1103, device=0x7540, cls=0x010400, sv=0x1103, sd=0x0001, rev=0x00,
                              driver=None, speed=4, width=16, port=EP),
}

VENDOR_NAMES = {
    0x10DE: "NVIDIA Corporation", 0x1A03: "ASPEED Technology, Inc.",
    0x1022: "Advanced Micro Devices, Inc. [AMD]", 0x144D: "Samsung Electronics Co Ltd",
    0x15B3: "Mellanox Technologies", 0x8086: "Intel Corporation", 0x1000: "Broadcom / LSI",
    0x1103: "HighPoint Technologies, Inc.",
}

# driver name -> the module that provides it (None: built into the kernel, always present).
DRIVER_MODULE: dict[str, str | None] = {
    "nvidia": "nvidia", "vfio-pci": "vfio_pci", "snd_hda_intel": "snd_hda_intel", "ast": "ast",
    "nvme": "nvme", "mlx5_core": "mlx5_core", "i40e": "i40e", "igb": "igb", "ccp": "ccp",
    "piix4_smbus": "i2c_piix4", "vmd": "vmd", "pcieport": None, "xhci_hcd": None,
}

# module -> modules it depends on (they are loaded too, and "used by" it in proc/modules).
MODULE_DEPS: dict[str, list[str]] = {
    "nvidia_uvm": ["nvidia"], "nvidia_modeset": ["nvidia"], "nvidia_drm": ["nvidia_modeset"],
    "vfio_pci": ["vfio_pci_core"], "vfio_pci_core": ["vfio"], "vfio_iommu_type1": ["vfio"],
    "kvm_amd": ["kvm"], "kvm_intel": ["kvm"], "mlx5_ib": ["mlx5_core"],
}

MODULE_SIZES = {"nvidia": 104_071_168, "nvidia_uvm": 6_578_176, "nvidia_modeset": 1_593_344,
                "nvidia_drm": 126_976, "vfio_pci": 16_384, "vfio_pci_core": 86_016, "vfio": 65_536,
                "vfio_iommu_type1": 49_152, "kvm_amd": 208_896, "kvm_intel": 413_696, "kvm": 1_409_024,
                "mlx5_core": 2_473_984, "snd_hda_intel": 61_440, "ast": 81_920, "nvme": 61_440}

# Character device majors as Linux and the nvidia driver assign them (dev/.devices.json).
NVIDIA_MAJOR, NVIDIA_UVM_MAJOR, NVIDIA_CAPS_MAJOR, VFIO_GROUP_MAJOR = 195, 510, 237, 511


# --- description -------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DeviceSpec(_Strict):
    """One PCI function of a host description."""

    addr: str
    preset: str
    parent: str | None = Field(None, description="Address of the bridge it sits behind")
    numa: int | None = Field(None, description="numa_node; inherited from the parent when unset")
    local_cpulist: str | None = Field(None, description="'all' for every CPU; default: the node's")
    group: str | int | None = Field(None, description="Shared IOMMU group label")
    driver: str | None = Field(None, description="Overrides the preset's driver")
    unbound: bool = False
    driver_override: str | None = None
    minor: int | None = None
    uuid: str | None = None
    boot_vga: bool | None = None
    link_speed: int | None = Field(None, description="Current link speed code (1=2.5 .. 6=64 GT/s)")
    link_width: int | None = None
    vfs: int = Field(0, description="Enabled SR-IOV VFs (sriov_numvfs)")
    vf_offset: int | None = Field(None, description="First VF's routing-id offset (sriov_offset)")
    sriov_totalvfs: int | None = None
    broken: bool = Field(False, description="The device fell off the bus: ids read 0xffff")
    missing: list[str] = Field(default_factory=list, description="Attribute files to leave out")
    secondary: int | None = Field(None, description="Secondary bus of a bridge with nothing behind")
    irq: int | None = None


class NumaSpec(_Strict):
    id: int
    cpus: str = ""


class HostSpec(_Strict):
    """A compact host description (``fixtures/hosts/<name>.yaml``)."""

    name: str = ""
    description: str = ""
    source: str | None = None
    hostname: str
    kernel: str = "6.8.12-9-pve"
    cmdline: str
    iommu: bool = True
    sev_snp: bool | None = None
    nvidia_driver: str | None = None
    modules: list[str] = Field(default_factory=list)
    numa: list[NumaSpec] = Field(default_factory=list)
    root_numa: dict[str, int] = Field(default_factory=dict, description="'0000:80' -> node")
    devices: list[DeviceSpec] = Field(default_factory=list)
    generator: dict[str, Any] | None = None


# --- public API --------------------------------------------------------------------------


def hosts_dir() -> Path:
    """The directory of the shipped host descriptions (``<name>.yaml``)."""
    return fixtures_dir() / "hosts"


def list_hosts() -> list[str]:
    """Names of the shipped host descriptions, sorted."""
    return sorted(p.stem for p in hosts_dir().glob("*.yaml"))


def _host_path(host: str | Path) -> Path:
    p = Path(host)
    if p.suffix in (".yaml", ".yml") or p.is_file():
        if not p.is_file():
            raise FixtureError(str(p), "no such host description")
        return p
    candidate = hosts_dir() / f"{host}.yaml"
    if not candidate.is_file():
        raise FixtureError(str(host), f"no such host (known: {', '.join(list_hosts())})")
    return candidate


def load_host(name: str | Path) -> HostSpec:
    """Load and validate a host description by name (under fixtures/hosts) or path.

    Generated devices are expanded. Raises :class:`FixtureError` naming the file and field.
    """
    path = _host_path(name)
    try:
        data = load_yaml(path.read_text(), str(path))
    except SpecError as e:
        raise FixtureError(str(path), e.expected) from None
    if not isinstance(data, dict):
        raise FixtureError(str(path), "expected a mapping")
    data.setdefault("name", path.stem)
    try:
        spec = HostSpec.model_validate(data)
    except ValidationError as e:
        err = format_validation_error(str(path), e)
        raise FixtureError(str(path), f"{err.field}: {err.expected}") from None
    if spec.generator:
        kind = spec.generator.get("kind")
        if kind not in GENERATORS:
            raise FixtureError(str(path), f"generator.kind: unknown {kind!r}")
        params = {k: v for k, v in spec.generator.items() if k != "kind"}
        spec.devices.extend(GENERATORS[kind](**params))
    return spec


def materialize(host: str | Path | HostSpec, dest: Path) -> Path:
    """Build the host root for ``host`` (a name, a yaml path or a HostSpec) under ``dest``.

    ``dest`` must not exist or be empty. Returns ``dest`` (the root). Raises
    :class:`FixtureError` for an invalid description (unknown preset, a parent that is not a
    bridge, children of one bridge on different buses, a non-empty ``dest``).
    """
    spec = host if isinstance(host, HostSpec) else load_host(host)
    dest = Path(dest)
    if dest.exists() and any(dest.iterdir()):
        raise FixtureError(str(dest), "destination is not empty")
    dest.mkdir(parents=True, exist_ok=True)
    _Builder(spec, dest).build()
    return dest


# --- builder -----------------------------------------------------------------------------


class _Dev:
    __slots__ = ("spec", "addr", "p", "parent", "children", "numa", "group", "driver", "path",
                 "is_vf", "pf", "vfs", "secondary", "subordinate", "minor", "multifunction", "index")

    def __init__(self, spec: DeviceSpec, addr: str, preset: dict[str, Any]):
        self.spec = spec
        self.addr = addr
        self.p = preset
        self.parent: _Dev | None = None
        self.children: list[_Dev] = []
        self.numa = -1
        self.group: int | None = None
        self.driver: str | None = None
        self.path = ""
        self.is_vf = False
        self.pf: _Dev | None = None
        self.vfs: list[_Dev] = []
        self.secondary: int | None = None
        self.subordinate: int | None = None
        self.minor: int | None = None
        self.multifunction = False
        self.index = 0

    @property
    def is_bridge(self) -> bool:
        return (self.p["cls"] >> 8) == 0x0604


def _vf_offset(d: _Dev) -> int:
    return d.spec.vf_offset if d.spec.vf_offset is not None else d.p.get("vf_offset", 4)


def _fmt_addr(dom: int, bus: int, devfn: int) -> str:
    return f"{dom:04x}:{bus:02x}:{devfn >> 3:02x}.{devfn & 7}"


def _cpumask(cpus: set[int], nr: int) -> str:
    """The kernel's ``local_cpus`` bitmap: 32-bit hex words, most significant first."""
    words = max(1, (nr + 31) // 32)
    value = 0
    for c in cpus:
        value |= 1 << c
    return ",".join(f"{(value >> (32 * i)) & 0xFFFFFFFF:08x}" for i in reversed(range(words)))


def _write(path: Path, text: str | bytes) -> None:
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)


def _relink(link: Path, target: Path) -> None:
    """A symlink from ``link`` to ``target`` spelled relative, as sysfs does."""
    os.symlink(os.path.relpath(target, link.parent), link)


class _Builder:
    def __init__(self, spec: HostSpec, root: Path):
        self.spec = spec
        self.root = root
        self.where = spec.name or spec.hostname
        self.devs: dict[str, _Dev] = {}
        self.node_cpus: dict[int, set[int]] = {}
        self.all_cpus: set[int] = set()
        self.modules: list[str] = []

    def fail(self, problem: str) -> FixtureError:
        return FixtureError(self.where, problem)

    # -- model --

    def build(self) -> None:
        self._numa()
        self._collect()
        self._modules()
        self._bind()
        self._groups()
        self._minors()
        self._write_pci()
        self._write_host()

    def _numa(self) -> None:
        for n in self.spec.numa:
            try:
                cpus = parse_cpulist(n.cpus)
            except ValueError as e:
                raise self.fail(f"numa {n.id}: bad cpus {n.cpus!r}") from e
            self.node_cpus[n.id] = cpus
            self.all_cpus |= cpus

    def _collect(self) -> None:
        for i, ds in enumerate(self.spec.devices):
            try:
                addr = normalize_address(ds.addr)
            except Exception as e:
                raise self.fail(f"devices[{i}].addr: {e}") from e
            preset = PRESETS.get(ds.preset)
            if preset is None:
                raise self.fail(f"{addr}: unknown preset {ds.preset!r}")
            if addr in self.devs:
                raise self.fail(f"{addr}: listed twice")
            d = _Dev(ds, addr, preset)
            d.index = i
            self.devs[addr] = d
        # SR-IOV VFs: routing id = PF's + offset + i * stride, on the PF's parent.
        for d in list(self.devs.values()):
            if not d.spec.vfs:
                continue
            total = d.spec.sriov_totalvfs or d.p.get("sriov") or 0
            if d.spec.vfs > total:
                raise self.fail(f"{d.addr}: vfs {d.spec.vfs} > sriov_totalvfs {total}")
            dom, bus, dev, fn = address_key(d.addr)
            rid = (bus << 8) | (dev << 3) | fn
            offset = _vf_offset(d)
            vf_preset_name = d.p.get("vf_preset") or f"{d.spec.preset}-vf"
            if vf_preset_name not in PRESETS:
                raise self.fail(f"{d.addr}: preset {d.spec.preset} has no VF preset")
            for i in range(d.spec.vfs):
                r = rid + offset + i
                vaddr = _fmt_addr(dom, r >> 8, r & 0xFF)
                if vaddr in self.devs:
                    raise self.fail(f"{vaddr}: VF {i} of {d.addr} collides with a listed device")
                vs = DeviceSpec(addr=vaddr, preset=vf_preset_name, parent=d.spec.parent, numa=d.spec.numa)
                v = _Dev(vs, vaddr, PRESETS[vf_preset_name])
                v.is_vf, v.pf = True, d
                d.vfs.append(v)
                self.devs[vaddr] = v
        for d in self.devs.values():
            if d.spec.parent:
                paddr = normalize_address(d.spec.parent)
                parent = self.devs.get(paddr)
                if parent is None:
                    raise self.fail(f"{d.addr}: parent {paddr} is not listed")
                if not parent.is_bridge:
                    raise self.fail(f"{d.addr}: parent {paddr} is not a bridge")
                d.parent = parent
                parent.children.append(d)
        slots: dict[str, int] = {}
        for d in self.devs.values():
            slots[slot_of(d.addr)] = slots.get(slot_of(d.addr), 0) + 1
        for d in self.devs.values():
            d.multifunction = slots[slot_of(d.addr)] > 1 and not d.is_vf
        for d in self._ordered():
            if d.parent is not None:
                pdom, *_ = address_key(d.parent.addr)
                dom, bus, *_ = address_key(d.addr)
                if dom != pdom:
                    raise self.fail(f"{d.addr}: not in its parent's domain")
            if d.spec.numa is not None:
                d.numa = d.spec.numa
            elif d.parent is not None:
                d.numa = d.parent.numa
            else:
                dom, bus, *_ = address_key(d.addr)
                d.numa = self.spec.root_numa.get(f"{dom:04x}:{bus:02x}", -1)
        for d in self.devs.values():
            if d.is_bridge:
                buses = {address_key(c.addr)[1] for c in d.children}
                if len(buses) > 1:
                    raise self.fail(f"{d.addr}: children on several buses {sorted(buses)}")
                d.secondary = buses.pop() if buses else d.spec.secondary
        for d in self.devs.values():
            if d.is_bridge:
                d.subordinate = self._max_bus(d)

    def _max_bus(self, d: _Dev) -> int:
        best = d.secondary if d.secondary is not None else 0
        for c in d.children:
            best = max(best, address_key(c.addr)[1], self._max_bus(c) if c.is_bridge else 0)
        return best

    def _ordered(self) -> list[_Dev]:
        """Devices with every parent before its children, siblings in address order."""
        out: list[_Dev] = []
        roots = sorted((d for d in self.devs.values() if d.parent is None), key=lambda d: address_key(d.addr))
        stack = list(reversed(roots))
        while stack:
            d = stack.pop()
            out.append(d)
            stack.extend(sorted(d.children, key=lambda c: address_key(c.addr), reverse=True))
        return out

    def _modules(self) -> None:
        wanted = list(self.spec.modules)
        for d in self.devs.values():
            drv = self._preset_driver(d)
            mod = DRIVER_MODULE.get(drv) if drv else None
            # nvidia and vfio-pci load only when the description says so (that is what a
            # host under test varies); other drivers' modules come with their devices.
            if mod and mod not in wanted and (d.spec.driver or drv not in ("nvidia", "vfio-pci")):
                wanted.append(mod)
        seen: list[str] = []

        def add(m: str) -> None:
            for dep in MODULE_DEPS.get(m, []):
                add(dep)
            if m not in seen:
                seen.append(m)

        for m in wanted:
            add(m)
        self.modules = seen

    def _preset_driver(self, d: _Dev) -> str | None:
        if d.spec.unbound or d.spec.broken:
            return None
        return d.spec.driver or d.p.get("driver")

    def _bind(self) -> None:
        for d in self.devs.values():
            drv = self._preset_driver(d)
            if drv is None:
                continue
            if drv not in DRIVER_MODULE:
                raise self.fail(f"{d.addr}: unknown driver {drv!r}")
            mod = DRIVER_MODULE[drv]
            # A preset driver whose module is not loaded leaves the device without a driver.
            d.driver = drv if mod is None or mod in self.modules else None

    def _groups(self) -> None:
        if not self.spec.iommu:
            return
        numbers: dict[Any, int] = {}
        for d in sorted(self.devs.values(), key=lambda d: address_key(d.addr)):
            if d.spec.group is not None:
                key: Any = ("label", str(d.spec.group))
            elif d.is_vf:
                key = ("vf", d.addr)
            else:
                key = ("slot", slot_of(d.addr))
            if key not in numbers:
                numbers[key] = len(numbers)
            d.group = numbers[key]

    def _minors(self) -> None:
        gpus = [d for d in sorted(self.devs.values(), key=lambda d: address_key(d.addr))
                if d.driver == "nvidia" and (d.p["cls"] >> 16) == 0x03]
        used = {d.spec.minor for d in gpus if d.spec.minor is not None}
        if len(used) != len([d for d in gpus if d.spec.minor is not None]):
            raise self.fail("two GPUs share a minor")
        nxt = 0
        for d in gpus:
            if d.spec.minor is not None:
                d.minor = d.spec.minor
                continue
            while nxt in used:
                nxt += 1
            d.minor = nxt
            used.add(nxt)

    # -- files --

    def _write_pci(self) -> None:
        sysd = self.root / "sys"
        devices = sysd / "devices"
        bus = sysd / "bus" / "pci"
        bus_devices = bus / "devices"
        drivers = bus / "drivers"
        bus_devices.mkdir(parents=True)
        drivers.mkdir(parents=True)
        for f in ("drivers_probe", "rescan", "drivers_autoprobe"):
            _write(bus / f, "1\n" if f == "drivers_autoprobe" else "")
        driver_names = {drv for drv, mod in DRIVER_MODULE.items() if mod is None or mod in self.modules}
        driver_names |= {d.driver for d in self.devs.values() if d.driver}
        for drv in sorted(driver_names):
            dd = drivers / drv
            dd.mkdir()
            for f in ("bind", "unbind", "new_id", "remove_id", "uevent"):
                _write(dd / f, "")
            mod = DRIVER_MODULE.get(drv)
            if mod:
                (dd / "module").symlink_to(os.path.relpath(sysd / "module" / mod, dd))
        groups_dir = sysd / "kernel" / "iommu_groups"
        groups_dir.mkdir(parents=True)
        nr = (max(self.all_cpus) + 1) if self.all_cpus else 1
        for d in self._ordered():
            dom, b, *_ = address_key(d.addr)
            if d.parent is None:
                host = devices / f"pci{dom:04x}:{b:02x}"
                host.mkdir(parents=True, exist_ok=True)
                d.path = str(host / d.addr)
            elif d.is_vf:
                d.path = str(Path(d.pf.path).parent / d.addr)
            else:
                d.path = str(Path(d.parent.path) / d.addr)
            dp = Path(d.path)
            dp.mkdir()
            self._write_attrs(d, dp, nr)
            _relink(bus_devices / d.addr, dp)
            if d.driver:
                _relink(dp / "driver", drivers / d.driver)
                _relink(drivers / d.driver / d.addr, dp)
            if d.group is not None:
                g = groups_dir / str(d.group)
                (g / "devices").mkdir(parents=True, exist_ok=True)
                if not (g / "type").exists():
                    _write(g / "type", "DMA-FQ\n" if self.spec.iommu else "identity\n")
                    _write(g / "reserved_regions", "0x00000000fee00000 0x00000000feefffff msi\n")
                _relink(dp / "iommu_group", g)
                _relink(g / "devices" / d.addr, dp)
        for d in self.devs.values():
            for i, v in enumerate(d.vfs):
                _relink(Path(d.path) / f"virtfn{i}", Path(v.path))
                _relink(Path(v.path) / "physfn", Path(d.path))

    def _write_attrs(self, d: _Dev, dp: Path, nr: int) -> None:
        p, s = d.p, d.spec
        vendor, device, cls = p["vendor"], p["device"], p["cls"]
        sv, sd = p.get("sv", 0), p.get("sd", 0)
        if s.broken:
            vendor = device = sv = sd = 0xFFFF
            cls = 0xFFFFFF
        files: dict[str, str | bytes] = {
            "vendor": f"0x{vendor:04x}\n", "device": f"0x{device:04x}\n",
            "subsystem_vendor": f"0x{sv:04x}\n", "subsystem_device": f"0x{sd:04x}\n",
            "class": f"0x{cls:06x}\n", "revision": f"0x{p.get('rev', 0) if not s.broken else 0xff:02x}\n",
            "numa_node": f"{d.numa}\n", "enable": "1\n" if d.driver else "0\n",
            "irq": f"{s.irq if s.irq is not None else (0 if d.is_vf else 24 + d.index % 200)}\n",
            "driver_override": f"{s.driver_override or '(null)'}\n",
            "msi_bus": "1\n", "uevent": self._uevent(d, vendor, device, sv, sd, cls),
            "remove": "", "rescan": "", "reset": "",
        }
        if s.local_cpulist == "all":
            cpus = set(self.all_cpus)
        elif s.local_cpulist:
            cpus = parse_cpulist(s.local_cpulist)
        elif d.numa in self.node_cpus and self.node_cpus[d.numa]:
            cpus = self.node_cpus[d.numa]
        else:
            # Like the kernel: no (or a CPU-less) node means every CPU is "local".
            cpus = set(self.all_cpus)
        files["local_cpulist"] = f"{format_cpulist(cpus)}\n"
        files["local_cpus"] = f"{_cpumask(cpus, nr)}\n"
        if (cls >> 8) == 0x0300 and not s.broken:
            files["boot_vga"] = "1\n" if s.boot_vga else "0\n"
        port = p.get("port")
        link = port is not None and port != RCIEP and p.get("speed") is not None
        if link and not s.broken:
            files["current_link_speed"] = LINK_SPEEDS[s.link_speed or p["speed"]] + "\n"
            files["current_link_width"] = f"{s.link_width or p['width']}\n"
            files["max_link_speed"] = LINK_SPEEDS[p["speed"]] + "\n"
            files["max_link_width"] = f"{p['width']}\n"
        if p.get("reset"):
            files["reset_method"] = p["reset"] + "\n"
        total = s.sriov_totalvfs if s.sriov_totalvfs is not None else p.get("sriov")
        if total:
            files["sriov_totalvfs"] = f"{total}\n"
            files["sriov_numvfs"] = f"{s.vfs}\n"
            files["sriov_offset"] = f"{_vf_offset(d)}\n"
            files["sriov_stride"] = "1\n"
            files["sriov_vf_device"] = f"{PRESETS[p.get('vf_preset') or s.preset + '-vf']['device']:04x}\n"
            files["sriov_drivers_autoprobe"] = "1\n"
        if d.is_bridge:
            files["secondary_bus_number"] = f"{d.secondary or 0}\n"
            files["subordinate_bus_number"] = f"{d.subordinate or 0}\n"
        bridge_resources = d.is_bridge
        files["resource"] = "".join("0x%016x 0x%016x 0x%016x\n" % (0, 0, 0)
                                    for _ in range(17 if bridge_resources else 13))
        files["config"] = self._config(d, vendor, device, sv, sd, cls, s.broken)
        for name in s.missing:
            files.pop(name, None)
        for name, content in files.items():
            _write(dp / name, content)

    @staticmethod
    def _uevent(d: _Dev, vendor: int, device: int, sv: int, sd: int, cls: int) -> str:
        lines = []
        if d.driver:
            lines.append(f"DRIVER={d.driver}")
        lines += [f"PCI_CLASS={cls:X}", f"PCI_ID={vendor:04X}:{device:04X}",
                  f"PCI_SUBSYS_ID={sv:04X}:{sd:04X}", f"PCI_SLOT_NAME={d.addr}",
                  f"MODALIAS=pci:v{vendor:08X}d{device:08X}sv{sv:08X}sd{sd:08X}"
                  f"bc{cls >> 16:02X}sc{(cls >> 8) & 0xFF:02X}i{cls & 0xFF:02X}"]
        return "\n".join(lines) + "\n"

    def _config(self, d: _Dev, vendor: int, device: int, sv: int, sd: int, cls: int, broken: bool) -> bytes:
        """A 256-byte configuration space: header plus a PCIe capability at 0x40."""
        if broken:
            return b"\xff" * 256
        p = d.p
        cfg = bytearray(256)
        header_type = (1 if d.is_bridge else 0) | (0x80 if d.multifunction else 0)
        port = p.get("port")
        status = 0x0010 if port is not None else 0x0000
        command = 0x0406 if d.driver else 0x0000
        struct.pack_into("<HHHHB", cfg, 0, vendor if not d.is_vf else 0xFFFF,
                         device if not d.is_vf else 0xFFFF, command, status, p.get("rev", 0))
        cfg[0x09] = cls & 0xFF
        cfg[0x0A] = (cls >> 8) & 0xFF
        cfg[0x0B] = (cls >> 16) & 0xFF
        cfg[0x0E] = header_type
        if d.is_bridge:
            cfg[0x18] = address_key(d.addr)[1]
            cfg[0x19] = d.secondary or 0
            cfg[0x1A] = d.subordinate or 0
        else:
            struct.pack_into("<HH", cfg, 0x2C, sv, sd)
            cfg[0x3D] = 1
        cfg[0x3C] = 0xFF
        if port is not None:
            cfg[0x34] = 0x40
            cfg[0x40] = 0x10  # PCI Express capability, last in the list
            struct.pack_into("<H", cfg, 0x42, 0x0002 | (port << 4))
            if port != RCIEP and p.get("speed"):
                speed = p["speed"]
                width = p["width"]
                cur_speed = d.spec.link_speed or speed
                cur_width = d.spec.link_width or width
                struct.pack_into("<I", cfg, 0x4C, speed | (width << 4))
                struct.pack_into("<H", cfg, 0x52, cur_speed | (cur_width << 4))
                struct.pack_into("<I", cfg, 0x6C, sum(1 << i for i in range(1, speed + 1)))
        return bytes(cfg)

    def _write_host(self) -> None:
        root, spec = self.root, self.spec
        proc = root / "proc"
        (proc / "sys" / "kernel").mkdir(parents=True)
        _write(proc / "cmdline", spec.cmdline.strip() + "\n")
        _write(proc / "sys" / "kernel" / "hostname", spec.hostname + "\n")
        _write(proc / "sys" / "kernel" / "osrelease", spec.kernel + "\n")
        _write(proc / "modules", self._proc_modules())
        # NUMA nodes
        node_dir = root / "sys" / "devices" / "system" / "node"
        node_dir.mkdir(parents=True)
        nodes = sorted(self.node_cpus)
        for n in nodes:
            nd = node_dir / f"node{n}"
            nd.mkdir()
            cpus = self.node_cpus[n]
            _write(nd / "cpulist", format_cpulist(cpus) + "\n")
            _write(nd / "cpumap", _cpumask(cpus, (max(self.all_cpus) + 1) if self.all_cpus else 1) + "\n")
        if nodes:
            span = format_cpulist(set(nodes))
            _write(node_dir / "online", span + "\n")
            _write(node_dir / "possible", span + "\n")
            _write(node_dir / "has_cpu", format_cpulist({n for n in nodes if self.node_cpus[n]}) + "\n")
            _write(node_dir / "has_memory", span + "\n")
        # modules
        mod_dir = root / "sys" / "module"
        mod_dir.mkdir(parents=True, exist_ok=True)
        for m in self.modules:
            md = mod_dir / m
            md.mkdir()
            _write(md / "initstate", "live\n")
            _write(md / "refcnt", f"{len(self._users(m))}\n")
        if "kvm_amd" in self.modules:
            params = mod_dir / "kvm_amd" / "parameters"
            params.mkdir()
            _write(params / "sev", "Y\n" if spec.sev_snp is not None else "N\n")
            _write(params / "sev_es", "Y\n" if spec.sev_snp else "N\n")
            _write(params / "sev_snp", "Y\n" if spec.sev_snp else "N\n")
        if "vfio_iommu_type1" in self.modules:
            params = mod_dir / "vfio_iommu_type1" / "parameters"
            params.mkdir()
            _write(params / "allow_unsafe_interrupts", "N\n")
        self._write_nvidia()
        self._write_dev()
        self._write_pci_ids()

    def _users(self, m: str) -> list[str]:
        return [u for u in self.modules if m in MODULE_DEPS.get(u, [])]

    def _proc_modules(self) -> str:
        lines = []
        # /proc/modules lists the most recently loaded module first.
        for m in reversed(self.modules):
            users = self._users(m)
            used = "".join(f"{u}," for u in users) or "-"
            taint = " (POE)" if m.startswith("nvidia") else ""
            lines.append(f"{m} {MODULE_SIZES.get(m, 16384)} {len(users)} {used} Live 0x0000000000000000{taint}")
        return "\n".join(lines) + ("\n" if lines else "")

    def _gpu_uuid(self, d: _Dev) -> str:
        if d.spec.uuid:
            return d.spec.uuid
        h = hashlib.sha1(f"{self.spec.hostname}/{d.addr}".encode()).hexdigest()
        return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"

    def _nvidia_gpus(self) -> list[_Dev]:
        return sorted((d for d in self.devs.values() if d.minor is not None), key=lambda d: d.minor)

    def _write_nvidia(self) -> None:
        if "nvidia" not in self.modules:
            return
        nv = self.root / "proc" / "driver" / "nvidia"
        (nv / "gpus").mkdir(parents=True)
        if self.spec.nvidia_driver:
            _write(nv / "version",
                   f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {self.spec.nvidia_driver}  "
                   "Release Build  (dvs-builder@U16-I3-B03-4-3)  Fri Mar 14 21:19:51 UTC 2025\n"
                   "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")
        _write(nv / "params", "ModifyDeviceFiles: 1\nDeviceFileUID: 0\nDeviceFileGID: 0\n")
        for d in self._nvidia_gpus():
            g = nv / "gpus" / d.addr
            g.mkdir()
            irq = d.spec.irq if d.spec.irq is not None else 24 + d.index % 200
            _write(g / "information",
                   f"Model: \t\t {d.p.get('gpu_model', d.p.get('name'))}\n"
                   f"IRQ:   \t\t {irq}\n"
                   f"GPU UUID: \t {self._gpu_uuid(d)}\n"
                   f"Video BIOS: \t {d.p.get('vbios', '??.??.??.??.??')}\n"
                   f"Bus Type: \t PCIe\n"
                   f"DMA Size: \t 52 bits\n"
                   f"DMA Mask: \t 0xfffffffffffff\n"
                   f"Bus Location: \t {d.addr}\n"
                   f"Device Minor: \t {d.minor}\n"
                   f"GPU Excluded:\t No\n")

    def _write_dev(self) -> None:
        dev = self.root / "dev"
        dev.mkdir()
        nodes: dict[str, list[Any]] = {}
        gpus = self._nvidia_gpus()
        if "nvidia" in self.modules and gpus:
            for d in gpus:
                nodes[f"nvidia{d.minor}"] = ["c", NVIDIA_MAJOR, d.minor]
            nodes["nvidiactl"] = ["c", NVIDIA_MAJOR, 255]
            if "nvidia_modeset" in self.modules:
                nodes["nvidia-modeset"] = ["c", NVIDIA_MAJOR, 254]
            if "nvidia_uvm" in self.modules:
                nodes["nvidia-uvm"] = ["c", NVIDIA_UVM_MAJOR, 0]
                nodes["nvidia-uvm-tools"] = ["c", NVIDIA_UVM_MAJOR, 1]
            nodes["nvidia-caps/nvidia-cap1"] = ["c", NVIDIA_CAPS_MAJOR, 1]
            nodes["nvidia-caps/nvidia-cap2"] = ["c", NVIDIA_CAPS_MAJOR, 2]
        if "vfio" in self.modules:
            nodes["vfio/vfio"] = ["c", 10, 196]
            vfio_groups = sorted({d.group for d in self.devs.values()
                                  if d.driver == "vfio-pci" and d.group is not None})
            for i, g in enumerate(vfio_groups):
                nodes[f"vfio/{g}"] = ["c", VFIO_GROUP_MAJOR, i]
        for name in nodes:
            path = dev / name
            path.parent.mkdir(parents=True, exist_ok=True)
            _write(path, "")
        _write(dev / ".devices.json", json.dumps(nodes, indent=1, sort_keys=True) + "\n")

    def _write_pci_ids(self) -> None:
        used: dict[int, dict[int, str]] = {}
        for d in self.devs.values():
            if d.p.get("name"):
                used.setdefault(d.p["vendor"], {})[d.p["device"]] = d.p["name"]
        out = ["# Subset of the PCI ID Repository (https://pci-ids.ucw.cz/) for this host.",
               "# Distributed under the GNU GPL v2 or later or the 3-clause BSD License.", ""]
        for v in sorted(used):
            out.append(f"{v:04x}  {VENDOR_NAMES.get(v, 'Unknown vendor')}")
            for dv in sorted(used[v]):
                out.append(f"\t{dv:04x}  {used[v][dv]}")
        path = self.root / "usr" / "share" / "misc" / "pci.ids"
        path.parent.mkdir(parents=True)
        _write(path, "\n".join(out) + "\n")


# --- generators --------------------------------------------------------------------------


def _gen_fabric(domains: list[dict[str, Any]], nvswitches: int = 0, gpu_vfs: int = 0,
                broken: int = 0, vmd_domain: str | None = None, vmd_nvme: int = 0,
                gpu_preset: str = "h100-sxm") -> list[DeviceSpec]:
    """A large synthetic fabric: per domain, root buses of root ports, each behind a PCIe
    switch with ``gpus`` GPUs, one dual-port NIC with ``nic_vfs`` VFs per port and one NVMe.

    ``domains``: [{domain: '0000', root_buses: {'00': 0, '80': 1}, ports: 4, gpus: 4,
    nic_vfs: 56}]; the root bus maps to its NUMA node. ``nvswitches`` NVSwitches, the first
    ``gpu_vfs`` VFs on the very first GPU, ``broken`` endpoints reading 0xffff, and a VMD
    domain (``vmd_domain``, e.g. '10000') with ``vmd_nvme`` NVMe drives.
    """
    out: list[DeviceSpec] = []
    first_gpu = True
    broken_left = broken
    nvsw_left = nvswitches
    for dspec in domains:
        dom = int(str(dspec["domain"]), 16)
        ports, gpus, nic_vfs = dspec.get("ports", 4), dspec.get("gpus", 4), dspec.get("nic_vfs", 0)
        for rb_text, node in dspec["root_buses"].items():
            rb = int(str(rb_text), 16)
            A = lambda b, dev, fn=0: f"{dom:04x}:{b:02x}:{dev:02x}.{fn}"  # noqa: E731
            out.append(DeviceSpec(addr=A(rb, 0), preset="amd-root-complex", numa=node))
            out.append(DeviceSpec(addr=A(rb, 0, 2), preset="amd-iommu", numa=node))
            for dev in (0x18, 0x19):
                for fn in range(8):
                    out.append(DeviceSpec(addr=A(rb, dev, fn), preset="amd-data-fabric", numa=node))
            bus = rb + 1
            for port in range(ports):
                rp = A(rb, 1 + port, 1)
                out.append(DeviceSpec(addr=A(rb, 1 + port), preset="amd-dummy-bridge", numa=node))
                out.append(DeviceSpec(addr=rp, preset="pcie-root-port", numa=node))
                up = A(bus, 0)
                out.append(DeviceSpec(addr=up, preset="pex-switch-upstream", parent=rp))
                down_bus = bus + 1
                n_down = gpus + 2 + (1 if nvsw_left else 0)
                bus = down_bus + 1
                for k in range(n_down):
                    dn = A(down_bus, k)
                    out.append(DeviceSpec(addr=dn, preset="pex-switch-downstream", parent=up))
                    ep = A(bus, 0)
                    if k < gpus:
                        vfs = gpu_vfs if first_gpu else 0
                        preset = "rtx-pro-6000" if vfs else gpu_preset
                        out.append(DeviceSpec(addr=ep, preset=preset, parent=dn, vfs=vfs,
                                              sriov_totalvfs=32 if vfs else None))
                        first_gpu = False
                    elif k == gpus:
                        out.append(DeviceSpec(addr=ep, preset="mellanox-cx7", parent=dn, vfs=nic_vfs))
                        # PF1's VFs start after PF0's, as ConnectX firmware lays them out.
                        out.append(DeviceSpec(addr=A(bus, 0, 1), preset="mellanox-cx7", parent=dn,
                                              vfs=nic_vfs, vf_offset=max(nic_vfs, 1) + 1))
                    elif k == gpus + 1:
                        is_broken = broken_left > 0
                        broken_left -= int(is_broken)
                        out.append(DeviceSpec(addr=ep, preset="nvme", parent=dn, broken=is_broken))
                    else:
                        out.append(DeviceSpec(addr=ep, preset="nvswitch", parent=dn))
                        nvsw_left -= 1
                    bus += 1
            out.append(DeviceSpec(addr=A(rb, 0x14), preset="amd-smbus", numa=node))
    if vmd_domain:
        vdom = int(vmd_domain, 16)
        rp = f"{vdom:04x}:00:01.0"
        out.append(DeviceSpec(addr=rp, preset="intel-root-port", secondary=1))
        for i in range(vmd_nvme):
            rpi = f"{vdom:04x}:00:{1 + i:02x}.0"
            if i:
                out.append(DeviceSpec(addr=rpi, preset="intel-root-port"))
            out.append(DeviceSpec(addr=f"{vdom:04x}:{1 + i:02x}:00.0", preset="nvme-pm983", parent=rpi))
    return out


GENERATORS = {"fabric": _gen_fabric}
