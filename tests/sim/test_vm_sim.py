"""The simulated node's VMs against qemu-server's behaviour, through the real clients: the config
API (pending on a running VM, digests, permissions), what a start refuses or silently does
(q35, taskset, reservations, OVMF's MMIO window), and the QEMU guest agent endpoints."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import pytest

from gputopo.adapters.credentials import ApiConfig
from gputopo.adapters.proxmox import ProxmoxClient
from gputopo.errors import ProxmoxError, TaskFailed
from gputopo.formats.qemuconf import parse_qemu_conf
from gputopo.plan.spec import parse_spec
from gputopo.sim import state
from gputopo.sim.pveapi import PveshSim
from gputopo.sim.qemu import hang_agent
from gputopo.usecases.apply import apply
from helpers import applysim
from helpers.applysim import template  # noqa: F401 (fixtures)

pytestmark = (
    pytest.mark.slow
)  # VMs started and stopped through the simulated API (seconds each); the full run only

T = applysim.FAST_TIMEOUTS
LINES = "".join(f"hostpci{i}: mapping=pro6000-vm,pcie=1\n" for i in range(4))


@pytest.fixture
def split(template):
    """The seed host after the NUMA split: pro6000-vm lists the four GPUs of node 1 (vfio-pci)."""
    base = Path(tempfile.mkdtemp(prefix="gputopo-vmsim-", dir=applysim.fast_tmp()))
    h = applysim.copy_host(template, base / "sim")
    ports = h.ports()
    assert (
        apply(parse_spec(applysim.seed_spec_text(h)), ports, root=str(h.paths.root), timeouts=T).status
        == "applied"
    )
    state.write_state(h.paths.run, "latencies", {"agent.timeout": 0.05})
    yield h, ports.proxmox
    h.stop()
    applysim.cleanup(base)


def write_vm(h, vmid: int, text: str) -> None:
    (h.paths.pve / f"nodes/pve1/qemu-server/{vmid}.conf").write_text(text)


def wait_agent(px, vmid: int, timeout: float = 10.0) -> None:
    """Ping the guest agent until it answers (a guest boots before its agent runs)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return px.agent_ping(vmid)
        except ProxmoxError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def start_fails(px, vmid: int) -> str:
    with pytest.raises(TaskFailed) as e:
        px.guest_action("qemu", vmid, "start", 30)
    return e.value.exitstatus


VM = "agent: 1\nbios: ovmf\ncores: 4\nmachine: q35\nmemory: 8192\n"


# --- the config API ------------------------------------------------------------------------------


def test_a_running_vm_keeps_passthrough_changes_pending_until_its_next_start(split):
    h, px = split
    write_vm(h, 210, VM + "name: a\n")
    px.guest_action("qemu", 210, "start", 30)
    px.qemu_update(
        210, {"hostpci0": "mapping=pro6000-vm,pcie=1", "name": "b"}, ["cores"], px.qemu_config(210)["digest"]
    )
    conf = parse_qemu_conf((h.paths.pve / "nodes/pve1/qemu-server/210.conf").read_text())
    assert conf.options["name"] == "b"  # a fast-plug key
    assert conf.pending == {"hostpci0": "mapping=pro6000-vm,pcie=1", "delete": "cores"}
    assert px.qemu_config(210)["hostpci0"] == "mapping=pro6000-vm,pcie=1" and "cores" not in px.qemu_config(
        210
    )
    px.guest_action("qemu", 210, "stop", 30)
    px.guest_action("qemu", 210, "start", 30)
    conf = parse_qemu_conf((h.paths.pve / "nodes/pve1/qemu-server/210.conf").read_text())
    assert (
        conf.pending == {}
        and conf.options["hostpci0"] == "mapping=pro6000-vm,pcie=1"
        and "cores" not in conf.options
    )


