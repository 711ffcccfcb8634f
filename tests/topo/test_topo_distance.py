"""The PCIe distance matrix, checked against what nvidia-smi reported on a real machine."""

from __future__ import annotations

import re

import pytest

from gputopo.facts.discover import discover
from gputopo.model.facts import Bridge, Gpu
from gputopo.topo.distance import distance, matrix, nearest_switch, worst
from helpers import REPO
from helpers.hosts import NESTED

REAL = REPO / "fixtures" / "real" / "stelline-asus-esc8000a-e12.md"


def parse_topo_m(text: str) -> tuple[list[str], dict[str, list[str]], dict[str, tuple[str, str]]]:
    """``nvidia-smi topo -m`` -> (column names, {row: levels}, {GPU row: (CPU affinity, NUMA affinity)})."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.strip().startswith("GPU0") and "CPU Affinity" in ln)
    cols = [c for c in lines[start].split() if re.fullmatch(r"(GPU|NIC)\d+", c)]
    rows: dict[str, list[str]] = {}
    affinity: dict[str, tuple[str, str]] = {}
    for ln in lines[start + 1 :]:
        parts = ln.split()
        if not parts or not re.fullmatch(r"(GPU|NIC)\d+", parts[0]):
            break
        rows[parts[0]] = parts[1 : 1 + len(cols)]
        if len(parts) > 1 + len(cols):
            affinity[parts[0]] = (parts[1 + len(cols)], parts[2 + len(cols)])
    return cols, rows, affinity


def test_esc8000a_matches_nvidia_smi_topo_m(materialized):
    """The four GPUs and the four ConnectX-7 ports of the real ASUS ESC8000A-E12: every cell of
    the matrix nvidia-smi printed there, and each GPU's CPU and NUMA affinity."""
    cols, rows, affinity = parse_topo_m(REAL.read_text())
    assert cols == ["GPU0", "GPU1", "GPU2", "GPU3", "NIC0", "NIC1", "NIC2", "NIC3"]
    # NVML numbers GPUs in PCI order; mlx5_0..3 are the ConnectX ports in PCI order
    facts = discover(materialized("esc8000a"), gpu_match=[("0x10de", "0x03"), ("0x15b3", "0x02")])
    gpus = [g for g in facts.gpus if g.vendor == "0x10de"]
    nics = [g for g in facts.gpus if g.vendor == "0x15b3"]
    assert [g.address for g in nics] == ["0000:21:00.0", "0000:21:00.1", "0000:81:00.0", "0000:81:00.1"]
    devices = dict(zip(cols, gpus + nics))
    got = {r: [distance(devices[r], devices[c]) for c in cols] for r in cols}
    assert got == rows
    m = matrix(gpus)
    assert [(g.cpus, str(g.numa_node)) for g in m.gpus] == [affinity[f"GPU{i}"] for i in range(4)]


def test_nested_switches(tmp_path, fresh_host):
    spec = tmp_path / "nested.yaml"
    spec.write_text(NESTED)
    facts = discover(fresh_host(spec))
    g = {x.address[5:7]: x for x in facts.gpus}
    assert distance(g["05"], g["06"]) == "PIX"  # one switch
    assert distance(g["09"], g["0a"]) == "PIX"
    assert distance(g["05"], g["09"]) == "PXB"  # through the top switch: three switches
    assert distance(g["05"], g["0b"]) == "PHB"  # another root port of the host bridge
    assert distance(g["05"], g["81"]) == "SYS"
    assert nearest_switch(g["05"]) == "0000:03:00.0"
    assert nearest_switch(g["0b"]) is None
    m = matrix(facts.gpus)
    assert all(m.levels[i][i] == "X" for i in range(len(m.levels)))
    assert all(m.levels[i][j] == m.levels[j][i] for i in range(5) for j in range(5))


def test_large_host_levels(materialized):
    facts = discover(materialized("large"))
    g = {x.address: x for x in facts.gpus}
    assert distance(g["0000:04:00.0"], g["0000:05:00.0"]) == "PIX"
    assert distance(g["0000:04:00.0"], g["0000:03:00.4"]) == "PIX"  # a VF beside the PF's switch port
    assert distance(g["0000:04:00.0"], g["0000:0c:00.0"]) == "PHB"  # another root port, same host bridge
    assert distance(g["0000:04:00.0"], g["0001:04:00.0"]) == "SYS"  # NUMA 0 vs NUMA 4
    m = matrix(facts.gpus)
    assert len(m.levels) == len(facts.gpus) and {len(r) for r in m.levels} == {len(facts.gpus)}


def test_same_node_other_host_bridge_is_node(materialized):
    facts = discover(materialized("seed"))
    assert distance(facts.gpu("0000:01:00.0"), facts.gpu("0000:11:00.0")) == "NODE"
    assert distance(facts.gpu("0000:01:00.0"), facts.gpu("0000:81:00.0")) == "SYS"


def test_unknown_numa_is_sys_across_host_bridges_and_noted(materialized):
    facts = discover(materialized("numa-unknown"))
    g = {x.address: x for x in facts.gpus}
    assert distance(g["0000:81:00.0"], g["0000:82:00.0"]) == "PHB"  # same host bridge: no node needed
    assert distance(g["0000:01:00.0"], g["0000:81:00.0"]) == "SYS"
    m = matrix(facts.gpus)
    assert any("NUMA node unknown for 0000:81:00.0, 0000:82:00.0" in n for n in m.notes)
    assert [x.numa_node for x in m.gpus] == [0, 0, None, None]


def _gpu(addr: str, host: str | None, chain: list[tuple[str, str]], numa: int | None = 0) -> Gpu:
    return Gpu(
        address=addr,
        vendor="0x10de",
        device="0x2330",
        **{"class": "0x030200"},
        numa_node=numa,
        host_bridge=host,
        upstream=[Bridge(address=a, kind=k) for a, k in chain],
    )


def test_functions_behind_one_root_port_are_pix():
    # nvidia-smi shows PIX between the two ports of one ConnectX behind a root port
    rp = [("0000:20:03.1", "root_port")]
    assert distance(_gpu("0000:21:00.0", "0000:20", rp), _gpu("0000:21:00.1", "0000:20", rp)) == "PIX"


def test_unknown_place_is_node_or_sys():
    a, b = _gpu("0000:01:00.0", None, []), _gpu("0000:02:00.0", "0000:00", [("0000:00:01.1", "root_port")])
    assert distance(a, b) == "NODE"
    assert distance(a, _gpu("0000:81:00.0", "0000:80", [], numa=1)) == "SYS"
    assert "PCI path unknown for 0000:01:00.0" in matrix([a, b]).notes[0]


@pytest.mark.parametrize(
    "levels, want", [(["PIX", "SYS", "NODE"], "SYS"), (["PIX", "PXB"], "PXB"), ([], "X")]
)
def test_worst(levels, want):
    assert worst(levels) == want
