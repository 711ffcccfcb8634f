"""Owners of GPUs from Proxmox's state, and the tree that shows them."""

from __future__ import annotations

import pytest

from gputopo.adapters.pvefiles import PveFiles
from gputopo.facts.current import read_current
from gputopo.facts.discover import discover
from gputopo.formats.hostpci import hostpci_refs
from gputopo.model.owner import Owner
from gputopo.model.reads import EVERY_GUEST
from gputopo.model.state import ContainerState, CurrentState, GuestState, MappingState
from gputopo.topo import palette
from gputopo.topo.model import GpuView, OwnerView, TopoReport
from gputopo.topo.owners import (
    container_minors,
    mapping_addresses,
    mapping_users,
    owner_from_target,
    owners_now,
)
from gputopo.topo.tree import build_report, gpu_views, link_text, owner_counts, unplaced

MAP81 = "id=10de:2bb5,iommugroup=25,node=pve1,path=0000:81:00.0,subsystem-id=10de:204e"


def test_container_minors_from_devn_and_legacy_lines():
    config = {
        "dev0": "/dev/nvidia0,gid=44,mode=0666",
        "dev1": "path=/dev/nvidia12",
        "dev2": "/dev/nvidiactl",
        "dev3": "/dev/nvidia-caps/nvidia-cap1",
        "dev4": "not a dev value,bogus=1",
        "net0": "/dev/nvidia9",
        "lxc": [
            ["lxc.mount.entry", "/dev/nvidia3 dev/nvidia3 none bind,optional,create=file"],
            ["lxc.cgroup2.devices.allow", "c 195:* rwm"],
            ["lxc.mount.entry", ""],
        ],
    }
    assert container_minors(config) == {0, 3, 12}


def test_mapping_addresses_per_node():
    maps = [
        MAP81,
        "id=10de:2bb5,node=pve2,path=0000:91:00.0",
        "id=10de:2bb5,node=pve1,path=0000:e1:00.0;0000:e1:00.1",
        "garbage",
    ]
    assert mapping_addresses(maps, "pve1") == {"0000:81:00.0", "0000:e1:00.0", "0000:e1:00.1"}
    assert "0000:91:00.0" in mapping_addresses(maps, None)


@pytest.mark.parametrize(
    "value, want",
    [
        ("mapping=pro6000-vm,pcie=1", ([], "pro6000-vm")),
        ("0000:81:00.0,pcie=1,x-vga=1", (["0000:81:00.0"], None)),
        ("81:00.0;81:00.1", (["0000:81:00.0", "0000:81:00.1"], None)),
        ("host=0000:81:00,pcie=1", (["0000:81:00"], None)),
        ("81:00", (["0000:81:00"], None)),
    ],
)
def test_hostpci_refs_as_owners_read_them(value, want):
    assert hostpci_refs(value) == want


def _state(seed_facts) -> CurrentState:
    """Container 101 has minors 0..3 (NUMA 0), container 102 minor 2 too; mapping pro6000-vm
    names 81 and 91, used by VM 201; VM 202 takes e1 by address."""
    return CurrentState(
        containers={
            101: ContainerState(config={f"dev{i}": f"/dev/nvidia{m}" for i, m in enumerate([0, 1, 3, 2])}),
            102: ContainerState(config={"dev0": "/dev/nvidia2"}),
        },
        mappings={"pro6000-vm": MappingState(map=[MAP81, MAP81.replace("81:00", "91:00")])},
        guests={
            201: GuestState(hostpci=["mapping=pro6000-vm,pcie=1"]),
            202: GuestState(hostpci=["0000:e1:00.0"]),
        },
    )


@pytest.fixture(scope="module")
def seed(materialized):
    facts = discover(materialized("seed"))
    for a in ("0000:81:00.0", "0000:91:00.0", "0000:e1:00.0"):
        g = facts.gpu(a)
        g.driver, g.minor = "vfio-pci", None
    return facts


