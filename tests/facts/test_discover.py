"""Discovery: pure parsers on literal strings, fixtures end to end, and odd hosts."""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
import sys

import pytest
from click.testing import CliRunner

from gputopo.errors import InputError, RootError
from gputopo.facts.discover import discover, parse_gpu_match, parse_nvidia_information
from gputopo.facts.host import (
    numa_from_cpulist,
    parse_bool_param,
    parse_iommu_mode,
    parse_modules,
    parse_nvidia_version,
)
from gputopo.facts.names import parse_pci_ids, udev_names
from gputopo.facts.pci import (
    list_pci_functions,
    parse_hex_id,
    parse_reset_method,
    parse_subsystem_id,
    read_pci_function,
)
from gputopo.model.facts import MemberRole, address_key, format_cpulist, parse_cpulist

# --- parsers -------------------------------------------------------------------------------


def test_parse_hex_id():
    assert parse_hex_id("0x10de\n") == "0x10de"
    assert parse_hex_id("0x10DE") == "0x10de"
    assert parse_hex_id("0xffff\n") is None
    assert parse_hex_id("0x0000\n") is None
    assert parse_hex_id("garbage") is None
    assert parse_hex_id(None) is None
    assert parse_hex_id("0x030200\n", 6) == "0x030200"
    assert parse_hex_id("0xffffff\n", 6) is None
    assert parse_hex_id("0x12345\n") is None  # wider than an id can be
    assert parse_subsystem_id("0x0000\n") == "0x0000"  # Intel X710: subsystem 8086:0000
    assert parse_subsystem_id("0xffff\n") is None and parse_subsystem_id(None) is None


