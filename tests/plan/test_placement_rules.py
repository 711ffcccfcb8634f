"""Placement's rules on hosts with PCIe switches, against answers worked out here.

The DGX-2 host is hwloc's test topology of the real machine (``fixtures/hosts/dgx2.yaml``): 16
GPUs, two per switch, two switches under a switch per root port, two root ports per socket.
The expected sets are found by trying every set of GPUs, with distances read straight from the
host description's parent links (not with the planner's distance code).
"""

from __future__ import annotations

import itertools
import random

import pytest
import yaml

from gputopo.errors import PlanRefused
from gputopo.facts.discover import discover
from gputopo.formats.devn import format_dev
from gputopo.model.owner import Owner
from gputopo.model.state import ContainerState, CurrentState, MappingState
from gputopo.plan.mappings import map_entry
from gputopo.plan.placement import choose, clusters, explain
from gputopo.plan.planner import expected_after, plan
from gputopo.plan.spec import parse_spec
from gputopo.resources import fixtures_dir
from gputopo.topo.distance import distance

ORDER = ["PIX", "PXB", "PHB", "NODE", "SYS"]


class Described:
    """Distances between the GPUs of a host description, from its ``parent`` links alone."""

    def __init__(self, text: str):
        data = yaml.safe_load(text)
        devs = {"0000:" + d["addr"]: d for d in data["devices"]}
        self.numa = data["root_numa"]
        self.chain: dict[str, list[str]] = {}
        for a, d in devs.items():
            if not d["preset"].startswith(("v100", "rtx", "h100")):
                continue
            chain, p = [], d.get("parent")
            while p:
                chain.insert(0, "0000:" + p)
                p = devs["0000:" + p].get("parent")
            self.chain[a] = chain
        self.gpus = sorted(self.chain)

    def level(self, a: str, b: str) -> str:
        ca, cb = self.chain[a], self.chain[b]
        if len(ca) > 1 and len(cb) > 1 and ca[:-1] == cb[:-1]:  # one switch: its upstream port
            return "PIX"
        if ca[0] == cb[0]:
            return "PXB"
        if ca[0][:7] == cb[0][:7]:
            return "PHB"
        return "NODE" if self.numa[ca[0][:7]] == self.numa[cb[0][:7]] else "SYS"

    def worst(self, addrs) -> int:
        return max((ORDER.index(self.level(a, b)) for a, b in itertools.combinations(addrs, 2)), default=-1)

    def best(self, pool: list[str], n: int, held: set[str]) -> tuple[int, int]:
        """(the closest worst pair any ``n`` of ``pool`` can have, the fewest moves at that level)."""
        return min((self.worst(s), n - len(held & set(s))) for s in itertools.combinations(pool, n))


@pytest.fixture(scope="module")
def dgx2(materialized):
    return discover(materialized("dgx2"))


@pytest.fixture(scope="module")
def described():
    return Described((fixtures_dir() / "hosts" / "dgx2.yaml").read_text())


def _addrs(gpus) -> list[str]:
    return [g.address for g in gpus]


def test_the_description_and_discovery_agree_on_every_pair(dgx2, described):
    # the independent reading is the same host the planner sees
    assert _addrs(dgx2.gpus) == described.gpus
    for a, b in itertools.combinations(dgx2.gpus, 2):
        assert distance(a, b) == described.level(a.address, b.address), (a.address, b.address)


@pytest.mark.slow
def test_every_count_is_as_close_as_the_host_allows_with_the_fewest_moves(dgx2, described):
    rng = random.Random(24)
    for n in range(1, 17):
        for trial in range(4):
            held = set(rng.sample(described.gpus, rng.randint(0, 6))) if trial else set()
            got = _addrs(choose(dgx2.gpus, n, held))
            assert len(got) == n
            want = described.best(described.gpus, n, held) if n <= 8 or n >= 14 else None
            if want is not None:  # (9..13 of 16: too many sets to try, and all are SYS anyway)
                assert (described.worst(got), n - len(held & set(got))) == want, (n, sorted(held), got)