def test_owners_now(seed):
    owners = owners_now(seed, _state(seed))
    assert owners["0000:01:00.0"] == OwnerView(kind="container", containers=[101])
    assert owners["0000:71:00.0"].label == "containers 101, 102"  # minor 2 granted to both
    assert owners["0000:81:00.0"] == OwnerView(kind="vm", mapping="pro6000-vm", vms=[201])
    assert owners["0000:81:00.0"].label == "VM mapping pro6000-vm · VM 201"
    assert owners["0000:e1:00.0"] == OwnerView(kind="vm", vms=[202])
    assert owners["0000:f1:00.0"].kind == "free"  # minor 6 is in no container


def test_a_mapped_gpu_still_on_nvidia_is_not_the_vms(seed):
    facts = seed.model_copy(deep=True)
    facts.gpu("0000:81:00.0").driver = "nvidia"
    facts.gpu("0000:81:00.0").minor = 4
    assert owners_now(facts, _state(seed))["0000:81:00.0"].kind == "free"
    # and a mapping line for another node does not count
    state = _state(seed)
    state.mappings["pro6000-vm"].map = [MAP81.replace("node=pve1", "node=pve2")]
    assert owners_now(seed, state)["0000:81:00.0"].kind == "free"


def test_owner_from_target(seed):
    before = OwnerView(kind="container", containers=[101])
    users = mapping_users(_state(seed))
    assert owner_from_target(Owner.vm("pro6000-vm"), before, users) == OwnerView(
        kind="vm", mapping="pro6000-vm", vms=[201]
    )
    assert owner_from_target(Owner.container(102), before, users).containers == [102]
    assert owner_from_target(Owner.host(), before, users) is before


CT101 = OwnerView(kind="container", containers=[101])
CT1000 = OwnerView(kind="container", containers=[1000])
CTS = OwnerView(kind="container", containers=[101, 102])
MAPPED = OwnerView(kind="vm", mapping="pro6000-vm", vms=[201])
RAW201 = OwnerView(kind="vm", vms=[201])
RAW1000 = OwnerView(kind="vm", vms=[1000])
FREE = OwnerView(kind="free")


def test_owner_view_is_the_plans_owner_where_there_is_one():
    assert CT101.owner == Owner.container(101) and MAPPED.owner == Owner.vm("pro6000-vm")
    assert CTS.owner is None and RAW201.owner is None and FREE.owner is None
    # a plan's container or mapping and back; the host leaves the picture's owner as it is
    for owner in (Owner.container(101), Owner.vm("pro6000-vm")):
        assert OwnerView.of(owner).owner == owner and OwnerView.of(owner).key == str(owner)
    assert OwnerView.of(Owner.vm("pro6000-vm"), [201]) == MAPPED
    with pytest.raises(ValueError):
        OwnerView.of(Owner.host())
    assert [o.key for o in (CTS, RAW201, FREE)] == ["container:101,102", "vm:#201", "free"]


def test_owner_view_sort_key():
    """Containers by vmid, VMs named by address by vmid, then mappings by name, then free."""
    shuffled = [FREE, MAPPED, RAW1000, CT1000, RAW201, CTS, CT101]
    assert sorted(shuffled, key=lambda o: o.sort_key) == [CT101, CTS, CT1000, RAW201, RAW1000, MAPPED, FREE]


def test_palette_follows_the_sort_key():
    colours = palette.assign([FREE, MAPPED, RAW1000, CT1000, RAW201, CT101, CT101])
    assert colours == {
        "container:101": palette.CONTAINERS[0],
        "container:1000": palette.CONTAINERS[1],
        "vm:#201": palette.VMS[0],
        "vm:#1000": palette.VMS[1],
        "vm:pro6000-vm": palette.VMS[2],
        "free": palette.FREE,
    }


def test_owner_counts_by_kind_then_key():
    """The JSON's ``owners``: containers, VMs, free; within a kind by key text, as it always was."""
    views = [
        GpuView(index=i, address=f"0000:{i:02x}:00.0", owner=o)
        for i, o in enumerate([FREE, MAPPED, CT101, RAW201, CT1000, CT101])
    ]
    assert [(c.key, c.label, c.gpus) for c in owner_counts(views)] == [
        ("container:1000", "container 1000", 1),
        ("container:101", "container 101", 2),
        ("vm:#201", "VM 201", 1),
        ("vm:pro6000-vm", "VM mapping pro6000-vm · VM 201", 1),
        ("free", "free", 1),
    ]