def test_config_api_errors_as_qemu_server_words_them(split):
    h, px = split
    write_vm(h, 210, VM)
    with pytest.raises(ProxmoxError) as e:
        px.qemu_update(210, {"numa": "1"}, [], "0" * 40)
    assert (e.value.status, e.value.pve_message) == (500, "checksum mismatch (file change by other user?)")
    with pytest.raises(ProxmoxError) as e:
        px.qemu_update(210, {"hostpci0": "0000:C1:00.0"}, [], px.qemu_config(210)["digest"])
    assert e.value.status == 400 and "hostpci0" in e.value.errors
    with pytest.raises(ProxmoxError) as e:
        px.qemu_update(210, {"hostpcix": "1"}, [], px.qemu_config(210)["digest"])
    assert e.value.status == 400 and "not defined in schema" in e.value.errors["hostpcix"]
    # deleting what is not set is a warning, nothing more
    px.qemu_update(210, {}, ["affinity"], px.qemu_config(210)["digest"])
    # an empty affinity passes the API (it fails at start)
    px.qemu_update(210, {"affinity": ""}, [], px.qemu_config(210)["digest"])


def test_only_root_may_pass_a_host_device(split):
    h, _ = split
    write_vm(h, 210, VM)
    cfg = ApiConfig(
        backend="https",
        host="127.0.0.1",
        port=h.api.port,
        node="pve1",
        user=h.api.operator_user,
        verify_ssl=True,
        ca_bundle=str(h.api.ca_cert_path),
        timeout=30.0,
    )
    ops = ProxmoxClient.from_config(cfg, env={"GPUTOPO_PVE_PASSWORD": h.api.operator_password})
    with pytest.raises(ProxmoxError) as e:
        ops.qemu_update(210, {"hostpci0": "0000:22:00.0"}, [], ops.qemu_config(210)["digest"])
    assert e.value.pve_message == "only root can set 'hostpci0' config for non-mapped devices"
    ops.qemu_update(
        210, {"hostpci0": "mapping=pro6000-vm"}, [], ops.qemu_config(210)["digest"]
    )  # Mapping.Use


# --- what a start does -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            "hostpci0: mapping=pro6000-vm,pcie=1\n",
            # a die without a newline: Perl adds where (qemu-server 9.2.6 PCI.pm line 510)
            "q35 machine model is not enabled at /usr/share/perl5/PVE/QemuServer/PCI.pm line 510.",
        ),
        ("hostpci0: mapping=nope,pcie=1\n", "PCI device mapping not found for 'nope'"),
        ("hugepages: 1024\n", "numa needs to be enabled to use hugepages"),
        ("affinity: 300-301\n", "taskset: failed to set pid 4452's affinity: Invalid argument"),
    ],
)
def test_a_start_fails_as_qemu_server_fails_it(split, extra, message):
    h, px = split
    write_vm(h, 210, VM.replace("machine: q35\n", "") + extra)
    assert start_fails(px, 210) == message
    assert px.guest_status("qemu", 210) == "stopped"
    assert state.read_state(h.paths.run, "pci-reserved", {}) == {}


def test_devices_held_by_a_running_vm(split):
    h, px = split
    write_vm(h, 201, VM + LINES)
    px.guest_action("qemu", 201, "start", 30)
    write_vm(h, 202, VM + "hostpci0: mapping=pro6000-vm,pcie=1\n")
    assert start_fails(px, 202) == "could not find a free device for 'hostpci0'"
    write_vm(h, 203, VM + "hostpci0: 0000:91:00.0,pcie=1\n")
    assert start_fails(px, 203) == "PCI device '0000:91:00.0' already in use by VMID '201'"
    px.guest_action("qemu", 201, "stop", 30)
    px.guest_action("qemu", 203, "start", 30)