def test_the_issue_repro_keeps_a_pix_pair_in_place(dgx2):
    # a container holds a PIX pair under the second socket's switch; count: 2 keeps it (the
    # lowest PIX pair, 34/36, is no closer)
    assert _addrs(choose(dgx2.gpus, 2)) == ["0000:34:00.0", "0000:36:00.0"]
    assert _addrs(choose(dgx2.gpus, 2, {"0000:bc:00.0", "0000:be:00.0"})) == ["0000:bc:00.0", "0000:be:00.0"]
    # held across two switches: PIX is closer than keeping both, so one stays and one moves
    got = _addrs(choose(dgx2.gpus, 2, {"0000:b7:00.0", "0000:bc:00.0"}))
    assert got == ["0000:b7:00.0", "0000:b9:00.0"]


def test_ties_go_to_the_lowest_addresses_and_the_explanation_says_why(dgx2):
    three = choose(dgx2.gpus, 3, {"0000:b7:00.0", "0000:b9:00.0"})
    assert _addrs(three) == ["0000:b7:00.0", "0000:b9:00.0", "0000:bc:00.0"]
    assert explain(three, {"0000:b7:00.0", "0000:b9:00.0"}) == (
        "0000:b7:00.0, b9, bc: PXB under switch 0000:af:00.0; keeps 2 of 3 in place"
    )
    assert explain(choose(dgx2.gpus, 2), ()) == (
        "0000:34:00.0, 36: PIX under switch 0000:32:00.0; keeps 0 of 2 in place"
    )


@pytest.mark.slow
def test_key_groups_are_the_pairwise_connected_components(dgx2, materialized):
    large = discover(materialized("large"))
    for facts in (dgx2, large):
        gpus = facts.gpus
        for level in ("PIX", "PXB", "PHB", "NODE"):
            limit = ORDER.index(level)
            comp = {g.address: {g.address} for g in gpus}
            for a, b in itertools.combinations(gpus, 2):
                if ORDER.index(distance(a, b)) <= limit and comp[a.address] is not comp[b.address]:
                    merged = comp[a.address] | comp[b.address]
                    for x in merged:
                        comp[x] = merged
            want = sorted({tuple(sorted(s)) for s in comp.values()})
            assert sorted(tuple(_addrs(c)) for c in clusters(gpus, level)) == want, level


SPEC = """
apiVersion: gputopo/v1
kind: GpuTopology
nodes:
  - name: dgx2
    containers:
      - vmid: 101
        gpus: {count: CT}
    vms:
      mappings:
        - name: v100-vm
          gpus: {count: VM}
policy:
  locality: LOCALITY
"""


def _spec(ct: int, vm: int, locality: str = "prefer"):
    text = SPEC.replace("CT", str(ct)).replace("VM", str(vm)).replace("LOCALITY", locality)
    return parse_spec(text, "dgx2.yaml")


def _state(dgx2, container: list[str], mapping: list[str]) -> CurrentState:
    minors = [dgx2.gpu(a).minor for a in container]
    cfg = {f"dev{i}": format_dev(f"/dev/nvidia{m}", None, "0666") for i, m in enumerate(minors)}
    maps = [map_entry(dgx2.gpu(a), "dgx2") for a in mapping]
    return CurrentState(
        containers={101: ContainerState(config=cfg, status="running")},
        mappings={"v100-vm": MappingState(map=maps)} if maps else {},
    )


def _owned(p, owner: Owner) -> list[str]:
    return [t.address for t in p.target if t.owner == owner]


def test_the_repro_plans_no_changes_and_a_vm_mapping_keeps_its_gpus_too(dgx2):
    # the container holds the PIX pair bc/be, the mapping e0/e2 (their drivers as a past apply
    # left them); count: 2 each keeps both where they are
    facts = dgx2.model_copy(deep=True)
    for a in ("0000:e0:00.0", "0000:e2:00.0"):
        g = facts.gpu(a)
        g.driver, g.driver_override, g.minor = "vfio-pci", "vfio-pci", None
    current = _state(facts, ["0000:bc:00.0", "0000:be:00.0"], ["0000:e0:00.0", "0000:e2:00.0"])
    p = plan(facts, _spec(2, 2), current)
    assert _owned(p, Owner.container(101)) == ["0000:bc:00.0", "0000:be:00.0"]
    assert _owned(p, Owner.vm("v100-vm")) == ["0000:e0:00.0", "0000:e2:00.0"]
    assert not [a for a in p.actions if a.kind == "rebind"]
    assert (
        "container:101: 0000:bc:00.0, be: PIX under switch 0000:ba:00.0; keeps 2 of 2 in place" in p.placement
    )