def test_tree_keeps_identical_gpus_apart(seed):
    report = build_report(seed, owners_now(seed, _state(seed)))
    views = gpu_views(report.tree)
    assert sorted(v.address for v in views) == [g.address for g in seed.gpus]  # each GPU once
    assert len({v.model for v in views}) == 1  # all eight identical, none merged
    assert [r.id for r in report.tree] == ["numa:0", "numa:1"]
    numa0 = report.tree[0]
    assert numa0.detail == "CPUs 0-63,128-191"
    assert [c.id for c in numa0.children] == ["0000:00", "0000:10", "0000:60", "0000:70"]
    rp = numa0.children[0].children[0]
    assert (rp.kind, rp.id, rp.children[0].id) == ("root_port", "0000:00:01.1", "0000:01:00.0")
    assert {(o.key, o.gpus) for o in report.owners} == {
        ("container:101", 3),
        ("container:101,102", 1),
        ("vm:pro6000-vm", 2),
        ("vm:#202", 1),
        ("free", 1),
    }
    assert TopoReport.model_validate_json(report.model_dump_json(by_alias=True)) == report


def test_large_tree_switches_and_nvswitches(materialized):
    facts = discover(materialized("large"))
    report = build_report(facts, {})
    kinds = [n.kind for r in report.tree for n in r.walk()]
    assert kinds.count("gpu") == len(facts.gpus) and kinds.count("nvswitch") == 2
    assert [r.id for r in report.tree] == [
        "numa:0",
        "numa:1",
        "numa:4",
        "numa:5",
    ]  # CPU-less 2, 3 hold nothing
    sw = report.tree[0].children[0].children[0].children[0]
    assert (sw.kind, sw.id, sw.detail) == ("switch", "0000:01:00.0", "PEX890xx PCIe Gen 5 Switch")
    # downstream ports are part of their switch: the GPUs hang from it directly
    assert {c.kind for c in sw.children} <= {"gpu", "nvswitch"}
    pf = next(v for v in gpu_views(report.tree) if v.address == "0000:03:00.0")
    assert [c.address for c in pf.companions] == []  # its VFs are GPUs of their own, not companions
    assert any("NVSwitch" in n for n in report.matrix.notes)


def test_companions_shown_with_roles(materialized):
    facts = discover(materialized("shared-group"))
    v = next(v for v in gpu_views(build_report(facts, {}).tree) if v.address == "0000:03:00.0")
    assert [(c.address, c.role) for c in v.companions] == [
        ("0000:03:00.1", "function"),
        ("0000:04:00.0", "foreign"),
    ]
    off = discover(materialized("iommu-off"))
    assert all(v.companions == [] and v.iommu_group is None for v in gpu_views(build_report(off, {}).tree))


def test_link_text(materialized):
    facts = discover(materialized("esc8000a"))
    assert link_text(facts.gpu("0000:01:00.0")) == "2.5GT/s x16 (max 16GT/s)"
    assert link_text(discover(materialized("seed")).gpus[0]) == "32GT/s x16"


def test_unplaced(seed):
    facts = seed.model_copy(deep=True)
    assert unplaced(facts) == []
    facts.gpus[2].host_bridge = None
    assert unplaced(facts) == ["0000:61:00.0"]


def read_node_guests(pve_root, node):
    return read_current(EVERY_GUEST, proxmox=PveFiles(pve_root, node))


def test_read_node_guests_from_a_simulated_pve(tmp_path):
    from gputopo.sim.host import SimHost

    host = SimHost.create(tmp_path / "sim", "seed")
    state = read_node_guests(host.paths.pve, host.node)
    assert list(state.containers) == [101] and list(state.guests) == [201]
    assert state.guests[201].hostpci == ["mapping=pro6000-vm,pcie=1"]
    assert "pro6000" in state.mappings
    facts = discover(host.paths.root)
    assert {o.label for o in owners_now(facts, state).values()} == {"container 101"}
    assert read_node_guests(tmp_path / "nowhere", "pve1") == CurrentState()
