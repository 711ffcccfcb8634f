"""Discovery: pure parsers on literal strings, fixtures end to end, and odd hosts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from gputopo.discover import (
    discover,
    find_holders,
    list_pci_functions,
    numa_from_cpulist,
    parse_bool_param,
    parse_cpulist,
    parse_gpu_match,
    parse_hex_id,
    parse_iommu_mode,
    parse_modules,
    parse_nvidia_information,
    parse_nvidia_version,
    parse_pci_ids,
    parse_reset_method,
    read_pci_function,
)
from gputopo.errors import InputError, RootError
from gputopo.model import MemberRole

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


def test_parse_cpulist():
    assert parse_cpulist("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert parse_cpulist("\n") == set()
    assert parse_cpulist(None) == set()
    with pytest.raises(ValueError):
        parse_cpulist("a-b")


@pytest.mark.parametrize("cmdline, mode", [
    ("BOOT_IMAGE=/vmlinuz ro quiet amd_iommu=on", None),
    ("ro quiet amd_iommu=on iommu=pt", "pt"),
    ("ro intel_iommu=on,pt", "pt"),
    ("ro amd_iommu=pt", "pt"),
    ("ro iommu=off", "off"),
    ("ro intel_iommu=off iommu=pt", "off"),
    ("ro myiommu=pt", None),
])
def test_parse_iommu_mode(cmdline, mode):
    assert parse_iommu_mode(cmdline) == mode


def test_parse_modules_and_params():
    text = ("nvidia_uvm 1961984 0 - Live 0x0000000000000000 (PO)\n"
            "nvidia 60960768 2 nvidia_uvm,nvidia_modeset, Live 0x0000000000000000 (POE)\n\n")
    assert parse_modules(text) == {"nvidia_uvm", "nvidia"}
    assert parse_bool_param("Y\n") is True and parse_bool_param("0") is False
    assert parse_bool_param("maybe") is None and parse_bool_param(None) is None
    assert parse_reset_method("flr bus\n") == ["flr", "bus"]
    assert parse_reset_method(None) is None


def test_parse_nvidia_version_and_information():
    open_mod = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.133.20  Release Build  "
                "(dvs-builder@U16-I3-B03-4-3)  Fri Mar 14 21:19:51 UTC 2025\nGCC version:  gcc 12\n")
    legacy = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n"
    assert parse_nvidia_version(open_mod) == "570.133.20"
    assert parse_nvidia_version(legacy) == "550.54.15"
    assert parse_nvidia_version("") is None
    info = parse_nvidia_information(
        "Model: \t\t NVIDIA RTX PRO 6000 Blackwell Server Edition\nIRQ:   \t\t 45\n"
        "GPU UUID: \t GPU-63a7bec0-1fd4-4bff-b151-64588dfc84b8\nBus Location: \t 0000:61:00.0\n"
        "Device Minor: \t 3\nGPU Excluded:\t No\n")
    assert info["Device Minor"] == "3"
    assert info["GPU UUID"] == "GPU-63a7bec0-1fd4-4bff-b151-64588dfc84b8"
    assert info["Bus Location"] == "0000:61:00.0"


def test_parse_pci_ids_and_gpu_match():
    db = ("# comment\n10de  NVIDIA Corporation\n\t2bb5  GB202GL [RTX PRO 6000 Blackwell Server Edition]\n"
          "\t\t10de 204e  RTX PRO 6000 Blackwell Server Edition\n\t26b1  AD102GL [RTX 6000 Ada Generation]\n"
          "1a03  ASPEED\n\t2000  ASPEED Graphics Family\nC 03  Display controller\n\t00  VGA\n")
    got = parse_pci_ids(db, {("10de", "2bb5"), ("1a03", "2000"), ("10de", "ffff")})
    assert got == {("10de", "2bb5"): "GB202GL [RTX PRO 6000 Blackwell Server Edition]",
                   ("1a03", "2000"): "ASPEED Graphics Family"}
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


# --- the shipped hosts ---------------------------------------------------------------------


def test_seed(materialized):
    f = discover(materialized("seed"))
    assert [g.address for g in f.gpus] == ["0000:01:00.0", "0000:11:00.0", "0000:61:00.0", "0000:71:00.0",
                                           "0000:81:00.0", "0000:91:00.0", "0000:e1:00.0", "0000:f1:00.0"]
    assert {g.address[5:7]: g.numa_node for g in f.gpus} == {
        "01": 0, "11": 0, "61": 0, "71": 0, "81": 1, "91": 1, "e1": 1, "f1": 1}
    assert {g.address[5:7]: g.minor for g in f.gpus} == {
        "01": 0, "11": 1, "61": 3, "71": 2, "81": 4, "91": 5, "e1": 7, "f1": 6}
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
        ("0000:01:00.1", MemberRole.FUNCTION, "snd_hda_intel")]
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
    assert roles == {"0000:01:00.0": MemberRole.BRIDGE, "0000:02:00.0": MemberRole.BRIDGE,
                     "0000:02:01.0": MemberRole.BRIDGE, "0000:03:00.1": MemberRole.FUNCTION,
                     "0000:04:00.0": MemberRole.FOREIGN}
    assert [m.address for m in g.foreign_members] == ["0000:04:00.0"]
    assert f.gpu("0000:04:00.0") is None
    vf = f.gpu("0000:06:00.0")
    assert vf.driver == "vfio-pci" and vf.minor is None
    assert f.host.vfio_groups == [vf.iommu_group]


def test_numa_unknown(materialized):
    f = discover(materialized("numa-unknown"))
    got = {g.address: (g.numa_node, g.numa_source) for g in f.gpus}
    assert got == {"0000:01:00.0": (0, "cpulist"), "0000:02:00.0": (0, "cpulist"),
                   "0000:81:00.0": (None, None), "0000:82:00.0": (None, None)}
    assert sum("NUMA node unknown" in w for w in f.warnings) == 2


def test_iommu_off(materialized):
    f = discover(materialized("iommu-off"))
    assert len(f.gpus) == 2 and all(g.iommu_group is None and g.iommu_members == [] for g in f.gpus)
    h = f.host
    assert (h.iommu_enabled, h.iommu_group_count, h.iommu_mode, h.modules.vfio) == (False, 0, None, False)
    assert h.vfio_groups == []
    assert any("no IOMMU groups" in w for w in f.warnings)


def test_large(materialized):
    r = materialized("large")
    t = time.perf_counter()
    f = discover(r)
    elapsed = time.perf_counter() - t
    assert elapsed < 10, elapsed  # generous for a shared runner; the benchmark measures it
    pfs = [g for g in f.gpus if g.sriov_numvfs]
    assert len(pfs) == 1 and pfs[0].sriov_numvfs == 4 and pfs[0].sriov_totalvfs == 32
    assert len(f.gpus) >= 64
    assert len(f.nvswitches) == 2 and all(s.is_nvswitch for s in f.nvswitches)
    assert not {s.address for s in f.nvswitches} & {g.address for g in f.gpus}
    assert {g.address.split(":")[0] for g in f.gpus} == {"0000", "0001"}
    assert {n.id: n.has_cpus for n in f.host.numa_nodes} == {0: True, 1: True, 2: False, 3: False,
                                                              4: True, 5: True}
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


def test_missing_and_odd_attributes_do_not_crash(fresh_host):
    r = fresh_host("seed")
    d = r / "sys/bus/pci/devices"
    (d / "0000:01:00.0/numa_node").unlink()
    (d / "0000:01:00.0/current_link_speed").unlink()
    (d / "0000:11:00.0/vendor").write_text("0x0000\n")
    (d / "0000:61:00.0/numa_node").write_text("banana\n")
    (d / "0000:71:00.0/reset_method").unlink()
    (d / "0000:81:00.0/iommu_group").unlink()
    (d / "0000:91:00.0/local_cpulist").write_text("x-y\n")
    (d / "0000:91:00.0/numa_node").write_text("-1\n")
    (r / "proc/modules").unlink()
    (r / "sys/devices/system/node/node1/cpulist").write_text("nonsense\n")
    f = discover(r)
    g1 = f.gpu("0000:01:00.0")
    assert g1.numa_node == 0 and g1.numa_source == "cpulist"  # derived from local_cpulist
    assert g1.link.current_speed is None and g1.link.max_speed == "32.0 GT/s PCIe"
    assert f.gpu("0000:11:00.0") is None
    assert any("0000:11:00.0" in w for w in f.warnings)
    assert f.gpu("0000:71:00.0").reset_method is None
    assert f.gpu("0000:91:00.0").numa_node is None
    assert any("proc/modules" in w for w in f.warnings)
    assert any("node1/cpulist" in w for w in f.warnings)
    assert not f.host.modules.nvidia


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


# --- holders ---------------------------------------------------------------------------------


def test_find_holders(tmp_path):
    for pid, comm, targets in [(100, "python3", ["/dev/nvidia3", "/dev/nvidiactl", "/dev/null"]),
                               (200, "nvidia-persiste", ["/dev/nvidia3"]),
                               (300, "bash", ["/dev/pts/0", "pipe:[1234]"])]:
        fd = tmp_path / "proc" / str(pid) / "fd"
        fd.mkdir(parents=True)
        (tmp_path / "proc" / str(pid) / "comm").write_text(comm + "\n")
        for i, t in enumerate(targets):
            os.symlink(t, fd / str(i))
    # A simulated host may link into its own root.
    fd = tmp_path / "proc/400/fd"
    fd.mkdir(parents=True)
    os.symlink(str(tmp_path / "dev/nvidia5"), fd / "3")
    got = find_holders(tmp_path, ["/dev/nvidia3", "/dev/nvidiactl", "/dev/nvidia5", "/dev/nvidia0"])
    assert got == {"/dev/nvidia3": [(100, "python3"), (200, "nvidia-persiste")],
                   "/dev/nvidiactl": [(100, "python3")], "/dev/nvidia5": [(400, "?")]}
    assert find_holders(tmp_path / "nowhere", ["/dev/nvidia0"]) == {}


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


def test_cli_bad_root_is_one_line_exit_2(tmp_path):
    p = subprocess.run([sys.executable, "-m", "gputopo", "discover", "--root", str(tmp_path)],
                       capture_output=True, text=True)
    assert p.returncode == 2
    assert p.stderr.strip().count("\n") == 0 and "not a sysfs root" in p.stderr


def test_cli_schema_facts():
    from gputopo.cli import cli

    res = CliRunner().invoke(cli, ["schema", "facts"])
    assert res.exit_code == 0
    schema = json.loads(res.output)
    assert "gpus" in schema["properties"] and "Gpu" in schema["$defs"]


def test_vendor_only_match_takes_every_class(materialized):
    f = discover(materialized("esc8000a"), gpu_match=[("0x1a03", None)])
    assert [x.address for x in f.gpus] == ["0000:74:00.0", "0000:75:00.0"]  # the bridge too
