"""The plan's one warning about network adapters: a split that gives a VM the GPUs under an
adapter's switch while the container keeps GPUs NODE or SYS from every adapter names the
adapter and both sets of GPUs; otherwise a container far from every adapter gets the SYS line;
never both."""

from __future__ import annotations

import pytest

from gputopo.facts.discover import discover
from gputopo.formats.devn import format_dev
from gputopo.model.state import ContainerState, CurrentState
from gputopo.plan.planner import plan
from gputopo.plan.spec import parse_spec
from gputopo.sim.hostroot.models import HostSpec
from helpers.pcilevels import Described

# One socket, two host bridges: a switch with two GPUs under each; the ConnectX-7 (mlx5_0)
# sits under the second switch. A second socket holds one GPU alone.
HOST = {
    "hostname": "pve-rdma",
    "cmdline": "BOOT_IMAGE=/boot/vmlinuz root=/dev/mapper/pve-root ro quiet amd_iommu=on",
    "nvidia_driver": "570.133.20",
    "modules": ["nvidia", "vfio", "vfio_pci", "vfio_iommu_type1", "kvm_amd", "mlx5_core"],
    "numa": [{"id": 0, "cpus": "0-7"}, {"id": 1, "cpus": "8-15"}],
    "root_numa": {"0000:00": 0, "0000:20": 0, "0000:80": 1},
    "devices": [
        {"addr": "00:01.1", "preset": "pcie-root-port"},
        {"addr": "01:00.0", "parent": "00:01.1", "preset": "pex-switch-upstream"},
        {"addr": "02:00.0", "parent": "01:00.0", "preset": "pex-switch-downstream"},
        {"addr": "02:01.0", "parent": "01:00.0", "preset": "pex-switch-downstream"},
        {"addr": "03:00.0", "parent": "02:00.0", "preset": "h100-sxm", "minor": 0},
        {"addr": "04:00.0", "parent": "02:01.0", "preset": "h100-sxm", "minor": 1},
        {"addr": "20:01.1", "preset": "pcie-root-port"},
        {"addr": "21:00.0", "parent": "20:01.1", "preset": "pex-switch-upstream"},
        {"addr": "22:00.0", "parent": "21:00.0", "preset": "pex-switch-downstream"},
        {"addr": "22:01.0", "parent": "21:00.0", "preset": "pex-switch-downstream"},
        {"addr": "22:02.0", "parent": "21:00.0", "preset": "pex-switch-downstream"},
        {"addr": "23:00.0", "parent": "22:00.0", "preset": "h100-sxm", "minor": 2},
        {"addr": "24:00.0", "parent": "22:01.0", "preset": "h100-sxm", "minor": 3},
        {
            "addr": "25:00.0",
            "parent": "22:02.0",
            "preset": "mellanox-cx7",
            "class_devices": ["infiniband/mlx5_0"],
        },
        {"addr": "80:01.1", "preset": "pcie-root-port"},
        {"addr": "81:00.0", "parent": "80:01.1", "preset": "h100-sxm", "minor": 4},
    ],
}

SPEC = """
apiVersion: gputopo/v1
kind: GpuTopology
nodes:
  - name: pve-rdma
    containers:
      - vmid: 101
        gpus: {addresses: [CT]}
    vms:
      mappings:
        - name: h100-vm
          gpus: {addresses: [VM]}
"""


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    from gputopo.sim.hostroot import materialize

    return discover(materialize(HostSpec(**HOST), tmp_path_factory.mktemp("rdma") / "root"))


def _plan(host, ct: list[str], vm: list[str], held: list[str] = ()):
    text = SPEC.replace("CT", ", ".join(f'"{a}"' for a in ct)).replace("VM", ", ".join(f'"{a}"' for a in vm))
    minors = [host.gpu("0000:" + a).minor for a in held]
    cfg = {f"dev{i}": format_dev(f"/dev/nvidia{m}", None, "0666") for i, m in enumerate(minors)}
    return plan(host, parse_spec(text, "s.yaml"), CurrentState(containers={101: ContainerState(config=cfg)}))


def _nic_lines(p) -> list[str]:
    return [w for w in p.warnings if "network adapter" in w]


def test_the_host_is_what_the_warning_assumes(host):
    d = Described(HOST)
    nic = "0000:25:00.0"
    # the adapter's switch partners, and the other switch's GPUs NODE from it (another host bridge)
    assert [g for g in d.devices if d.devices[g]["preset"] == "h100-sxm" and d.level(g, nic) == "PIX"] == [
        "0000:23:00.0",
        "0000:24:00.0",
    ]
    assert d.level("0000:03:00.0", nic) == d.level("0000:04:00.0", nic) == "NODE"
    assert d.level("0000:81:00.0", nic) == "SYS"
    assert [n.name for n in host.nics] == ["mlx5_0"]


def test_partners_to_a_vm_and_the_container_left_node_away_is_one_line(host):
    p = _plan(
        host,
        ["03:00.0", "04:00.0"],
        ["23:00.0", "24:00.0"],
        held=["03:00.0", "04:00.0", "23:00.0", "24:00.0"],
    )
    assert _nic_lines(p) == [
        "container:101: network adapter mlx5_0 (0000:25:00.0) shares its switch with 0000:23:00.0, 24, "
        "which go to vm:h100-vm; the container's GPUs 0000:03:00.0, 04 have no adapter closer than NODE "
        "(NODE to this one): GPUDirect RDMA needs a GPU and an adapter under one switch"
    ]


def test_one_partner_to_the_vm_is_enough_and_a_far_container_gets_one_line_not_two(host):
    # the container's second GPU is on the other socket: SYS from the adapter too, yet the one
    # line is the partner's, not also "closer than SYS"
    p = _plan(host, ["03:00.0", "81:00.0"], ["24:00.0"])
    (line,) = _nic_lines(p)
    assert line.startswith(
        "container:101: network adapter mlx5_0 (0000:25:00.0) shares its switch with 0000:24:00.0,"
    )
    assert "the container's GPUs 0000:03:00.0, 81 have no adapter closer than NODE (NODE to this one)" in line


def test_no_warning_while_the_container_keeps_a_gpu_beside_the_adapter(host):
    p = _plan(host, ["03:00.0", "23:00.0"], ["24:00.0"])
    assert _nic_lines(p) == []
    # the placement line names the adapter as the matrix's legend does
    p = _plan(host, ["23:00.0", "24:00.0"], ["03:00.0"])
    assert p.placement[0].endswith("; network adapter mlx5_0 (0000:25:00.0) at PIX")
    # the partners left with the host (no VM takes them): nothing moved away, NODE is no SYS
    assert _nic_lines(_plan(host, ["03:00.0", "04:00.0"], ["81:00.0"])) == []


def test_without_partners_in_a_vm_the_sys_line_remains(host):
    assert _nic_lines(_plan(host, ["81:00.0"], ["03:00.0"])) == [
        "container:101: no network adapter closer than SYS to its GPUs (nearest mlx5_0 (0000:25:00.0)): "
        "RDMA between them and the network would cross sockets"
    ]
