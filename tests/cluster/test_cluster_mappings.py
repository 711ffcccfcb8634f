"""A PCI mapping is one file for the whole cluster: each node writes only its own lines, with
digests, so that nodes writing at once never lose each other's lines and an edit by hand between
plan and apply is refused, not overwritten. Against the simulated cluster's API (real proxmoxer)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gputopo.actions import DeleteMapping, SetMapping, Timeouts
from gputopo.actions.base import StepContext
from gputopo.errors import MappingConflict
from gputopo.formats.pcicfg import parse_pci_cfg
from helpers.clusterharness import cluster, spec_text, template  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow  # a simulated cluster per test (seconds each); the full run only

LINE = "id=10de:2bb5,iommugroup={g},node={n},path=0000:{b}:00.0,subsystem-id=10de:204e"


def line(node: str, bus: str = "81", group: int = 25) -> str:
    return LINE.format(n=node, b=bus, g=group)


def ctx_of(ports) -> StepContext:
    return StepContext(
        ports=ports,
        root="/",
        timeouts=Timeouts(),
        binder=None,
        read_minors=lambda: {},
        device_present=lambda a: True,
    )


def lines(cluster, mid: str) -> list[str]:
    for m in parse_pci_cfg((cluster.dir / "pve/mapping/pci.cfg").read_text()):
        if m.id == mid:
            return m.maps
    return []


class RacingProxmox:
    """The real client, except that right after the step reads the mappings, another node writes
    its own lines: the step's write then carries a digest that is no longer the file's."""

    def __init__(self, inner, on_first_read):
        self.inner = inner
        self.on_first_read = on_first_read
        self.reads = 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def mappings(self, check_node=None):
        out = self.inner.mappings(check_node)
        self.reads += 1
        if self.reads == 1:
            self.on_first_read()
        return out


def test_a_write_that_loses_the_race_is_merged_and_sent_again(cluster):
    ports = cluster.ports()
    px = ports.proxmox
    px.mapping_create("pro6000-vm", [line("pve3", "e1", 35)], "VM GPUs")
    racing = RacingProxmox(
        px,
        lambda: px.mapping_update(
            "pro6000-vm",
            [line("pve3", "e1", 35), line("pve2")],
            "VM GPUs",
            next(m for m in px.mappings() if m["id"] == "pro6000-vm")["digest"],
        ),
    )
    ports.proxmox = racing
    # pve1 planned when only pve3 had lines: its map carries that old view
    step = SetMapping(
        id="pro6000-vm",
        map=[line("pve3", "e1", 35), line("pve1"), line("pve1", "91", 29)],
        description="VM GPUs",
        create=False,
        node="pve1",
        base=[],
    )
    step.do(ctx_of(ports))
    assert racing.reads >= 2  # it read again after Proxmox refused the stale digest
    assert sorted(lines(cluster, "pro6000-vm")) == sorted(
        [line("pve3", "e1", 35), line("pve2"), line("pve1"), line("pve1", "91", 29)]
    )


def test_an_edit_by_hand_of_the_nodes_lines_is_refused_not_overwritten(cluster):
    ports = cluster.ports()
    ports.proxmox.mapping_create("pro6000-vm", [line("pve1")], "VM GPUs")
    step = SetMapping(
        id="pro6000-vm",
        map=[line("pve1", "91", 29)],
        description="VM GPUs",
        create=False,
        node="pve1",
        base=[line("pve1")],
    )
    # someone edits pve1's entry in the GUI between the plan and the write
    digest = next(m for m in ports.proxmox.mappings() if m["id"] == "pro6000-vm")["digest"]
    ports.proxmox.mapping_update("pro6000-vm", [line("pve1", "e1", 35)], "VM GPUs", digest)
    before = (cluster.dir / "pve/mapping/pci.cfg").read_text()
    with pytest.raises(MappingConflict) as e:
        step.do(ctx_of(ports))
    assert str(e.value) == (
        "mapping pro6000-vm: node pve1's entries changed since the plan (now 1 line(s), "
        "planned from 1); not overwritten: plan again"
    )
    assert (cluster.dir / "pve/mapping/pci.cfg").read_text() == before


def test_undo_and_delete_touch_the_nodes_own_lines_only(cluster):
    ports = cluster.ports()
    ctx = ctx_of(ports)
    step = SetMapping(
        id="pro6000-vm", map=[line("pve1")], description="VM GPUs", create=True, node="pve1", base=[]
    )
    before = step.before(ctx)
    step.do(ctx)
    # pve2 writes its lines meanwhile
    pve2 = SetMapping(
        id="pro6000-vm",
        map=[line("pve1"), line("pve2")],
        description="VM GPUs",
        create=False,
        node="pve2",
        base=[],
    )
    pve2.do(ctx)
    assert step.undo(before, ctx) == "restored node pve1's lines of mapping pro6000-vm"
    assert lines(cluster, "pro6000-vm") == [line("pve2")]
    DeleteMapping(id="pro6000-vm", node="pve2", base=[line("pve2")]).do(ctx)
    assert (
        lines(cluster, "pro6000-vm") == []
        and "pro6000-vm" not in (cluster.dir / "pve/mapping/pci.cfg").read_text()
    )


def test_two_nodes_applying_at_the_same_time_keep_each_others_lines(cluster, tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(spec_text(cluster, split=["pve1", "pve2"]))
    procs = {
        n: subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gputopo",
                "apply",
                "--sim",
                str(cluster.node_dir(n)),
                "--spec",
                str(spec),
                "--node",
                n,
                "--yes",
                "--no-verify",
                "--json",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in ("pve1", "pve2")
    }
    results = {n: p.communicate(timeout=600) for n, p in procs.items()}
    for n, p in procs.items():
        assert p.returncode == 0, results[n][1]
        assert '"status": "applied"' in results[n][0]
    got = lines(cluster, "pro6000-vm")
    assert sorted(e.split("node=")[1].split(",")[0] for e in got) == ["pve1"] * 4 + ["pve2"] * 4
    # and the container mapping the seed made (every node's GPUs) still has pve3's lines
    assert sum("node=pve3," in e for e in lines(cluster, "pro6000")) == 8