@pytest.mark.parametrize(
    "args, usable",
    [
        ("", 0),  # OVMF's default 32 GiB: no 128 GiB BAR fits
        ("args: -fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=262144\n", 1),  # 256 GiB: one GPU
        ("args: -fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=1048576\n", 4),
        ("args: -fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=1048576 -smbios 'type=0\n", 0),  # none of the args
    ],
)
def test_gpus_get_their_bars_only_inside_the_window(split, args, usable):
    h, px = split
    write_vm(h, 201, VM + args + LINES)
    px.guest_action("qemu", 201, "start", 30)  # the VM starts either way
    wait_agent(px, 201)
    pid = px.agent_exec(201, ["nvidia-smi", "-L"])
    st = px.agent_exec_status(201, pid)
    assert st["exitcode"] == (0 if usable else 6)
    assert len([ln for ln in st.get("out-data", "").splitlines() if ln.startswith("GPU ")]) == usable


def test_the_vm_process_holds_its_groups_and_runs_on_its_affinity(split):
    h, px = split
    write_vm(h, 201, VM + "affinity: 64-127,192-255\n" + LINES)
    px.guest_action("qemu", 201, "start", 30)
    root = h.paths.root
    pid = int((root / "run/qemu-server/201.pid").read_text())
    assert pid == 4242 + 201
    assert "Cpus_allowed_list:\t64-127,192-255\n" in (root / f"proc/{pid}/status").read_text()
    fds = {p.readlink().as_posix() for p in (root / f"proc/{pid}/fd").iterdir()}
    assert {"/dev/vfio/25", "/dev/vfio/29", "/dev/vfio/35", "/dev/vfio/38"} <= fds
    px.guest_action("qemu", 201, "stop", 30)
    assert not (root / f"proc/{pid}").exists() and not (root / "run/qemu-server/201.pid").exists()


# --- the guest agent ---------------------------------------------------------------------------------------


def test_agent_endpoints_answer_as_qemu_server(split):
    h, px = split
    write_vm(h, 201, VM + "args: -fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=1048576\n" + LINES)
    write_vm(h, 202, VM.replace("agent: 1\n", ""))
    with pytest.raises(ProxmoxError) as e:
        px.agent_ping(201)
    assert (e.value.status, e.value.pve_message) == (500, "VM 201 is not running")
    px.guest_action("qemu", 201, "start", 30)
    px.guest_action("qemu", 202, "start", 30)
    with pytest.raises(ProxmoxError) as e:
        px.agent_ping(202)
    assert e.value.pve_message == "No QEMU guest agent configured"
    wait_agent(px, 201)
    pid = px.agent_exec(201, ["nvidia-smi", "--query-gpu=index,pci.bus_id,name", "--format=csv,noheader"])
    st = px.agent_exec_status(201, pid)
    assert st["exited"] == 1 and st["exitcode"] == 0
    assert (
        st["out-data"].splitlines()[0] == "0, 00000000:01:00.0, NVIDIA RTX PRO 6000 Blackwell Server Edition"
    )
    with pytest.raises(ProxmoxError) as e:
        px.agent_exec(201, ["lspci"])
    assert e.value.pve_message.startswith("Agent error: Guest agent command failed")
    hang_agent(h.paths.run, 201)
    with pytest.raises(ProxmoxError) as e:
        px.agent_ping(201)
    assert e.value.pve_message == "QEMU guest agent is not running"


def test_config_and_agent_through_pvesh(split):
    h, _ = split
    write_vm(h, 201, VM + LINES)
    local = ProxmoxClient.from_config(
        ApiConfig(backend="local", node="pve1", timeout=30), runner=PveshSim(h.api)
    )
    args = "-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=1048576"
    local.qemu_update(201, {"args": args, "affinity": "64-127"}, ["agent"], local.qemu_config(201)["digest"])
    assert local.qemu_config(201)["args"] == args and "agent" not in local.qemu_config(201)
    local.qemu_update(201, {"agent": "1"}, [], local.qemu_config(201)["digest"])
    local.guest_action("qemu", 201, "start", 30)
    wait_agent(local, 201)
    pid = local.agent_exec(201, ["nvidia-smi", "-L"])
    st = local.agent_exec_status(201, pid)
    assert st["exitcode"] == 0 and len(st["out-data"].splitlines()) == 4