def test_cpulist_and_address_helpers():
    assert format_cpulist({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11"
    assert format_cpulist({5}) == "5" and format_cpulist(set()) == ""
    text = "0-63,128-191"
    assert format_cpulist(parse_cpulist(text)) == text
    addrs = ["10000:00:01.0", "0001:00:00.0", "0000:81:00.0", "0000:0a:1f.7", "0000:0a:02.0"]
    assert sorted(addrs, key=address_key) == [
        "0000:0a:02.0",
        "0000:0a:1f.7",
        "0000:81:00.0",
        "0001:00:00.0",
        "10000:00:01.0",
    ]


def test_parse_cpulist():
    assert parse_cpulist("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert parse_cpulist("\n") == set()
    assert parse_cpulist(None) == set()
    with pytest.raises(ValueError):
        parse_cpulist("a-b")


@pytest.mark.parametrize(
    "cmdline, mode",
    [
        ("BOOT_IMAGE=/vmlinuz ro quiet amd_iommu=on", None),
        ("ro quiet amd_iommu=on iommu=pt", "pt"),
        ("ro intel_iommu=on,pt", "pt"),
        ("ro amd_iommu=pt", "pt"),
        ("ro iommu=off", "off"),
        ("ro intel_iommu=off iommu=pt", "off"),
        ("ro myiommu=pt", None),
    ],
)
def test_parse_iommu_mode(cmdline, mode):
    assert parse_iommu_mode(cmdline) == mode


def test_parse_modules_and_params():
    text = (
        "nvidia_uvm 1961984 0 - Live 0x0000000000000000 (PO)\n"
        "nvidia 60960768 2 nvidia_uvm,nvidia_modeset, Live 0x0000000000000000 (POE)\n\n"
    )
    assert parse_modules(text) == {"nvidia_uvm", "nvidia"}
    assert parse_bool_param("Y\n") is True and parse_bool_param("0") is False
    assert parse_bool_param("maybe") is None and parse_bool_param(None) is None
    assert parse_reset_method("flr bus\n") == ["flr", "bus"]
    assert parse_reset_method(None) is None


def test_parse_nvidia_version_and_information():
    open_mod = (
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.133.20  Release Build  "
        "(dvs-builder@U16-I3-B03-4-3)  Fri Mar 14 21:19:51 UTC 2025\nGCC version:  gcc 12\n"
    )
    legacy = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n"
    assert parse_nvidia_version(open_mod) == "570.133.20"
    assert parse_nvidia_version(legacy) == "550.54.15"
    assert parse_nvidia_version("") is None
    info = parse_nvidia_information(
        "Model: \t\t NVIDIA RTX PRO 6000 Blackwell Server Edition\nIRQ:   \t\t 45\n"
        "GPU UUID: \t GPU-63a7bec0-1fd4-4bff-b151-64588dfc84b8\nBus Location: \t 0000:61:00.0\n"
        "Device Minor: \t 3\nGPU Excluded:\t No\n"
    )
    assert info["Device Minor"] == "3"
    assert info["GPU UUID"] == "GPU-63a7bec0-1fd4-4bff-b151-64588dfc84b8"
    assert info["Bus Location"] == "0000:61:00.0"


def test_parse_pci_ids_and_gpu_match():
    db = (
        "# comment\n10de  NVIDIA Corporation\n\t2bb5  GB202GL [RTX PRO 6000 Blackwell Server Edition]\n"
        "\t\t10de 204e  RTX PRO 6000 Blackwell Server Edition\n\t26b1  AD102GL [RTX 6000 Ada Generation]\n"
        "1a03  ASPEED\n\t2000  ASPEED Graphics Family\nC 03  Display controller\n\t00  VGA\n"
    )
    got = parse_pci_ids(db, {("10de", "2bb5"), ("1a03", "2000"), ("10de", "ffff")})
    assert got == {
        ("10de", "2bb5"): "GB202GL [RTX PRO 6000 Blackwell Server Edition]",
        ("1a03", "2000"): "ASPEED Graphics Family",
    }
    assert parse_gpu_match("0x1234:0x03") == ("0x1234", "0x03")
    assert parse_gpu_match("1af4") == ("0x1af4", None)
    assert parse_gpu_match(":0302") == (None, "0x0302")
    with pytest.raises(InputError):
        parse_gpu_match("nothex")


def test_numa_from_cpulist():
    nodes = {0: {0, 1, 2, 3}, 1: {4, 5, 6, 7}, 2: set()}
    assert numa_from_cpulist({0, 1}, nodes) == 0
    assert numa_from_cpulist({4, 5, 6, 7}, nodes) == 1
    assert numa_from_cpulist(set(range(8)), nodes) is None
    assert numa_from_cpulist({3, 4}, nodes) is None
    assert numa_from_cpulist(set(), nodes) is None


class _Entry:
    """What pyudev's Devices.from_name gives: a device with the properties of its udev entry."""

    def __init__(self, properties: dict[str, str]):
        self.properties = properties


def test_udev_names_read_each_devices_entry_through_pyudevs_public_api(monkeypatch):
    import pyudev

    entries = {
        "0000:01:00.0": {"ID_MODEL_FROM_DATABASE": "GB202GL [RTX PRO 6000 Blackwell Server Edition]"},
        "0000:02:00.0": {"ID_VENDOR_FROM_DATABASE": "NVIDIA Corporation"},  # no model in its entry
    }
    asked = []

    def from_name(context, subsystem, name):
        assert isinstance(context, pyudev.Context)
        asked.append((subsystem, name))
        if name not in entries:
            raise pyudev.DeviceNotFoundByNameError(subsystem, name)
        return _Entry(entries[name])

    monkeypatch.setattr(pyudev.Devices, "from_name", from_name)
    got = udev_names(["0000:03:00.0", "0000:01:00.0", "0000:02:00.0", "0000:01:00.0"])
    assert got == {"0000:01:00.0": "GB202GL [RTX PRO 6000 Blackwell Server Edition]"}
    assert asked == [("pci", "0000:01:00.0"), ("pci", "0000:02:00.0"), ("pci", "0000:03:00.0")]


def test_udev_names_without_pyudev_name_nothing(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyudev", None)  # import pyudev raises ImportError
    assert udev_names(["0000:01:00.0"]) == {}


def _udev_database_names() -> dict[str, str]:
    """address -> ID_MODEL_FROM_DATABASE as ``udevadm info`` prints this host's udev entries."""
    if not os.path.isdir("/run/udev/data"):
        return {}
    out = {}
    for a in sorted(os.listdir("/sys/bus/pci/devices")):
        try:
            p = subprocess.run(
                ["udevadm", "info", "--query=property", f"/sys/bus/pci/devices/{a}"],
                capture_output=True,
                text=True,
                timeout=10,
            )
        except (OSError, subprocess.TimeoutExpired):
            return {}
        for line in p.stdout.splitlines():
            if line.startswith("ID_MODEL_FROM_DATABASE="):
                out[a] = line.split("=", 1)[1]
    return out


@pytest.mark.slow
def test_udev_names_match_udevadm_on_this_host():
    want = _udev_database_names()
    if not want:
        pytest.skip("no udev database with model names here (a container, or udevd not running)")
    assert udev_names(os.listdir("/sys/bus/pci/devices")) == want


def test_live_root_asks_udev_only_for_what_pci_ids_lacks(monkeypatch, materialized):
    from gputopo.facts import names

    asked = []
    monkeypatch.setattr(
        names, "udev_names", lambda addrs: asked.append(sorted(addrs)) or {a: "from udev" for a in addrs}
    )
    if not any(os.path.exists(os.path.join("/", p)) for p in names.PCI_IDS_PATHS):
        pytest.skip("no pci.ids on this machine")
    # 8086:1521 is in every pci.ids; 10de:fffe in none
    got = names.load_pci_names("/", {"0000:02:00.0": ("10de", "fffe"), "0000:03:00.0": ("8086", "1521")})
    assert asked == [["0000:02:00.0"]]
    assert got == {"0000:02:00.0": "from udev", "0000:03:00.0": "I350 Gigabit Network Connection"}
    # A fixture or snapshot root is not this host: its names come from its own pci.ids only.
    asked.clear()
    f = discover(materialized("seed"))
    assert asked == [] and f.gpus[0].model == "GB202GL [RTX PRO 6000 Blackwell Server Edition]"


def test_names_are_per_address_two_functions_with_one_id_share_the_name(tmp_path):
    from gputopo.facts import names

    (tmp_path / "usr/share/misc").mkdir(parents=True)
    (tmp_path / "usr/share/misc/pci.ids").write_text("10de  NVIDIA Corporation\n\t2bb5  GB202GL\n")
    got = names.load_pci_names(
        str(tmp_path),
        {"0000:01:00.0": ("10de", "2bb5"), "0000:81:00.0": ("10de", "2bb5"), "x": ("10de", "0001")},
    )
    assert got == {"0000:01:00.0": "GB202GL", "0000:81:00.0": "GB202GL"}


# --- the shipped hosts ---------------------------------------------------------------------


def test_seed(materialized):
    f = discover(materialized("seed"))
    assert [g.address for g in f.gpus] == [
        "0000:01:00.0",
        "0000:11:00.0",
        "0000:61:00.0",
        "0000:71:00.0",
        "0000:81:00.0",
        "0000:91:00.0",
        "0000:e1:00.0",
        "0000:f1:00.0",
    ]
    assert {g.address[5:7]: g.numa_node for g in f.gpus} == {
        "01": 0,
        "11": 0,
        "61": 0,
        "71": 0,
        "81": 1,
        "91": 1,
        "e1": 1,
        "f1": 1,
    }
    assert {g.address[5:7]: g.minor for g in f.gpus} == {
        "01": 0,
        "11": 1,
        "61": 3,
        "71": 2,
        "81": 4,
        "91": 5,
        "e1": 7,
        "f1": 6,
    }
    g = f.gpu("0000:61:00.0")
    assert g.model == "GB202GL [RTX PRO 6000 Blackwell Server Edition]"
    assert (g.vendor, g.device, g.class_, g.subsystem_device) == ("0x10de", "0x2bb5", "0x030200", "0x204e")
    assert g.numa_source == "sysfs" and g.driver == "nvidia" and g.driver_override is None
    assert g.iommu_group is not None and g.iommu_members == [] and g.functions == []
    assert g.boot_vga is False and g.link.current_speed == "32.0 GT/s PCIe" and g.link.max_width == 16
    assert g.uuid and g.uuid.startswith("GPU-")
    assert len({x.iommu_group for x in f.gpus}) == 8
    h = f.host
    assert (h.hostname, h.iommu_mode, h.iommu_enabled, h.sev_snp) == ("pve1", "translated", True, True)
    assert h.nvidia_driver_version.startswith("570.")
    assert h.modules.vfio_pci and h.modules.nvidia_drm
    assert [n.id for n in h.numa_nodes] == [0, 1]
    assert "nvidia7" in h.nvidia_device_nodes and "nvidiactl" in h.nvidia_device_nodes
    assert f.warnings == []


def test_esc8000a_functions_and_all_vendors(materialized):
    r = materialized("esc8000a")
    f = discover(r)
    assert [g.address for g in f.gpus] == ["0000:01:00.0", "0000:41:00.0", "0000:c1:00.0", "0000:e1:00.0"]
    assert [g.numa_node for g in f.gpus] == [0, 0, 1, 1]
    g = f.gpus[0]
    assert g.functions == ["0000:01:00.1"]
    assert [(m.address, m.role, m.driver) for m in g.iommu_members] == [
        ("0000:01:00.1", MemberRole.FUNCTION, "snd_hda_intel")
    ]
    assert g.companions == ["0000:01:00.1"]
    assert g.link.current_speed == "2.5 GT/s PCIe" and g.link.max_speed == "16.0 GT/s PCIe"
    assert f.host.iommu_mode == "pt" and f.host.sev_snp is False and not f.host.modules.vfio
    everyone = discover(r, all_vendors=True)
    vga = everyone.gpu("0000:75:00.0")
    assert vga is not None and vga.boot_vga is True and vga.driver == "ast"
    only = discover(r, gpu_match=[("0x1a03", "0x03")])
    assert [x.address for x in only.gpus] == ["0000:75:00.0"]


def test_shared_group_roles(materialized):
    f = discover(materialized("shared-group"))
    g = f.gpu("0000:03:00.0")
    roles = {m.address: m.role for m in g.iommu_members}
    assert roles == {
        "0000:01:00.0": MemberRole.BRIDGE,
        "0000:02:00.0": MemberRole.BRIDGE,
        "0000:02:01.0": MemberRole.BRIDGE,
        "0000:03:00.1": MemberRole.FUNCTION,
        "0000:04:00.0": MemberRole.FOREIGN,
    }
    assert [m.address for m in g.foreign_members] == ["0000:04:00.0"]
    assert f.gpu("0000:04:00.0") is None
    vf = f.gpu("0000:06:00.0")
    assert vf.driver == "vfio-pci" and vf.minor is None
    assert f.host.vfio_groups == [vf.iommu_group]


def test_numa_unknown(materialized):
    f = discover(materialized("numa-unknown"))
    got = {g.address: (g.numa_node, g.numa_source) for g in f.gpus}
    assert got == {
        "0000:01:00.0": (0, "cpulist"),
        "0000:02:00.0": (0, "cpulist"),
        "0000:81:00.0": (None, None),
        "0000:82:00.0": (None, None),
    }
    assert sum("NUMA node unknown" in w for w in f.warnings) == 2


def test_iommu_off(materialized):
    f = discover(materialized("iommu-off"))
    assert len(f.gpus) == 2 and all(g.iommu_group is None and g.iommu_members == [] for g in f.gpus)
    h = f.host
    assert (h.iommu_enabled, h.iommu_group_count, h.iommu_mode, h.modules.vfio) == (False, 0, None, False)
    assert h.vfio_groups == []
    assert any("no IOMMU groups" in w for w in f.warnings)


@pytest.mark.slow
def test_large(materialized):
    # how fast discovery is on a large host is benchmarks/bench_discover.py's question
    r = materialized("large")
    f = discover(r)
    pfs = [g for g in f.gpus if g.sriov_numvfs]
    assert len(pfs) == 1 and pfs[0].sriov_numvfs == 4 and pfs[0].sriov_totalvfs == 32
    assert len(f.gpus) >= 64
    assert len(f.nvswitches) == 2 and all(s.is_nvswitch for s in f.nvswitches)
    assert not {s.address for s in f.nvswitches} & {g.address for g in f.gpus}
    assert {g.address.split(":")[0] for g in f.gpus} == {"0000", "0001"}
    assert {n.id: n.has_cpus for n in f.host.numa_nodes} == {
        0: True,
        1: True,
        2: False,
        3: False,
        4: True,
        5: True,
    }
    assert {g.numa_node for g in f.gpus} == {0, 1, 4, 5}
    assert any("0000:08:00.0" in w and "unreadable" in w for w in f.warnings)
    fns = list_pci_functions(r)
    assert len(fns) >= 2000
    assert any(x.address.startswith("10000:") for x in fns)
    broken = [x for x in fns if not x.readable]
    assert [x.address for x in broken] == ["0000:08:00.0"] and broken[0].vendor is None


# --- PCI functions ------------------------------------------------------------------------


def test_list_and_read_pci_function(materialized):
    r = materialized("seed")
    fns = list_pci_functions(r)
    assert [x.address for x in fns] == sorted(x.address for x in fns)
    assert len(fns) == len(os.listdir(r / "sys/bus/pci/devices"))
    nv = read_pci_function(r, "00000000:81:00.0")
    assert nv.address == "0000:81:00.0" and nv.driver == "nvidia" and nv.numa_node == 1
    assert read_pci_function(r, "0000:99:00.0") is None
    bridge = read_pci_function(r, "80:01.1")
    assert bridge.is_bridge and bridge.driver == "pcieport"


# --- robustness -----------------------------------------------------------------------------


def test_missing_attributes_are_null_or_derived(fresh_host):
    r = fresh_host("seed")
    d = r / "sys/bus/pci/devices"
    (d / "0000:01:00.0/numa_node").unlink()
    (d / "0000:01:00.0/current_link_speed").unlink()
    (d / "0000:71:00.0/reset_method").unlink()
    (d / "0000:71:00.0/driver_override").unlink()
    (d / "0000:81:00.0/iommu_group").unlink()
    (r / "proc/modules").unlink()
    f = discover(r)
    g1 = f.gpu("0000:01:00.0")
    assert (g1.numa_node, g1.numa_source) == (0, "cpulist")  # derived from local_cpulist
    assert g1.link.current_speed is None and g1.link.max_speed == "32.0 GT/s PCIe"
    g7 = f.gpu("0000:71:00.0")
    assert g7.reset_method is None and g7.driver_override is None and g7.driver == "nvidia"
    # The group's own listing still names the device: sys/kernel/iommu_groups is the truth.
    assert f.gpu("0000:81:00.0").iommu_group is not None
    assert not f.host.modules.nvidia and any("proc/modules" in w for w in f.warnings)
    assert len(f.gpus) == 8


@pytest.mark.parametrize("err", [errno.EACCES, errno.EIO])
def test_unreadable_attributes_are_null(fresh_host, monkeypatch, err):
    import builtins

    r = fresh_host("seed")
    d = (r / "sys/bus/pci/devices/0000:61:00.0").resolve()
    denied = {str(d / a) for a in ("numa_node", "local_cpulist", "current_link_width", "subsystem_device")}
    real_open = builtins.open

    def failing_open(path, *a, **k):
        if isinstance(path, (str, os.PathLike)) and os.path.realpath(path) in denied:
            raise OSError(err, os.strerror(err), str(path))
        return real_open(path, *a, **k)

    real_os_open = os.open

    def failing_os_open(path, *a, **k):  # what discovery reads sysfs attributes with
        if isinstance(path, (str, os.PathLike)) and os.path.realpath(path) in denied:
            raise OSError(err, os.strerror(err), str(path))
        return real_os_open(path, *a, **k)

    monkeypatch.setattr(builtins, "open", failing_open)
    monkeypatch.setattr(os, "open", failing_os_open)
    f = discover(r)
    g = f.gpu("0000:61:00.0")
    assert (g.numa_node, g.numa_source) == (None, None)  # unknown, never 0
    assert g.link.current_width is None and g.link.current_speed == "32.0 GT/s PCIe"
    assert g.subsystem_device is None and g.device == "0x2bb5" and g.minor == 3
    assert any(w.startswith("0000:61:00.0: NUMA node unknown") for w in f.warnings)


@pytest.mark.parametrize("value", ["0xffff", "0x0000"])
def test_ids_reading_all_ones_or_zero_are_reported_not_gpus(fresh_host, value):
    r = fresh_host("seed")
    dev = r / "sys/bus/pci/devices/0000:11:00.0"
    (dev / "vendor").write_text(value + "\n")
    (dev / "device").write_text(value + "\n")
    f = discover(r)
    assert f.gpu("0000:11:00.0") is None and len(f.gpus) == 7
    assert [w for w in f.warnings if w.startswith("0000:11:00.0:")] == [
        "0000:11:00.0: vendor/device ids unreadable (0xffff, 0x0000 or missing); "
        "the device may have fallen off the bus"
    ]
    fn = read_pci_function(r, "0000:11:00.0")
    assert (fn.readable, fn.vendor, fn.device, fn.class_) == (False, None, None, "0x030200")


def test_bad_numbers_in_attributes(fresh_host):
    r = fresh_host("seed")
    d = r / "sys/bus/pci/devices"
    (d / "0000:61:00.0/numa_node").write_text("banana\n")
    (d / "0000:91:00.0/local_cpulist").write_text("x-y\n")
    (d / "0000:91:00.0/numa_node").write_text("-1\n")
    (r / "sys/devices/system/node/node1/cpulist").write_text("nonsense\n")
    f = discover(r)
    assert f.gpu("0000:61:00.0").numa_node == 0  # local_cpulist 0-63,128-191 names node 0
    assert f.gpu("0000:91:00.0").numa_node is None
    assert any("node1/cpulist" in w for w in f.warnings)


def test_no_iommu_groups_directory_at_all(fresh_host):
    r = fresh_host("iommu-off")
    (r / "sys/kernel/iommu_groups").rmdir()
    f = discover(r)
    assert len(f.gpus) == 2 and all(g.iommu_group is None for g in f.gpus)
    assert not f.host.iommu_enabled and any("no IOMMU groups" in w for w in f.warnings)


WIDE_DOMAINS = """\
hostname: wide
cmdline: ro amd_iommu=on
numa: [{id: 0, cpus: "0-7"}, {id: 1, cpus: "8-15"}]
root_numa: {"0001:40": 0, "10000:00": 1}
modules: [nvidia]
devices:
  - {addr: "0001:40:01.1", preset: pcie-root-port}
  - {addr: "0001:41:00.0", parent: "0001:40:01.1", preset: rtx-6000-ada, minor: 1}
  - {addr: "0001:41:00.1", parent: "0001:40:01.1", preset: rtx-6000-ada-audio}
  - {addr: "10000:00:01.0", preset: intel-root-port}
  - {addr: "10000:01:00.0", parent: "10000:00:01.0", preset: rtx-pro-6000, minor: 0}
"""


def test_nonzero_and_five_digit_domains(tmp_path):
    from gputopo.sim.hostroot import materialize

    desc = tmp_path / "wide.yaml"
    desc.write_text(WIDE_DOMAINS)
    r = materialize(desc, tmp_path / "root")
    f = discover(r)
    assert [g.address for g in f.gpus] == ["0001:41:00.0", "10000:01:00.0"]  # numeric domain order
    a, b = f.gpus
    assert (a.numa_node, a.minor, a.functions) == (0, 1, ["0001:41:00.1"])
    assert [(m.address, m.role) for m in a.iommu_members] == [("0001:41:00.1", MemberRole.FUNCTION)]
    assert (b.numa_node, b.minor, b.driver, b.model) == (
        1,
        0,
        "nvidia",
        "GB202GL [RTX PRO 6000 Blackwell Server Edition]",
    )
    assert b.iommu_group is not None and b.iommu_group != a.iommu_group
    assert read_pci_function(r, "10000:01:00.0").address == "10000:01:00.0"
    assert f.warnings == []


def test_cpu_less_numa_nodes(fresh_host):
    r = fresh_host("seed")
    node2 = r / "sys/devices/system/node/node2"
    node2.mkdir()
    (node2 / "cpulist").write_text("\n")  # memory only (CXL, HBM): the kernel prints an empty list
    d = r / "sys/bus/pci/devices"
    (d / "0000:81:00.0/numa_node").write_text("2\n")
    (d / "0000:91:00.0/numa_node").write_text("-1\n")
    f = discover(r)
    assert [(n.id, n.cpulist, n.has_cpus) for n in f.host.numa_nodes] == [
        (0, "0-63,128-191", True),
        (1, "64-127,192-255", True),
        (2, "", False),
    ]
    assert (f.gpu("0000:81:00.0").numa_node, f.gpu("0000:81:00.0").numa_source) == (2, "sysfs")
    assert (f.gpu("0000:91:00.0").numa_node, f.gpu("0000:91:00.0").numa_source) == (1, "cpulist")
    assert f.warnings == []


def test_nvswitch_is_not_a_gpu(fresh_host):
    r = fresh_host("seed")
    (r / "sys/bus/pci/devices/0000:f1:00.0/class").write_text("0x068000\n")
    for everyone in (False, True):
        f = discover(r, all_vendors=everyone)
        assert f.gpu("0000:f1:00.0") is None
        assert [s.address for s in f.nvswitches] == ["0000:f1:00.0"] and f.nvswitches[0].is_nvswitch


def test_nvidia_information_with_wide_uppercase_dir(fresh_host):
    r = fresh_host("seed")
    gpus = r / "proc/driver/nvidia/gpus"
    (gpus / "0000:e1:00.0").rename(gpus / "00000000:E1:00.0")
    f = discover(r)
    assert f.gpu("0000:e1:00.0").minor == 7
    (gpus / "0000:f1:00.0/information").unlink()
    f = discover(r)
    assert f.gpu("0000:f1:00.0").minor is None
    assert any("0000:f1:00.0" in w for w in f.warnings)


def test_not_a_sysfs_root(tmp_path):
    with pytest.raises(RootError) as e:
        discover(tmp_path)
    assert str(tmp_path) in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(RootError):
        list_pci_functions(tmp_path)


# --- CLI ---------------------------------------------------------------------------------------


def test_cli_discover_json_and_table(materialized):
    from gputopo.cli import cli

    r = str(materialized("seed"))
    res = CliRunner().invoke(cli, ["discover", "--root", r, "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert len(data["gpus"]) == 8 and data["gpus"][0]["class"] == "0x030200"
    res = CliRunner().invoke(cli, ["discover", "--root", r])
    assert res.exit_code == 0
    assert "0000:e1:00.0" in res.output and "RTX PRO 6000 Blackwell Server Edition" in res.output
    res = CliRunner().invoke(cli, ["discover", "--root", r, "--json", "--gpu-match", "0x1a03:0x03"])
    assert [g["address"] for g in json.loads(res.output)["gpus"]] == ["0000:63:00.0"]


@pytest.mark.parametrize("kind", ["empty dir", "missing", "plain file", "junk tarball"])
@pytest.mark.slow
def test_cli_bad_root_is_one_line_exit_2(tmp_path, kind):
    root = {
        "empty dir": tmp_path,
        "missing": tmp_path / "nope",
        "plain file": tmp_path / "f",
        "junk tarball": tmp_path / "snap.tar.gz",
    }[kind]
    if kind in ("plain file", "junk tarball"):
        root.write_text("not a host\n")
    p = subprocess.run(
        [sys.executable, "-m", "gputopo", "discover", "--root", str(root)], capture_output=True, text=True
    )
    assert p.returncode == 2, p.stderr
    assert p.stdout == "" and p.stderr.strip().count("\n") == 0 and "Traceback" not in p.stderr
    assert p.stderr.startswith(f"gputopo: error: {root}: ")
    assert ("cannot read snapshot" if kind == "junk tarball" else "not a sysfs root") in p.stderr


def test_cli_schema_facts():
    from gputopo.cli import cli

    res = CliRunner().invoke(cli, ["schema", "facts"])
    assert res.exit_code == 0
    schema = json.loads(res.output)
    assert "gpus" in schema["properties"] and "host" in schema["properties"]
    gpu = schema["$defs"]["Gpu"]["properties"]

    def types(prop: dict) -> set[str]:
        return {x.get("type") for x in prop.get("anyOf", [prop])}

    for key in ("address", "vendor", "device", "class"):
        assert "string" in types(gpu[key]), key
    for key in ("numa_node", "iommu_group", "minor"):
        assert types(gpu[key]) == {"integer", "null"}, key
    assert types(gpu["driver"]) == {"string", "null"}


@pytest.mark.parametrize("host", ["seed", "esc8000a", "shared-group", "numa-unknown", "iommu-off"])
def test_cli_json_keeps_the_documented_shape(host, materialized):
    from gputopo.cli import cli

    res = CliRunner().invoke(cli, ["discover", "--root", str(materialized(host)), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert isinstance(data["host"], dict) and data["schema_version"] == 1 and data["gpus"]
    for g in data["gpus"]:
        assert re.fullmatch(r"[0-9a-f]{4,}:[0-9a-f]{2}:[0-1][0-9a-f]\.[0-7]", g["address"]), g["address"]
        assert re.fullmatch(r"0x[0-9a-f]{4}", g["vendor"]) and re.fullmatch(r"0x[0-9a-f]{4}", g["device"])
        assert re.fullmatch(r"0x03[0-9a-f]{4}", g["class"])
        for key in ("numa_node", "iommu_group", "minor"):
            assert g[key] is None or (isinstance(g[key], int) and g[key] >= 0), (key, g[key])
        assert g["driver"] is None or isinstance(g["driver"], str)


def test_cli_table_marks_unknowns(materialized):
    from gputopo.cli import cli

    res = CliRunner().invoke(cli, ["discover", "--root", str(materialized("numa-unknown"))])
    assert res.exit_code == 0, res.output
    rows = {line.split()[1]: line for line in res.output.splitlines() if re.match(r"^\S\s+0000:", line)}
    assert re.search(r"│\s+0\*\s+│", rows["0000:01:00.0"]) and re.search(r"│\s+\?\s+│", rows["0000:81:00.0"])
    assert "derived from local_cpulist" in res.output
    res = CliRunner().invoke(cli, ["discover", "--root", str(materialized("iommu-off"))])
    assert "IOMMU: off (no groups)" in res.output


def test_vendor_only_match_takes_every_class(materialized):
    f = discover(materialized("esc8000a"), gpu_match=[("0x1a03", None)])
    assert [x.address for x in f.gpus] == ["0000:74:00.0", "0000:75:00.0"]  # the bridge too


def test_python_dash_m_runs_the_cli():
    from gputopo import __version__

    p = subprocess.run([sys.executable, "-m", "gputopo", "--version"], capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.splitlines()[0] == f"gputopo, version {__version__}"
    p = subprocess.run([sys.executable, "-m", "gputopo", "--help"], capture_output=True, text=True)
    assert p.returncode == 0 and "discover" in p.stdout and "snapshot" in p.stdout


HEAVY = ("pydantic", "rich", "yaml", "jinja2", "proxmoxer", "requests", "pyudev", "cryptography")


def test_version_start_up_imports_no_heavy_module():
    probe = (
        "import sys\nsys.argv = ['gputopo', '--version']\nfrom gputopo.cli import main\n"
        "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        f"heavy = {HEAVY!r}\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy), file=sys.stderr)\n"
    )
    p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("gputopo, version")
    assert p.stderr.strip() == "[]"
    # The probe sees them once a command that needs them runs, so it can tell.
    p = subprocess.run(
        [sys.executable, "-c", probe.replace("'--version'", "'schema', 'facts'")],
        capture_output=True,
        text=True,
    )
    assert "pydantic" in p.stderr.splitlines()[-1]


def test_main_keeps_a_commands_exit_code(monkeypatch):
    import click

    from gputopo.cli import LazyGroup, main

    @click.command()
    @click.pass_context
    def failing(ctx):
        ctx.exit(3)

    monkeypatch.setattr(LazyGroup, "get_command", lambda self, ctx, name: failing)
    with pytest.raises(SystemExit) as e:
        main(["failing"])
    assert e.value.code == 3
