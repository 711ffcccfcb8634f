"""Discovery records where each GPU and NVSwitch hangs: host bridge, root port, switch ports."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from gputopo.facts.discover import discover
from gputopo.facts.tree import bridge_kinds, parse_device_path, parse_pcie_port_type
from gputopo.model.facts import Facts
from helpers.hosts import host_params
from helpers.lspci import LSPCI, lspci, parse_lspci_tree


def _config(port_type: int | None, *, cap_at: int = 0x40, chain: bool = False) -> bytes:
    """A config space with a PCI Express capability of ``port_type`` (None: no capability
    list); ``chain`` puts a power-management capability (id 0x01) first."""
    cfg = bytearray(256)
    cfg[0:4] = bytes.fromhex("de10b52b")
    if port_type is None:
        return bytes(cfg)
    cfg[0x06] = 0x10  # Status: capabilities list
    if chain:
        cfg[0x34] = 0x60
        cfg[0x60:0x62] = bytes([0x01, cap_at])  # PM capability, next -> Express
    else:
        cfg[0x34] = cap_at
    cfg[cap_at] = 0x10
    cfg[cap_at + 2 : cap_at + 4] = (0x0002 | (port_type << 4)).to_bytes(2, "little")
    return bytes(cfg)


@pytest.mark.parametrize(
    "rel, want",
    [
        ("pci0000:00/0000:00:01.1/0000:01:00.0", ("0000:00", ["0000:00:01.1", "0000:01:00.0"])),
        (
            "pci0000:80/0000:80:01.1/0000:81:00.0/0000:82:00.0/0000:83:00.0",
            ("0000:80", ["0000:80:01.1", "0000:81:00.0", "0000:82:00.0", "0000:83:00.0"]),
        ),
        ("pci10000:00/10000:00:01.0/10000:01:00.0", ("10000:00", ["10000:00:01.0", "10000:01:00.0"])),
        # a VMD domain nested under a PCI device keeps the outer host bridge
        (
            "pci0000:00/0000:00:0e.0/pci10000:00/10000:00:02.0/10000:01:00.0",
            ("0000:00", ["0000:00:0e.0", "10000:00:02.0", "10000:01:00.0"]),
        ),
        ("platform/ACPI0016:00/pci0002:00/0002:00:00.0", ("0002:00", ["0002:00:00.0"])),
        ("virtual/net/lo", (None, [])),
    ],
)
def test_parse_device_path(rel, want):
    assert parse_device_path(rel) == want


@pytest.mark.parametrize(
    "cfg, want",
    [
        (_config(4), 4),
        (_config(5, cap_at=0x68), 5),
        (_config(6, chain=True), 6),
        (_config(0), 0),
        (_config(None), None),  # no capability list
        (_config(4)[:64], None),  # a non-root reader sees 64 bytes: the capability is beyond
        (b"\xff" * 256, None),  # fell off the bus
        (b"", None),
        (None, None),
    ],
)
def test_parse_pcie_port_type(cfg, want):
    assert parse_pcie_port_type(cfg) == want


def test_parse_pcie_port_type_survives_a_capability_loop():
    cfg = bytearray(_config(4, chain=True))
    cfg[0x60:0x62] = bytes([0x01, 0x60])  # points at itself, no Express capability reached
    assert parse_pcie_port_type(bytes(cfg)) is None


@pytest.mark.parametrize(
    "types, want",
    [
        ([4, 5, 6], ["root_port", "switch_upstream", "switch_downstream"]),
        ([None, None, None], ["root_port", "switch_upstream", "switch_downstream"]),
        (
            [None, None, None, None, None],
            ["root_port", "switch_upstream", "switch_downstream", "switch_upstream", "switch_downstream"],
        ),
        ([4, 7], ["root_port", "pcie_to_pci"]),
        ([4, 7, None], ["root_port", "pcie_to_pci", "bridge"]),
        ([], []),
    ],
)
def test_bridge_kinds(types, want):
    assert bridge_kinds(types) == want


@pytest.mark.slow  # about half a second or more: out of the one-minute loop
def test_large_host_chains(materialized):
    facts = discover(materialized("large"))
    g = facts.gpu("0000:04:00.0")
    assert g.host_bridge == "0000:00"
    assert [(b.address, b.kind) for b in g.upstream] == [
        ("0000:00:01.1", "root_port"),
        ("0000:01:00.0", "switch_upstream"),
        ("0000:02:01.0", "switch_downstream"),
    ]
    assert g.upstream[1].model == "PEX890xx PCIe Gen 5 Switch"
    assert g.local_cpulist == "0-47,192-239"
    assert len(facts.nvswitches) == 2
    for s in facts.nvswitches:
        assert s.host_bridge is not None and s.upstream[-1].kind == "switch_downstream"
    # the 5-digit domain and the second domain keep their own host bridges
    assert {g.host_bridge for g in facts.gpus} == {"0000:00", "0000:80", "0001:00", "0001:80"}


def test_seed_host_one_root_port_per_gpu(materialized):
    facts = discover(materialized("seed"))
    assert [(g.address, g.host_bridge, [b.address for b in g.upstream]) for g in facts.gpus][:2] == [
        ("0000:01:00.0", "0000:00", ["0000:00:01.1"]),
        ("0000:11:00.0", "0000:10", ["0000:10:01.1"]),
    ]
    assert all(len(g.upstream) == 1 and g.upstream[0].kind == "root_port" for g in facts.gpus)


def test_facts_json_carries_the_chain_and_stays_valid(materialized):
    facts = discover(materialized("shared-group"))
    back = Facts.model_validate_json(facts.to_json())
    assert [b.kind for b in back.gpu("0000:03:00.0").upstream] == [
        "root_port",
        "switch_upstream",
        "switch_downstream",
    ]
    assert back.gpu("0000:05:00.0").upstream[0].address == "0000:00:03.1"


def test_kinds_inferred_when_config_is_short(fresh_host):
    root = fresh_host("shared-group")
    devs = root / "sys/bus/pci/devices"
    for name in os.listdir(devs):
        cfg = devs / name / "config"
        cfg.write_bytes(cfg.read_bytes()[:64])  # what a non-root reader sees
    g = discover(root).gpu("0000:03:00.0")
    assert [b.kind for b in g.upstream] == ["root_port", "switch_upstream", "switch_downstream"]


def test_a_link_that_leads_nowhere_is_reported(fresh_host):
    root = fresh_host("seed")
    link = root / "sys/bus/pci/devices/0000:81:00.0"
    target = os.readlink(link)
    link.unlink()
    os.symlink("/nonexistent/" + os.path.basename(target), link)
    facts = discover(root)
    assert facts.gpu("0000:81:00.0") is None or facts.gpu("0000:81:00.0").host_bridge is None
    # a plain directory instead of the link: read, but its place is unknown
    shutil.copytree(os.path.join(os.path.dirname(link), target), root / "copy", symlinks=True)
    link.unlink()
    os.rename(root / "copy", link)
    facts = discover(root)
    assert facts.gpu("0000:81:00.0").host_bridge is None
    assert any("0000:81:00.0" in w and "place in the PCI tree is unknown" in w for w in facts.warnings)


@pytest.mark.skipif(LSPCI is None, reason="lspci (pciutils) is not installed")
@pytest.mark.parametrize("host", host_params(["large", "shared-group", "esc8000a"]))
def test_chains_agree_with_lspci(materialized, host):
    """lspci's tree gives each device's parent bridge and its -vv the port type: the chains
    discovery records are the same."""
    root = materialized(host)
    parents = parse_lspci_tree(lspci(root, "-t"))
    facts = discover(root)
    for d in [*facts.gpus[:12], *facts.nvswitches]:
        chain, a = [], parents.get(d.address)
        while a is not None:
            chain.insert(0, a)
            a = parents.get(a)
        assert [b.address for b in d.upstream] == chain, d.address
    names = {
        "root_port": "Root Port",
        "switch_upstream": "Upstream Port",
        "switch_downstream": "Downstream Port",
    }
    seen = {b.address: b.kind for d in facts.gpus for b in d.upstream}
    for addr, kind in list(seen.items())[:10]:
        out = subprocess.run(
            [LSPCI, "-A", "linux-sysfs", "-O", f"sysfs.path={root}/sys/bus/pci", "-vv", "-s", addr],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert f"Express (v2) {names[kind]}" in out, (addr, out)


def test_a_snapshot_keeps_the_chains(materialized, tmp_path):
    """``gputopo snapshot`` keeps the device links and config space: discovery from the archive
    finds the same chains, kinds included."""
    from gputopo.facts.snapshot import opened_root, snapshot

    root = materialized("shared-group")
    snapshot(root, tmp_path / "host.tar.gz")
    with opened_root(str(tmp_path / "host.tar.gz")) as r:
        again = discover(r)
    want = discover(root)
    assert [(g.host_bridge, g.upstream) for g in again.gpus] == [
        (g.host_bridge, g.upstream) for g in want.gpus
    ]
    assert [b.kind for b in again.gpu("0000:03:00.0").upstream] == [
        "root_port",
        "switch_upstream",
        "switch_downstream",
    ]
