"""Network adapters and NVMe drives in the topology: the matrix's NIC rows and columns against
``nvidia-smi topo -m`` of the real ESC8000A capture and against the host descriptions' parent
links, and ``topo --all``'s tree placing them under their root ports and switches."""

from __future__ import annotations

import json

import pytest
import yaml

from gputopo.facts.discover import discover
from gputopo.model.facts import Facts
from gputopo.resources import fixtures_dir
from gputopo.sim.hostroot.models import HostSpec
from gputopo.topo.tree import build_report
from helpers.cli import run_cli
from helpers.pcilevels import Described, capture_matrix

CAPTURE = fixtures_dir() / "real" / "stelline-asus-esc8000a-e12.md"

# Two sockets; on node 0 a PCIe switch under a switch (PXB between their GPUs), a ConnectX-7
# under the outer switch and an NVMe drive beside the GPUs; on node 1 a GPU alone and an X710.
NESTED = {
    "hostname": "pve-nest",
    "cmdline": "BOOT_IMAGE=/boot/vmlinuz root=/dev/mapper/pve-root ro quiet amd_iommu=on",
    "nvidia_driver": "570.133.20",
    "modules": ["nvidia", "vfio", "vfio_pci", "vfio_iommu_type1", "kvm_amd", "mlx5_core", "i40e", "nvme"],
    "numa": [{"id": 0, "cpus": "0-7"}, {"id": 1, "cpus": "8-15"}],
    "root_numa": {"0000:00": 0, "0000:40": 0, "0000:80": 1},
    "devices": [
        {"addr": "00:01.1", "preset": "pcie-root-port"},
        {"addr": "01:00.0", "parent": "00:01.1", "preset": "pex-switch-upstream"},
        {"addr": "02:00.0", "parent": "01:00.0", "preset": "pex-switch-downstream"},
        {"addr": "02:01.0", "parent": "01:00.0", "preset": "pex-switch-downstream"},
        {"addr": "02:02.0", "parent": "01:00.0", "preset": "pex-switch-downstream"},
        {"addr": "03:00.0", "parent": "02:00.0", "preset": "pex-switch-upstream"},
        {"addr": "04:00.0", "parent": "03:00.0", "preset": "pex-switch-downstream"},
        {"addr": "04:01.0", "parent": "03:00.0", "preset": "pex-switch-downstream"},
        {"addr": "05:00.0", "parent": "04:00.0", "preset": "h100-sxm"},
        {"addr": "06:00.0", "parent": "04:01.0", "preset": "h100-sxm"},
        {"addr": "07:00.0", "parent": "02:01.0", "preset": "h100-sxm"},
        {
            "addr": "08:00.0",
            "parent": "02:02.0",
            "preset": "mellanox-cx7",
            "class_devices": ["infiniband/mlx5_0", "net/ens8f0np0"],
        },
        {"addr": "40:01.1", "preset": "pcie-root-port"},
        {"addr": "41:00.0", "parent": "40:01.1", "preset": "nvme", "class_devices": ["nvme/nvme0"]},
        {"addr": "80:01.1", "preset": "pcie-root-port"},
        {"addr": "81:00.0", "parent": "80:01.1", "preset": "h100-sxm"},
        {"addr": "80:03.1", "preset": "pcie-root-port"},
        {"addr": "82:00.0", "parent": "80:03.1", "preset": "intel-x710", "class_devices": ["net/ens3f0"]},
    ],
}


@pytest.fixture(scope="module")
def esc(materialized):
    return discover(materialized("esc8000a"))


@pytest.fixture(scope="module")
def nested(tmp_path_factory):
    from gputopo.sim.hostroot import materialize

    return discover(materialize(HostSpec(**NESTED), tmp_path_factory.mktemp("nested") / "root"))


def _names(report) -> dict[str, str]:
    """The matrix's row names -> addresses."""
    m = report.matrix
    return {**{f"GPU{g.index}": g.address for g in m.gpus}, **{f"NIC{n.index}": n.address for n in m.nics}}


def _cells(report) -> dict[str, dict[str, str]]:
    m = report.matrix
    gpus, nics = [f"GPU{g.index}" for g in m.gpus], [f"NIC{n.index}" for n in m.nics]
    out = {a: dict(zip(gpus, row)) for a, row in zip(gpus, m.levels)}
    for k, row in zip(nics, m.nic_levels):
        out[k] = dict(zip(gpus + nics, row))
        for g, level in zip(gpus, row):
            out[g][k] = level
    return out


