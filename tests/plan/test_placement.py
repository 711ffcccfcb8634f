"""Choosing a container's GPUs close together (one switch, then host bridge, then NUMA node)."""

from __future__ import annotations

import pytest

from gputopo.facts.discover import discover
from gputopo.model.facts import Bridge, Gpu
from gputopo.model.owner import Owner
from gputopo.model.state import CurrentState
from gputopo.plan.placement import choose, clusters, farthest, spread_warning
from gputopo.plan.planner import plan
from gputopo.plan.spec import parse_spec
from helpers.hosts import NESTED

LARGE_SPEC = """
apiVersion: gputopo/v1
kind: GpuTopology
nodes:
  - name: pve-large
    containers:
      - vmid: 101
        gpus: {count: COUNT}
    vms:
      mappings:
        - name: h100-vm
          gpus: {count: 4}
"""


def _addrs(gpus) -> list[str]:
    return [g.address for g in gpus]


@pytest.fixture(scope="module")
def large(materialized):
    return discover(materialized("large"))


@pytest.fixture(scope="module")
def nested(tmp_path_factory):
    from gputopo.sim.hostroot import materialize

    d = tmp_path_factory.mktemp("nested")
    (d / "nested.yaml").write_text(NESTED)
    return discover(materialize(d / "nested.yaml", d / "root"))


def test_one_switch_first_smallest_that_fits(large):
    pfs = [g for g in large.gpus if g.address.endswith(".0")]
    # the first switch holds four GPUs; four fit there exactly
    assert _addrs(choose(pfs, 4)) == ["0000:03:00.0", "0000:04:00.0", "0000:05:00.0", "0000:06:00.0"]
    # with one of them gone, four no longer fit under that switch: the next whole switch
    assert _addrs(choose(pfs[1:], 4)) == ["0000:0c:00.0", "0000:0d:00.0", "0000:0e:00.0", "0000:0f:00.0"]
    # two: the smallest switch that holds two (the one with three left), not a full one
    assert _addrs(choose(pfs[1:], 2)) == ["0000:04:00.0", "0000:05:00.0"]


def test_more_than_a_switch_fills_whole_switches_under_one_host_bridge(large):
    pfs = [g for g in large.gpus if g.address.endswith(".0")]
    got = choose(pfs[1:], 6)
    # a full switch of four, then two from the switch with three: all under host bridge 0000:00
    assert _addrs(got) == [
        "0000:04:00.0",
        "0000:05:00.0",
        "0000:0c:00.0",
        "0000:0d:00.0",
        "0000:0e:00.0",
        "0000:0f:00.0",
    ]
    assert farthest(got) == "PHB"
    # sixteen sit under one host bridge; seventeen must cross to another NUMA node
    assert farthest(choose(pfs, 16)) == "PHB"
    assert farthest(choose(pfs, 17)) == "SYS"


def test_nested_switches_prefer_pix_then_pxb(nested):
    gpus = nested.gpus
    assert _addrs(choose(gpus, 2)) == ["0000:05:00.0", "0000:06:00.0"]
    four = choose(gpus, 4)
    assert _addrs(four) == ["0000:05:00.0", "0000:06:00.0", "0000:09:00.0", "0000:0a:00.0"]
    assert farthest(four) == "PXB"
    # without 05, two still come from one switch (09, 0a), not 06 and a cousin
    assert _addrs(choose([g for g in gpus if not g.address.startswith("0000:05")], 2)) == [
        "0000:09:00.0",
        "0000:0a:00.0",
    ]
    assert farthest(choose(gpus, 5)) == "PHB"


def test_flat_host_keeps_lowest_addresses(materialized):
    # the seed host: every GPU alone behind its root port; NUMA node 0 first, lowest first
    facts = discover(materialized("seed"))
    assert _addrs(choose(facts.gpus, 3)) == ["0000:01:00.0", "0000:11:00.0", "0000:61:00.0"]
    assert _addrs(choose(facts.gpus[1:], 4)) == [
        "0000:81:00.0",
        "0000:91:00.0",
        "0000:e1:00.0",
        "0000:f1:00.0",
    ]
    assert _addrs(choose(facts.gpus, 99)) == _addrs(facts.gpus)
    assert choose(facts.gpus, 0) == []


def test_clusters_are_connected_components(large):
    pfs = [g for g in large.gpus if g.address.endswith(".0")]
    assert [len(c) for c in clusters(pfs, "PIX")] == [4] * 16
    assert [len(c) for c in clusters(pfs, "PHB")] == [16] * 4
    assert [len(c) for c in clusters(pfs, "NODE")] == [16] * 4  # one host bridge per node here


def _gpu(addr: str, numa: int | None) -> Gpu:
    return Gpu(
        address=addr,
        vendor="0x10de",
        device="0x2bb5",
        **{"class": "0x030200"},
        numa_node=numa,
        host_bridge=addr[:7],
        upstream=[Bridge(address=addr[:7] + ":01.1", kind="root_port")],
    )


def test_spread_warning():
    a, b, c = _gpu("0000:01:00.0", 0), _gpu("0000:81:00.0", 1), _gpu("0000:91:00.0", None)
    assert spread_warning(101, [a, b, c]) == (
        "container 101: GPUs span NUMA nodes [0, 1] (cross-socket traffic: "
        "0000:01:00.0 and 0000:81:00.0 are SYS apart)"
    )
    assert spread_warning(101, [a, c]) is None  # unknown is not another node
    assert spread_warning(101, [a]) is None


def test_planner_count_uses_placement(large):
    spec = parse_spec(LARGE_SPEC.replace("COUNT", "4"), "large.yaml")
    p = plan(large, spec, CurrentState())
    owners = {t.address: t.owner for t in p.target}
    ct = [a for a, o in owners.items() if o == Owner.container(101)]
    vms = [a for a, o in owners.items() if o == Owner.vm("h100-vm")]
    # the first switch holds the PF with its four VFs (8 GPUs to discovery): the container gets
    # the next whole switch of four, and the VM the one after it, each PIX within
    assert ct == ["0000:0c:00.0", "0000:0d:00.0", "0000:0e:00.0", "0000:0f:00.0"]
    assert vms == ["0000:15:00.0", "0000:16:00.0", "0000:17:00.0", "0000:18:00.0"]
    assert farthest([large.gpu(a) for a in ct]) == "PIX"
    assert not any("span NUMA" in w for w in p.warnings)