@pytest.mark.parametrize("ct,vm", [(2, 2), (4, 4), (3, 5), (8, 8), (1, 6)])
def test_a_second_plan_after_any_apply_is_no_changes(dgx2, ct, vm):
    start = _state(dgx2, [g.address for g in dgx2.gpus], [])
    spec = _spec(ct, vm)
    first = plan(dgx2, spec, start)
    facts, current = expected_after(first, dgx2, start)
    second = plan(facts, spec, current)
    assert second.is_empty, second.to_text()
    # and the first kept the container's GPUs where the set was as close
    kept = set(_owned(first, Owner.container(101)))
    assert len(kept) == ct


def test_two_owners_do_not_straddle_a_switch_when_there_is_room(dgx2):
    p = plan(dgx2, _spec(2, 2), _state(dgx2, [], []))
    ct, vm = _owned(p, Owner.container(101)), _owned(p, Owner.vm("v100-vm"))
    assert ct == ["0000:34:00.0", "0000:36:00.0"] and vm == ["0000:39:00.0", "0000:3b:00.0"]


def test_strict_locality_refuses_a_sys_choice_and_prefer_warns(dgx2):
    # nine GPUs cannot sit on one socket (eight per NUMA node)
    with pytest.raises(PlanRefused) as e:
        plan(dgx2, _spec(9, 1, "strict"), _state(dgx2, [], []))
    assert any(r.code == "locality" and "container:101" in r.reason for r in e.value.refusals)
    p = plan(dgx2, _spec(9, 1), _state(dgx2, [], []))
    assert any("span NUMA nodes" in w for w in p.warnings)
    # eight fit one socket: strict accepts them
    assert plan(dgx2, _spec(8, 8, "strict"), _state(dgx2, [], [])).placement


SWITCHES = """\
# One socket, two PCIe switches of two GPUs each; a ConnectX-7 under the second switch.
description: "two switches, one with a NIC"
hostname: pve-sw
cmdline: "BOOT_IMAGE=/boot/vmlinuz-6.8.12-9-pve root=/dev/mapper/pve-root ro quiet amd_iommu=on"
iommu: true
nvidia_driver: "570.133.20"
modules: [nvidia, vfio, vfio_pci, vfio_iommu_type1, kvm_amd, mlx5_core]
numa: [{id: 0, cpus: "0-15"}]
root_numa: {"0000:00": 0}
devices:
  - {addr: "00:00.0", preset: amd-root-complex}
  - {addr: "00:01.1", preset: pcie-root-port}
  - {addr: "01:00.0", parent: "00:01.1", preset: pex-switch-upstream}
  - {addr: "02:00.0", parent: "01:00.0", preset: pex-switch-downstream}
  - {addr: "02:01.0", parent: "01:00.0", preset: pex-switch-downstream}
  - {addr: "03:00.0", parent: "02:00.0", preset: h100-sxm}
  - {addr: "04:00.0", parent: "02:01.0", preset: h100-sxm}
  - {addr: "00:02.1", preset: pcie-root-port}
  - {addr: "10:00.0", parent: "00:02.1", preset: pex-switch-upstream}
  - {addr: "11:00.0", parent: "10:00.0", preset: pex-switch-downstream}
  - {addr: "11:01.0", parent: "10:00.0", preset: pex-switch-downstream}
  - {addr: "11:02.0", parent: "10:00.0", preset: pex-switch-downstream}
  - {addr: "12:00.0", parent: "11:00.0", preset: h100-sxm}
  - {addr: "13:00.0", parent: "11:01.0", preset: h100-sxm}
  - {addr: "14:00.0", parent: "11:02.0", preset: mellanox-cx7}
"""


@pytest.fixture(scope="module")
def switches(tmp_path_factory):
    from gputopo.sim.hostroot import materialize

    d = tmp_path_factory.mktemp("switches")
    (d / "sw.yaml").write_text(SWITCHES)
    return discover(materialize(d / "sw.yaml", d / "root"))


