"""Hosts and specs the tests share: hosts built directly from ``gputopo.model.facts`` (no sysfs
tree), the seed split's facts, state and spec, and host descriptions for ``fresh_host``."""

from __future__ import annotations

import pytest

from gputopo.facts.discover import discover
from gputopo.formats.devn import format_dev
from gputopo.model.facts import Facts, Gpu, GroupMember, HostFacts, MemberRole, Modules, NumaNode
from gputopo.model.state import ContainerState, CurrentState, GuestState, MappingState, ServiceState
from gputopo.plan.mappings import map_entry
from gputopo.plan.spec import Spec, parse_spec
from gputopo.sim.hostroot import list_hosts

SEED_NUMA = {"01": 0, "11": 0, "61": 0, "71": 0, "81": 1, "91": 1, "e1": 1, "f1": 1}
SEED_MINOR = {"01": 0, "11": 1, "61": 3, "71": 2, "81": 4, "91": 5, "e1": 7, "f1": 6}
SEED_CMD = "/usr/bin/python3 -m sglang.launch_server --model-path /models/qwen --tp 8 --port 30000"


def gpu(
    bus: str, numa: int | None, minor: int | None, group: int, *, driver="nvidia", members=(), **kw
) -> Gpu:
    return Gpu(
        address=f"0000:{bus}:00.0",
        vendor="0x10de",
        device=kw.pop("device", "0x2bb5"),
        **{"class": kw.pop("class_", "0x030200")},
        subsystem_vendor="0x10de",
        subsystem_device=kw.pop("subsystem_device", "0x204e"),
        driver=driver,
        iommu_group=group,
        numa_node=numa,
        numa_source=None if numa is None else "sysfs",
        minor=minor if driver == "nvidia" else None,
        iommu_members=list(members),
        **kw,
    )


def audio(bus: str, driver="snd_hda_intel") -> GroupMember:
    return GroupMember(
        address=f"0000:{bus}:00.1",
        role=MemberRole.FUNCTION,
        vendor="0x10de",
        device="0x22ba",
        **{"class": "0x040300"},
        driver=driver,
    )


def host(gpus: list[Gpu], **kw) -> Facts:
    h = dict(
        hostname="pve1",
        iommu_enabled=True,
        iommu_group_count=100,
        iommu_mode="translated",
        modules=Modules(vfio=True, vfio_pci=True, vfio_iommu_type1=True, nvidia=True),
        sev_snp=True,
        numa_nodes=[NumaNode(id=0), NumaNode(id=1)],
    )
    h.update(kw)
    return Facts(gpus=sorted(gpus, key=lambda g: g.address), host=HostFacts(**h))


def seed_facts() -> Facts:
    gpus = [gpu(b, SEED_NUMA[b], SEED_MINOR[b], 10 + i) for i, b in enumerate(SEED_NUMA)]
    vga = Gpu(
        address="0000:c2:00.0",
        vendor="0x1a03",
        device="0x2000",
        **{"class": "0x030000"},
        driver="ast",
        iommu_group=90,
        numa_node=1,
        boot_vga=True,
    )
    return host(gpus + [vga])


def seed_current(tp: int = 8, dropin: str | None = None) -> CurrentState:
    """Container 101 running with all eight GPUs, service at --tp 8, nothing for VMs yet."""
    cfg = {"arch": "amd64", "hostname": "infer", "digest": "d0"}
    paths = [f"/dev/nvidia{SEED_MINOR[b]}" for b in SEED_NUMA] + [
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
        "/dev/nvidia-modeset",
        "/dev/nvidia-caps/nvidia-cap1",
        "/dev/nvidia-caps/nvidia-cap2",
    ]
    for i, p in enumerate(paths):
        cfg[f"dev{i}"] = format_dev(p, None, "0666")
    return CurrentState(
        containers={
            101: ContainerState(
                config=cfg,
                status="running",
                service=ServiceState(
                    unit="sglang.service", active=True, exec_start=SEED_CMD, tp=tp, dropin=dropin
                ),
            )
        },
        mappings={
            "pro6000": MappingState(
                map=[map_entry(g, "pve1") for g in seed_facts().gpus if g.vendor == "0x10de"],
                description="all eight",
                digest="m0",
            )
        },
        guests={200: GuestState(status="running", hostpci=["mapping=pro6000-vm,pcie=1"])},
    )


SEED_SPEC = """
apiVersion: gputopo/v1
kind: GpuTopology
nodes:
  - name: pve1
    containers:
      - vmid: 101
        gpus: {numa: [0]}
        mapping: pro6000
        service: {unit: sglang.service, tp_flag: "--tp"}
    vms:
      mappings:
        - name: pro6000-vm
          gpus: {numa: [1]}
          description: RTX PRO 6000 on NUMA node 1
      guests: [200]
"""


