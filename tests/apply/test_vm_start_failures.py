"""A VM start that qemu-server refuses for its PCI devices, driven through gputopo on the
simulated host: a device another running VM holds, one device on two lines of the VM, and
``pcie=1`` without q35 (a Perl ``die`` without a newline, so it ends with where it died). gputopo
quotes the task's exit status whole, and a failed apply rolls back."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from gputopo.errors import ApplyFailed, TaskFailed
from gputopo.facts.discover import discover
from gputopo.plan.spec import parse_spec
from gputopo.plan.starter import init_spec
from gputopo.sim import state
from gputopo.usecases.apply import apply
from helpers import applysim
from helpers.applysim import template  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow  # VMs started on a simulated host (seconds)

T = applysim.FAST_TIMEOUTS
NVME = "0000:22:00.0"  # not a GPU: nothing of the split moves it
# qemu-server 9.2.6 src/PVE/QemuServer/PCI.pm parse_hostpci_devices, line 510
Q35 = "q35 machine model is not enabled at /usr/share/perl5/PVE/QemuServer/PCI.pm line 510."


@pytest.fixture
def host(template):
    base = Path(tempfile.mkdtemp(prefix="gputopo-vmstart-", dir=applysim.fast_tmp()))
    h = applysim.copy_host(template, base / "sim")
    yield h
    h.stop()
    applysim.cleanup(base)


def conf_path(h, vmid: int) -> Path:
    return h.paths.pve / f"nodes/pve1/qemu-server/{vmid}.conf"


def add_lines(h, vmid: int, lines: str) -> None:
    p = conf_path(h, vmid)
    p.write_text(p.read_text().replace("machine: q35\n", f"{lines}machine: q35\n"))


def started_spec(h):
    text = init_spec(discover(str(h.paths.root)), container_mapping="pro6000", vm=201)
    assert "          start: true\n" in text  # the consumer VM is started after the switch
    return parse_spec(text)


def failed_apply(h) -> ApplyFailed:
    before = applysim.fingerprint(h)
    ports = h.ports()
    with pytest.raises(ApplyFailed) as e:
        apply(started_spec(h), ports, root=str(h.paths.root), timeouts=T)
    assert e.value.rolled_back
    assert applysim.diff(before, applysim.fingerprint(h)) == []
    assert ports.proxmox.guest_status("qemu", 201) == "stopped"
    return e.value


def test_a_mapping_of_one_device_another_running_vm_holds_fails_the_start_with_its_vmid(host):
    # a mapping with one entry on the node is one alternative: choose_hostpci_devices takes it as it
    # is and reserve_pci_usage (PCI.pm line 832) names the VM that holds it; with several entries
    # the line would get another one or fail 'could not find a free device'
    px = host.ports().proxmox
    group = (host.paths.root / f"sys/bus/pci/devices/{NVME}/iommu_group").readlink().name
    entry = f"id=144d:a80a,iommugroup={group},node=pve1,path={NVME},subsystem-id=144d:a801"
    px.mapping_create("nvme", [entry], None)
    add_lines(host, 201, "hostpci1: mapping=nvme\n")
    conf_path(host, 202).write_text(f"hostpci0: {NVME}\nmemory: 4096\nname: other\n")
    px.guest_action("qemu", 202, "start", 30)
    e = failed_apply(host)
    assert f"VM 201 start: failed: PCI device '{NVME}' already in use by VMID '202' (task UPID:" in str(e)
    assert state.read_state(host.paths.run, "pci-reserved", {}) == {NVME: 202}


def test_one_device_on_two_lines_of_the_vm_fails_the_start(host):
    add_lines(host, 201, f"hostpci1: {NVME}\nhostpci7: {NVME}\n")
    # PCI.pm choose_hostpci_devices, line 556
    e = failed_apply(host)
    assert f"VM 201 start: failed: device '{NVME}' assigned more than once (task UPID:" in str(e)


def test_pcie_without_q35_is_quoted_with_perls_suffix(host):
    # gputopo's plan refuses this for a VM it configures; a VM it only starts hits it at start
    conf_path(host, 203).write_text(f"hostpci0: {NVME},pcie=1\nmemory: 4096\nname: i440fx\n")
    px = host.ports().proxmox
    with pytest.raises(TaskFailed) as e:
        px.guest_action("qemu", 203, "start", 30)
    assert e.value.exitstatus == Q35
    assert str(e.value).startswith(f"VM 203 start: failed: {Q35} (task UPID:")
    assert px.guest_status("qemu", 203) == "stopped"