def test_esc8000a_matrix_is_what_nvidia_smi_printed_on_it(esc):
    report = build_report(esc, {})
    want, legend, affinity = capture_matrix(CAPTURE)
    assert legend == {"NIC0": "mlx5_0", "NIC1": "mlx5_1", "NIC2": "mlx5_2", "NIC3": "mlx5_3"}
    # the RDMA devices come first and keep nvidia-smi's numbers; the X710 (no RDMA) after them
    assert {f"NIC{n.index}": n.name for n in report.matrix.nics if n.rdma} == legend
    assert [n.name for n in report.matrix.nics if not n.rdma] == ["0000:82:00.0", "0000:82:00.1"]
    got = _cells(report)
    assert {row: {col: got[row][col] for col in cols} for row, cols in want.items()} == want
    for g in report.matrix.gpus:
        assert (g.cpus, str(g.numa_node)) == affinity[f"GPU{g.index}"]


def test_the_matrix_text_reads_back_as_nvidia_smis(esc, materialized, tmp_path, capsys):
    code, out, err = run_cli(
        ["topo", "--matrix", "--root", str(materialized("esc8000a")), "--pve-root", str(tmp_path)], capsys
    )
    assert code == 0, err
    got, legend, affinity = capture_matrix(out)
    want, want_legend, want_affinity = capture_matrix(CAPTURE)
    assert {row: {col: got[row][col] for col in cols} for row, cols in want.items()} == want
    assert {k: legend[k] for k in want_legend} == want_legend
    assert affinity == want_affinity
    # the legend is nvidia-smi's own words, line for line (NV# aside: sysfs shows no NVLinks)
    capture = CAPTURE.read_text().splitlines()
    ours = out.splitlines()
    legend_lines = ours[ours.index("Legend:") + 2 : ours.index("Legend:") + 8]
    assert len(legend_lines) == 6 and all(ln in capture for ln in legend_lines)
    nic_legend = ours[ours.index("NIC Legend:") + 2 : ours.index("NIC Legend:") + 6]
    assert all(ln in capture for ln in nic_legend) and nic_legend[0] == "  NIC0: mlx5_0"
    # the adapters nvidia-smi leaves out are there too, by address, from the parent links
    described = Described((fixtures_dir() / "hosts" / "esc8000a.yaml").read_text())
    names = _names(build_report(esc, {}))
    for row in ("NIC4", "NIC5"):
        assert legend[row] == names[row]
        for col, level in got[row].items():
            assert level == described.level(names[row], names[col]), (row, col)
    assert "  NIC4  0000:82:00.0  NUMA 1  no RDMA device (nvidia-smi does not list it)" in out.splitlines()


@pytest.mark.parametrize("host", ["esc8000a", "seed", "dgx2", "NESTED"])
def test_every_cell_is_the_level_the_parent_links_give(host, materialized, nested):
    if host == "NESTED":
        facts, described = nested, Described(NESTED)
    else:
        facts = discover(materialized(host))
        described = Described((fixtures_dir() / "hosts" / f"{host}.yaml").read_text())
    report = build_report(facts, {})
    names = _names(report)
    cells = _cells(report)
    assert set(names.values()) == {g.address for g in facts.gpus} | {n.address for n in facts.nics}
    for row, cols in cells.items():
        for col, level in cols.items():
            assert level == described.level(names[row], names[col]), (host, row, col)


def test_a_nic_under_a_switch_is_pix_or_pxb_from_its_gpus(nested):
    # what the parent-link test holds for every cell, spelled out for the cells that matter
    cells, names = _cells(build_report(nested, {})), _names(build_report(nested, {}))
    assert [names[f"GPU{i}"] for i in range(4)] == [
        "0000:05:00.0",
        "0000:06:00.0",
        "0000:07:00.0",
        "0000:81:00.0",
    ]
    assert names["NIC0"] == "0000:08:00.0" and names["NIC1"] == "0000:82:00.0"
    # 07 and the adapter hang from the outer switch's ports: one switch crossed
    assert cells["GPU2"]["NIC0"] == "PIX"
    # 05 and 06 sit under the inner switch: the outer and the inner one crossed
    assert cells["GPU0"]["NIC0"] == cells["GPU1"]["NIC0"] == "PXB"
    assert cells["GPU3"]["NIC1"] == "PHB" and cells["GPU3"]["NIC0"] == "SYS"