def test_the_network_adapter_is_part_of_a_gpus_locality(switches):
    assert [n.address for n in switches.nics] == ["0000:14:00.0"]
    # both switches hold two: the one with the adapter wins over the lower addresses
    pair = choose(switches.gpus, 2, (), switches.nics)
    assert _addrs(pair) == ["0000:12:00.0", "0000:13:00.0"]
    assert explain(pair, (), switches.nics).endswith("; network adapter 0000:14:00.0 at PIX")
    assert _addrs(choose(switches.gpus, 2)) == ["0000:03:00.0", "0000:04:00.0"]  # no adapter known
    # a pair in place is not moved for it: moves count first
    held = {"0000:03:00.0", "0000:04:00.0"}
    assert _addrs(choose(switches.gpus, 2, held, switches.nics)) == sorted(held)
    # a container doing RDMA through the adapter keeps the GPU beside it
    assert _addrs(choose(switches.gpus, 3, {"0000:13:00.0"}, switches.nics)) == [
        "0000:03:00.0",
        "0000:12:00.0",
        "0000:13:00.0",
    ]


def test_a_container_far_from_every_adapter_is_warned_about(materialized):
    # the seed host's adapters all sit on NUMA node 1: count 4 takes that node's GPUs
    seed = discover(materialized("seed"))
    text = SPEC.replace("dgx2", "pve1").replace("VM", "4").replace("LOCALITY", "prefer")
    p = plan(seed, parse_spec(text.replace("CT", "4"), "s.yaml"), CurrentState())
    assert _owned(p, Owner.container(101)) == ["0000:81:00.0", "0000:91:00.0", "0000:e1:00.0", "0000:f1:00.0"]
    assert not any("no network adapter" in w for w in p.warnings)
    # NUMA node 0 asked for by name: warned
    text = text.replace("{count: CT}", "{numa: [0]}").replace("{count: 4}", "{numa: [1]}")
    p = plan(seed, parse_spec(text, "s.yaml"), CurrentState())
    assert _owned(p, Owner.container(101)) == ["0000:01:00.0", "0000:11:00.0", "0000:61:00.0", "0000:71:00.0"]
    assert any(w.startswith("container:101: no network adapter closer than SYS") for w in p.warnings)
    assert not any("vm:v100-vm: no network adapter" in w for w in p.warnings)  # a VM's is its own


def test_split_auto(switches, dgx2, materialized):
    from gputopo.plan.placement import split
    from gputopo.plan.starter import split_selectors

    # one socket: no NUMA split, but one switch each side (PIX on both)
    ct, vm = split(switches.gpus)
    assert (_addrs(ct), _addrs(vm)) == (["0000:03:00.0", "0000:04:00.0"], ["0000:12:00.0", "0000:13:00.0"])
    # equally good the other way round: the sides the owners have now stay
    ct, vm = split(switches.gpus, {"0000:12:00.0", "0000:13:00.0"}, {"0000:03:00.0"})
    assert (_addrs(ct), _addrs(vm)) == (["0000:12:00.0", "0000:13:00.0"], ["0000:03:00.0", "0000:04:00.0"])
    # the seed host and the DGX-2: the NUMA split
    seed = discover(materialized("seed"))
    for facts in (seed, dgx2):
        assert split_selectors(facts, "auto") == split_selectors(facts, "numa")


CONSUMERS = """
apiVersion: gputopo/v1
kind: GpuTopology
nodes:
  - name: dgx2
    containers:
      - vmid: 101
        gpus: {numa: [0]}
    vms:
      mappings:
        - name: v100-vm
          gpus: {numa: [1]}
      consumers:
        - {vmid: 201, mapping: v100-vm, gpus: 2}
        - {vmid: 202, mapping: v100-vm, gpus: 4}
        - {vmid: 203, mapping: v100-vm, gpus: 2}
"""

VM = {"bios": "ovmf", "cores": "8", "cpu": "host", "machine": "q35", "memory": "65536", "sockets": "1"}