def seed_spec(text: str = SEED_SPEC) -> Spec:
    return parse_spec(text, "seed.yaml")


def cli_spec(node: str, ct: str, vm: str | None) -> str:
    """A one-node spec of CT 101 with GPUs ``ct`` (and a VM mapping with ``vm``), as YAML text."""
    vms = f"    vms:\n      mappings:\n        - name: vm-gpus\n          gpus: {vm}\n" if vm else ""
    return (
        f"apiVersion: gputopo/v1\nkind: GpuTopology\nnodes:\n  - name: {node}\n    containers:\n"
        f"      - vmid: 101\n        gpus: {ct}\n{vms}"
    )


def converged_seed(root, tmp_path):
    """(spec file, pve root) that the seed host at ``root`` already matches: all eight GPUs in
    CT 101, whose config lists them by their real minors."""
    facts = discover(root)
    paths = [f"/dev/nvidia{g.minor}" for g in facts.gpus if g.minor is not None] + [
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
        "/dev/nvidia-modeset",
        "/dev/nvidia-caps/nvidia-cap1",
        "/dev/nvidia-caps/nvidia-cap2",
    ]
    conf = tmp_path / "pve/nodes/pve1/lxc/101.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text(
        "arch: amd64\n" + "".join(f"dev{i}: {format_dev(p, None, '0666')}\n" for i, p in enumerate(paths))
    )
    spec = tmp_path / "spec.yaml"
    spec.write_text(cli_spec("pve1", "{numa: [0, 1]}", None) + "policy: {allow_cross_numa: true}\n")
    return spec, tmp_path / "pve"


# the seed split without VM entries
SPLIT_SPEC = """apiVersion: gputopo/v1
kind: GpuTopology
nodes:
  - name: pve1
    containers:
      - vmid: 101
        gpus: {numa: [0]}
    vms:
      mappings:
        - name: pro6000-vm
          gpus: {numa: [1]}
"""

# cascaded PCIe switches: a host description (YAML) for ``fresh_host``
NESTED = """\
# Cascaded PCIe switches: a top switch feeding two smaller ones, two GPUs under each; one more
# GPU alone behind a second root port of the same host bridge.
description: "nested switches"
hostname: pve-nested
cmdline: "BOOT_IMAGE=/boot/vmlinuz-6.8.12-9-pve root=/dev/mapper/pve-root ro quiet amd_iommu=on"
iommu: true
nvidia_driver: "570.133.20"
modules: [nvidia, vfio, vfio_pci, vfio_iommu_type1, kvm_amd]
numa: [{id: 0, cpus: "0-15"}, {id: 1, cpus: "16-31"}]
root_numa: {"0000:00": 0, "0000:80": 1}
devices:
  - {addr: "00:00.0", preset: amd-root-complex}
  - {addr: "00:01.1", preset: pcie-root-port}
  - {addr: "01:00.0", parent: "00:01.1", preset: pex-switch-upstream}
  - {addr: "02:00.0", parent: "01:00.0", preset: pex-switch-downstream}
  - {addr: "02:01.0", parent: "01:00.0", preset: pex-switch-downstream}
  - {addr: "03:00.0", parent: "02:00.0", preset: pex-switch-upstream}
  - {addr: "04:00.0", parent: "03:00.0", preset: pex-switch-downstream}
  - {addr: "04:01.0", parent: "03:00.0", preset: pex-switch-downstream}
  - {addr: "05:00.0", parent: "04:00.0", preset: h100-sxm}
  - {addr: "06:00.0", parent: "04:01.0", preset: h100-sxm}
  - {addr: "07:00.0", parent: "02:01.0", preset: pex-switch-upstream}
  - {addr: "08:00.0", parent: "07:00.0", preset: pex-switch-downstream}
  - {addr: "08:01.0", parent: "07:00.0", preset: pex-switch-downstream}
  - {addr: "09:00.0", parent: "08:00.0", preset: h100-sxm}
  - {addr: "0a:00.0", parent: "08:01.0", preset: h100-sxm}
  - {addr: "00:03.1", preset: pcie-root-port}
  - {addr: "0b:00.0", parent: "00:03.1", preset: h100-sxm}
  - {addr: "80:00.0", preset: amd-root-complex}
  - {addr: "80:01.1", preset: pcie-root-port}
  - {addr: "81:00.0", parent: "80:01.1", preset: h100-sxm}
"""


def host_params(names: list[str] | None = None) -> list:
    """``names`` (default: every shipped host fixture) as test parameters, ``large`` (2,000+ PCI
    functions: seconds per test) marked slow."""
    return [pytest.param(n, marks=pytest.mark.slow) if n == "large" else n for n in names or list_hosts()]