def test_topo_all_places_adapters_and_drives_under_their_bridges(nested, esc):
    for facts, described in ((nested, Described(NESTED)), (esc, None)):
        plain = build_report(facts, {})
        assert not [n for r in plain.tree for n in r.walk() if n.kind in ("nic", "nvme")]
        report = build_report(facts, {}, every=True)
        parents = {}
        for root in report.tree:
            stack = [(root, [])]
            while stack:
                node, above = stack.pop()
                if node.kind in ("nic", "nvme", "gpu"):
                    parents[node.id] = (
                        node,
                        [a.id for a in above if a.kind in ("root_port", "switch", "bridge")],
                    )
                stack += [(c, [*above, node]) for c in node.children]
        devices = {n.address for n in facts.nics} | {d.address for d in facts.nvme}
        assert devices <= set(parents) and devices
        if described is None:
            continue
        for addr, (_node, above) in parents.items():
            chain = described.chain(addr)
            # the tree shows root ports and switches (a downstream port folds into its switch)
            want = [b for b in chain if not described.devices[b]["preset"].endswith("downstream")]
            assert above == want, addr
    nic = next(
        n for r in build_report(nested, {}, every=True).tree for n in r.walk() if n.id == "0000:08:00.0"
    )
    assert (nic.kind, nic.label, nic.device.name, nic.device.nic) == (
        "nic",
        "NIC0 0000:08:00.0  mlx5_0",
        "mlx5_0",
        0,
    )
    drive = next(n for r in build_report(esc, {}, every=True).tree for n in r.walk() if n.kind == "nvme")
    assert (drive.id, drive.device.name, drive.detail) == (
        "0000:02:00.0",
        "nvme16",
        "NVMe SSD Controller SM981/PM981/PM983 · nvme",
    )


def test_discovery_names_adapters_and_drives_and_old_facts_still_read(nested, esc):
    nic, x710 = nested.nics
    assert (nic.rdma, nic.net, nic.name) == (["mlx5_0"], ["ens8f0np0"], "mlx5_0")
    assert (x710.rdma, x710.net, x710.name) == ([], ["ens3f0"], "ens3f0")
    assert [(d.address, d.nvme, d.host_bridge) for d in nested.nvme] == [
        ("0000:41:00.0", ["nvme0"], "0000:40")
    ]
    # facts written before drives and names were recorded: read as none of either
    data = json.loads(esc.to_json())
    del data["nvme"]
    for n in data["nics"]:
        del n["rdma"], n["net"], n["nvme"]
    old = Facts.model_validate_json(json.dumps(data))
    assert old.nvme == [] and [n.name for n in old.nics] == [n.address for n in esc.nics]


def test_an_unbound_adapter_has_no_names(tmp_path):
    from gputopo.sim.hostroot import materialize

    data = yaml.safe_load(yaml.safe_dump(NESTED))
    data["devices"][11]["unbound"] = True
    facts = discover(materialize(HostSpec(**data), tmp_path / "root"))
    assert (
        facts.nics[0].address == "0000:08:00.0"
        and facts.nics[0].rdma == []
        and facts.nics[0].name == "0000:08:00.0"
    )


def test_a_bad_class_device_is_a_one_line_fixture_error(tmp_path):
    from gputopo.errors import FixtureError
    from gputopo.sim.hostroot import materialize

    data = yaml.safe_load(yaml.safe_dump(NESTED))
    data["devices"][11]["class_devices"] = ["sound/card0"]
    with pytest.raises(FixtureError) as e:
        materialize(HostSpec(**data), tmp_path / "root")
    assert "0000:08:00.0: class device 'sound/card0' is not <class>/<name> of infiniband, net, nvme" in str(
        e.value
    )


def test_adapters_with_an_rdma_device_are_numbered_first():
    from gputopo.model.facts import Peripheral
    from gputopo.topo.distance import matrix

    def nic(addr: str, **names) -> Peripheral:
        return Peripheral(
            address=addr,
            vendor="0x15b3",
            device="0x1021",
            **{"class": "0x020000"},
            host_bridge="0000:00",
            **names,
        )

    # an onboard port below the RDMA adapters' addresses: nvidia-smi does not list it, so it
    # comes last and NIC0.. stay nvidia-smi's
    m = matrix(
        [],
        [
            nic("0000:01:00.0", net=["eno1"]),
            nic("0000:21:00.1", rdma=["mlx5_1"]),
            nic("0000:21:00.0", rdma=["mlx5_0"]),
        ],
    )
    assert [(n.index, n.name, n.rdma) for n in m.nics] == [
        (0, "mlx5_0", True),
        (1, "mlx5_1", True),
        (2, "eno1", False),
    ]
