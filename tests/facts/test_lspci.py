"""The real pciutils ``lspci`` reads the built fixtures and agrees with discovery."""

from __future__ import annotations

import os

import pytest

from gputopo.facts.discover import discover
from gputopo.facts.pci import list_pci_functions
from helpers.hosts import host_params
from helpers.lspci import LSPCI, lspci, parse_lspci_nn, parse_lspci_tree

pytestmark = pytest.mark.skipif(LSPCI is None, reason="lspci (pciutils) is not installed")


def test_tree_parser_on_literal_output():
    text = (
        "-+-[0000:00]-+-00.0\n"
        " |           +-01.1-[01-02]----00.0-[02]--+-00.0\n"
        " |           |                            \\-00.1\n"
        " |           \\-14.0\n"
        " \\-[0001:80]---01.1-[81]----00.0\n"
    )
    assert parse_lspci_tree(text) == {
        "0000:00:00.0": None,
        "0000:00:01.1": None,
        "0000:01:00.0": "0000:00:01.1",
        "0000:02:00.0": "0000:01:00.0",
        "0000:02:00.1": "0000:01:00.0",
        "0000:00:14.0": None,
        "0001:80:01.1": None,
        "0001:81:00.0": "0001:80:01.1",
    }


@pytest.mark.parametrize("host", host_params())
def test_lspci_agrees_with_discovery(host, materialized):
    r = materialized(host)
    seen = parse_lspci_nn(lspci(r, "-D", "-nn"))
    ours = {f.address: f for f in list_pci_functions(r)}
    assert set(seen) == set(ours)
    for addr, (ven, dev, cls) in seen.items():
        f = ours[addr]
        if f.readable:
            assert (f"0x{ven}", f"0x{dev}") == (f.vendor, f.device), addr
            assert f.class_[2:6] == cls, addr
        else:
            assert (ven, dev) == ("ffff", "ffff"), addr


@pytest.mark.parametrize("host", host_params())
def test_lspci_tree_matches_sysfs_parents(host, materialized):
    r = materialized(host)
    tree = parse_lspci_tree(lspci(r, "-t"))
    devdir = r / "sys/bus/pci/devices"
    want = {}
    for a in os.listdir(devdir):
        parent = (devdir / a).resolve().parent.name
        want[a] = parent if not parent.startswith("pci") else None
    assert tree == want


def parse_lspci_vmm(text: str) -> dict[str, dict[str, str]]:
    """``lspci -vmm`` -> {address: {field: value}} (one record per blank-line separated block)."""
    out = {}
    for block in text.strip().split("\n\n"):
        rec = dict(line.split(":\t", 1) for line in block.splitlines())
        out[rec["Slot"]] = rec
    return out


def test_vmm_parser_on_literal_output():
    text = (
        "Slot:\t0000:01:00.0\nClass:\tClass [0300]\nDevice:\tAD102GL [RTX 6000 Ada Generation] [26b1]\n"
        "Driver:\tnvidia\nNUMANode:\t0\nIOMMUGroup:\t5\n\nSlot:\t0000:01:00.1\nRev:\ta1\n"
    )
    assert parse_lspci_vmm(text) == {
        "0000:01:00.0": {
            "Slot": "0000:01:00.0",
            "Class": "Class [0300]",
            "Driver": "nvidia",
            "NUMANode": "0",
            "Device": "AD102GL [RTX 6000 Ada Generation] [26b1]",
            "IOMMUGroup": "5",
        },
        "0000:01:00.1": {"Slot": "0000:01:00.1", "Rev": "a1"},
    }


@pytest.mark.parametrize("host", host_params())
def test_lspci_vmm_agrees_on_driver_numa_group_subsystem_and_name(host, materialized):
    r = materialized(host)
    # -i: names from the root's own pci.ids, the one discovery reads.
    seen = parse_lspci_vmm(lspci(r, "-i", str(r / "usr/share/misc/pci.ids"), "-D", "-nn", "-vmm", "-k"))
    ours = {f.address: f for f in list_pci_functions(r)}
    assert set(seen) == set(ours)
    for addr, rec in seen.items():
        f = ours[addr]
        assert rec.get("Driver") == f.driver, addr
        assert (int(rec["NUMANode"]) if "NUMANode" in rec else None) == f.numa_node, addr
        assert (int(rec["IOMMUGroup"]) if "IOMMUGroup" in rec else None) == f.iommu_group, addr
        if "SVendor" in rec:
            assert rec["SVendor"].endswith(f"[{f.subsystem_vendor[2:]}]"), addr
            assert rec["SDevice"].endswith(f"[{f.subsystem_device[2:]}]"), addr
        else:  # lspci leaves out a subsystem vendor of 0
            assert f.subsystem_vendor in (None, "0x0000"), addr
    for g in discover(r).gpus:
        name = seen[g.address]["Device"].rsplit(" [", 1)[0]
        assert g.model == name, g.address