def test_consumers_of_one_mapping_each_get_a_close_set_pinned_to_its_node(dgx2, described):
    from gputopo.formats.pcicfg import parse_map_entry
    from gputopo.model.state import GuestState

    current = _state(dgx2, [g.address for g in dgx2.gpus[:8]], [])
    current.guests = {
        v: GuestState(status="stopped", config={**VM, "digest": str(v) * 10}) for v in (201, 202, 203)
    }
    p = plan(dgx2, parse_spec(CONSUMERS, "c.yaml"), current)
    lines = [parse_map_entry(e).paths[0] for e in p.mappings["v100-vm"].map]
    # Proxmox gives each hostpci line the first free map line: start the VMs in the spec's order
    free, got = list(lines), {}
    for vmid, n in ((201, 2), (202, 4), (203, 2)):
        got[vmid], free = free[:n], free[n:]
    # each as close as the host allows when the larger one is placed first: 202 under one root
    # port (PXB), 201 and 203 under one switch each (PIX); nobody shares a switch
    assert {v: ORDER[described.worst(a)] for v, a in got.items()} == {201: "PIX", 202: "PXB", 203: "PIX"}
    switches = {v: {described.chain[a][-2] for a in addrs} for v, addrs in got.items()}
    assert not (switches[201] & switches[202]) and not (switches[201] & switches[203])
    assert not (switches[202] & switches[203])
    # each pinned to the NUMA node of its own set
    assert {t.vmid: t.numa_nodes for t in p.vms} == {201: [1], 202: [1], 203: [1]}
    assert any(n.startswith("its GPUs: 0000:e0:00.0, e2: PIX") for n in p.vms[0].notes)
    # applied, the next plan keeps the order: no changes
    facts, after = expected_after(p, dgx2, current)
    assert plan(facts, parse_spec(CONSUMERS, "c.yaml"), after).is_empty


def test_two_consumers_of_a_mapping_across_sockets_are_pinned_to_one_node_each(dgx2):
    from gputopo.model.state import GuestState

    spec = CONSUMERS.replace("gpus: {numa: [1]}", "gpus: {numa: [0, 1]}").replace(
        "    containers:\n      - vmid: 101\n        gpus: {numa: [0]}\n", ""
    )
    spec = spec.replace(
        "gpus: 2}\n        - {vmid: 202, mapping: v100-vm, gpus: 4}",
        "gpus: 8}\n        - {vmid: 202, mapping: v100-vm, gpus: 8}",
    )
    spec = spec.replace("        - {vmid: 203, mapping: v100-vm, gpus: 2}\n", "")
    current = _state(dgx2, [], [])
    current.guests = {
        v: GuestState(status="stopped", config={**VM, "digest": str(v) * 10}) for v in (201, 202)
    }
    p = plan(dgx2, parse_spec(spec, "c.yaml"), current)
    assert {t.vmid: t.numa_nodes for t in p.vms} == {201: [0], 202: [1]}
    assert {t.vmid: t.config["affinity"] for t in p.vms} == {201: "0-1", 202: "24-25"}
    assert not any("span NUMA nodes" in w for w in p.warnings)


def test_split_auto_plans_no_changes_after_its_apply(switches):
    from gputopo.plan.starter import spec_from_split

    start = CurrentState(containers={101: ContainerState(config={"arch": "amd64"}, status="running")})
    spec = spec_from_split(switches, "auto", node="pve-sw", current=start)
    first = plan(switches, spec, start)
    assert _owned(first, Owner.container(101)) == ["0000:03:00.0", "0000:04:00.0"]
    facts, after = expected_after(first, switches, start)
    again = spec_from_split(facts, "auto", node="pve-sw", current=after)
    assert plan(facts, again, after).is_empty


def test_a_mapping_keeps_its_gpus_however_the_spec_spells_its_name(dgx2):
    facts = dgx2.model_copy(deep=True)
    for a in ("0000:e0:00.0", "0000:e2:00.0"):
        g = facts.gpu(a)
        g.driver, g.driver_override, g.minor = "vfio-pci", "vfio-pci", None
    current = _state(facts, ["0000:bc:00.0", "0000:be:00.0"], ["0000:e0:00.0", "0000:e2:00.0"])
    current.mappings = {"V100-VM": current.mappings["v100-vm"]}
    p = plan(facts, _spec(2, 2), current)
    assert _owned(p, Owner.vm("v100-vm")) == ["0000:e0:00.0", "0000:e2:00.0"]
    assert "vm:v100-vm: 0000:e0:00.0, e2: PIX under switch 0000:de:00.0; keeps 2 of 2 in place" in p.placement
