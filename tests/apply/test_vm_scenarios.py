"""The VM side of the split on the simulated host, as an operator runs it: VM 201 as the consumer
of its mapping (hostpciN lines, NUMA pinning, the MMIO window its 128 GiB BARs need), input
refused before anything changes, the reverse split with the VM running, mapping safety in
verify, and the guest check through the QEMU guest agent."""

from __future__ import annotations

import re
import tempfile
import time
from pathlib import Path

import pytest

from gputopo.cli import main
from gputopo.errors import PlanRefused, ProxmoxError
from gputopo.facts.discover import discover
from gputopo.formats.qemuconf import parse_qemu_conf
from gputopo.plan.diff import diff
from gputopo.plan.spec import parse_spec
from gputopo.plan.starter import init_spec
from gputopo.sim import state
from gputopo.sim.qemu import hang_agent
from gputopo.usecases.apply import apply
from gputopo.usecases.verify import verify
from helpers import applysim
from helpers.applysim import template  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow  # every test applies on a simulated host (seconds each); the full run only

T = applysim.FAST_TIMEOUTS
NUMA1 = ["0000:81:00.0", "0000:91:00.0", "0000:e1:00.0", "0000:f1:00.0"]
NODE1_CPUS = "64-127,192-255"


@pytest.fixture
def host(template):
    base = Path(tempfile.mkdtemp(prefix="gputopo-vm-", dir=applysim.fast_tmp()))
    h = applysim.copy_host(template, base / "sim")
    # an unrelated device on VM 201, a line gputopo must leave where it is
    conf = h.paths.pve / "nodes/pve1/qemu-server/201.conf"
    conf.write_text(conf.read_text().replace("machine: q35\n", "hostpci1: 0000:22:00.0\nmachine: q35\n"))
    state.write_state(h.paths.run, "latencies", {"agent.timeout": 0.05})
    yield h
    h.stop()
    applysim.cleanup(base)


def spec_text(h, **consumer) -> str:
    """The seed split with pro6000 as the container's mapping and VM 201 as the VM mapping's
    consumer (``consumer`` overrides its fields; ``None`` leaves one out)."""
    text = init_spec(discover(str(h.paths.root)), container_mapping="pro6000", vm=201)
    for key, value in consumer.items():
        if key == "vmid":
            text = text.replace("        - vmid: 201\n", f"        - vmid: {value}\n")
        elif re.search(rf"^          {key}: .*$", text, re.M):
            text = re.sub(
                rf"^          {key}: .*\n",
                "" if value is None else f"          {key}: {value}\n",
                text,
                flags=re.M,
            )
        else:
            text = text.replace(
                "          mapping: pro6000-vm\n",
                f"          mapping: pro6000-vm\n          {key}: {value}\n",
            )
    return text


def vm_conf(h, vmid: int = 201) -> dict[str, str]:
    return parse_qemu_conf((h.paths.pve / f"nodes/pve1/qemu-server/{vmid}.conf").read_text()).options


def vm_cpus(h, vmid: int = 201) -> str | None:
    pidfile = h.paths.root / f"run/qemu-server/{vmid}.pid"
    if not pidfile.exists():
        return None
    status = (h.paths.root / "proc" / pidfile.read_text().strip() / "status").read_text()
    return re.search(r"^Cpus_allowed_list:\t(.*)$", status, re.M).group(1)


def guest_smi(ports, vmid: int = 201) -> dict:
    deadline = time.monotonic() + 10
    while True:  # the guest boots before its agent answers
        try:
            ports.proxmox.agent_ping(vmid)
            break
        except ProxmoxError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    pid = ports.proxmox.agent_exec(
        vmid, ["nvidia-smi", "--query-gpu=pci.bus_id,name", "--format=csv,noheader"]
    )
    return ports.proxmox.agent_exec_status(vmid, pid)


def applied(h, text: str):
    spec = parse_spec(text)
    ports = h.ports()
    res = apply(spec, ports, root=str(h.paths.root), timeouts=T)
    assert res.status == "applied"
    return spec, ports


# --- VMs as consumers, placed on their GPUs' node, with the window their BARs need ----------------


def test_vm_201_runs_on_its_four_gpus_pinned_to_node_1_and_its_guest_sees_them(host):
    spec, ports = applied(host, spec_text(host, hugepages=1024))
    conf = vm_conf(host)
    assert {k: v for k, v in conf.items() if k.startswith("hostpci")} == {
        "hostpci0": "mapping=pro6000-vm,pcie=1",
        "hostpci1": "0000:22:00.0",
        **{f"hostpci{i}": "mapping=pro6000-vm,pcie=1" for i in (2, 3, 4)},
    }
    assert conf["affinity"] == NODE1_CPUS and conf["numa"] == "1" and conf["hugepages"] == "1024"
    assert conf["numa0"] == "cpus=0-31,hostnodes=1,memory=131072,policy=bind"
    assert conf["args"] == "-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=1048576"
    # running, its QEMU on node 1's CPUs, and every GPU got its 128 GiB BAR: the guest lists four
    assert ports.proxmox.guest_status("qemu", 201) == "running"
    assert vm_cpus(host) == NODE1_CPUS
    st = guest_smi(ports)
    assert st["exited"] == 1 and st["exitcode"] == 0
    assert len(st["out-data"].splitlines()) == 4 and "RTX PRO 6000 Blackwell" in st["out-data"]
    report = verify(spec, ports, root=str(host.paths.root))
    # the container kept running (its GPUs only left for vfio-pci): its devN removals wait for its
    # next restart, the one WARN
    assert report.ok and {c.name: c.status for c in report.checks if c.status != "PASS"} == {
        "container": "WARN"
    }, report.to_text()
    assert "until its next restart" in report.check("container").summary
    assert report.check("guest").summary.startswith("VM 201: the guest's nvidia-smi lists its 4 GPU(s)")
    assert apply(spec, ports, root=str(host.paths.root), timeouts=T).status == "no-changes"


def test_a_vm_whose_gpus_span_numa_nodes_is_a_warning_naming_them(host):
    text = spec_text(host).replace(
        "          numa: [0]\n", '          addresses: ["0000:01:00.0", "0000:11:00.0"]\n'
    )
    text = text.replace(
        "            numa: [1]\n", '            addresses: ["0000:71:00.0", "0000:81:00.0"]\n'
    )
    res = apply(parse_spec(text), host.ports(), root=str(host.paths.root), dry_run=True, timeouts=T)
    assert (
        "VM 201: its GPUs span NUMA nodes 0, 1 (0000:71:00.0 on 0, 0000:81:00.0 on 1): its memory and half its "
        "GPU traffic cross sockets"
    ) in res.plan.warnings
    (u,) = [a for a in res.plan.actions if a.kind == "update_vm_config"]
    assert u.set["affinity"] == "0-255" and "numa0" not in u.set


@pytest.mark.parametrize(
    "change, consumer, want",
    [
        ("", {"vmid": 299}, "refused: VM 299 does not exist on node pve1"),
        (
            "",
            {"mapping": "gpus-x"},
            "refused: VM 201: mapping gpus-x is not a mapping of this cluster (have: pro6000, pro6000-vm)",
        ),
        (
            "",
            {"gpus": 6, "when_gpus_leave": None},
            "refused: VM 201 asks 6 GPU(s) of mapping pro6000-vm, which has 4 on node pve1",
        ),
        (
            "machine: q35\n",
            {},
            "refused: VM 201 is i440fx (machine: default) but pcie=1 needs machine q35: set machine: q35 or pcie: false",
        ),
        (
            "bios: ovmf\n",
            {},
            "refused: VM 201 boots SeaBIOS, which cannot map 512.1 GiB of 64-bit BARs (4 GPU(s), largest BAR 128 GiB): set bios: ovmf (with an efidisk0)",
        ),
    ],
)
def test_bad_input_exits_2_with_one_line_and_changes_nothing(host, tmp_path, capsys, change, consumer, want):
    conf = host.paths.pve / "nodes/pve1/qemu-server/201.conf"
    conf.write_text(conf.read_text().replace(change, ""))
    spec = tmp_path / "spec.yaml"
    spec.write_text(spec_text(host, **consumer))
    before = applysim.fingerprint(host)
    with pytest.raises(SystemExit) as e:
        main(["apply", "--spec", str(spec), "--sim", str(host.dir), "--yes"])
    err = capsys.readouterr().err
    assert e.value.code == 2, err
    assert err.splitlines() == [f"gputopo: error: {want}"]
    assert applysim.diff(before, applysim.fingerprint(host)) == []


def test_without_the_window_the_guest_gets_no_usable_gpu_and_verify_says_why(host):
    spec, ports = applied(host, spec_text(host))
    px = ports.proxmox
    px.guest_action("qemu", 201, "stop", 30)
    px.qemu_update(201, {}, ["args"], px.qemu_config(201)["digest"])
    px.guest_action("qemu", 201, "start", 30)  # Proxmox starts it; OVMF gives no GPU its BARs
    assert guest_smi(ports)["exitcode"] == 6
    report = verify(spec, ports, root=str(host.paths.root))
    guest = report.check("guest")
    assert guest.status == "FAIL" and "lists 0 GPU(s), the plan gives it 4" in guest.summary
    assert "64-bit MMIO window" in guest.summary
    assert report.check("converged").status == "FAIL"  # the plan puts the window back


def test_an_unbalanced_quote_in_args_loses_the_window_and_is_refused_before_writing(host):
    spec, ports = applied(host, spec_text(host))
    px = ports.proxmox
    px.guest_action("qemu", 201, "stop", 30)
    broken = "-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=1048576 -smbios 'type=0,vendor=FOO"
    px.qemu_update(201, {"args": broken}, [], px.qemu_config(201)["digest"])  # the API takes it
    px.guest_action("qemu", 201, "start", 30)
    assert guest_smi(ports)["exitcode"] == 6  # QEMU got none of the arguments
    with pytest.raises(PlanRefused) as e:
        apply(spec, ports, root=str(host.paths.root), timeouts=T)
    assert [str(r) for r in e.value.refusals] == [
        f'VM 201: args: unbalanced quote in "{broken}": QEMU would get none of its arguments'
    ]


# --- the reverse split with VM 201 running -------------------------------------------------------------


def reverse(text: str) -> str:
    return (
        text.replace("numa: [0]", "numa: [0, 1]")
        .replace("            numa: [1]", "            count: 1")
        .replace("gpus:\n            count: 1", "gpus: rest")
    )


def test_reverse_split_with_the_vm_running_on_the_mapping_is_refused_at_once(host):
    # VM 201 only listed in guests, as before consumers: gputopo may stop it, not change it
    text = init_spec(discover(str(host.paths.root)), container_mapping="pro6000").replace(
        "guests: []", "guests: [201]"
    )
    _, ports = applied(host, text)
    ports.proxmox.guest_action("qemu", 201, "start", 30)
    before = applysim.fingerprint(host)
    t0 = time.monotonic()
    with pytest.raises(PlanRefused) as e:
        apply(parse_spec(reverse(text)), ports, root=str(host.paths.root), timeouts=T)
    assert time.monotonic() - t0 < 20
    (r,) = e.value.refusals
    assert str(r).startswith(
        "VM 201 is running with mapping pro6000-vm (hostpci0), whose GPU(s) go to a container"
    )
    assert applysim.diff(before, applysim.fingerprint(host)) == []


def test_reverse_split_removes_the_vms_lines_and_starts_it_without_container_gpus(host):
    spec, ports = applied(host, spec_text(host))
    assert ports.proxmox.guest_status("qemu", 201) == "running"
    back = parse_spec(reverse(spec_text(host)))
    from gputopo.facts.observe import observe
    from gputopo.plan.reads import spec_reads

    facts, now = observe(
        str(host.paths.root), spec_reads(back), proxmox=ports.proxmox, exec=ports.exec, files=ports.files
    )
    shown = diff(facts, back, now)
    text = shown.to_text()
    assert "delete PCI mapping pro6000-vm" in text and "== vm config" in text
    assert "-hostpci0: mapping=pro6000-vm,pcie=1" in text
    res = apply(back, ports, root=str(host.paths.root), timeouts=T)
    assert res.status == "applied"
    conf = vm_conf(host)
    assert {k: v for k, v in conf.items() if k.startswith("hostpci")} == {"hostpci1": "0000:22:00.0"}
    assert ports.proxmox.guest_status("qemu", 201) == "running"
    assert guest_smi(ports)["exitcode"] == 6  # no GPU of the container's
    assert "pro6000-vm" not in (host.paths.pve / "mapping/pci.cfg").read_text()
    report = verify(back, ports, root=str(host.paths.root))
    assert report.ok and {c.status for c in report.checks} == {"PASS"}, report.to_text()
    assert report.check("guest").summary.startswith("VM 201: the guest's nvidia-smi lists its 0 GPU(s)")


# --- mapping safety in verify ---------------------------------------------------------------------------


def test_verify_fails_when_a_vm_uses_a_mapping_listing_container_gpus_and_warns_otherwise(host):
    text = spec_text(host).replace("        mapping: pro6000\n", "")
    spec, ports = applied(host, text)
    vm = verify(spec, ports, root=str(host.paths.root), only=["vm"]).check("vm")
    assert vm.status == "WARN" and vm.summary.startswith(
        "mapping pro6000 lists container GPU(s) 0000:01:00.0 (CT 101)"
    )
    (host.paths.pve / "nodes/pve1/qemu-server/203.conf").write_text(
        "hostpci0: mapping=pro6000,pcie=1\nmachine: q35\n"
    )
    # a VM of the node now names it: a fresh plan of the spec is refused (verify is certain to
    # fail on that state), so verify fails on the refusal, naming mapping, GPUs and VM
    report = verify(spec, ports, root=str(host.paths.root), only=["converged", "vm"])
    assert not report.ok
    conv = report.check("converged")
    assert conv.status == "FAIL" and conv.summary.startswith(
        "the spec was refused: mapping pro6000 would still list GPU(s) of pve1 that a container gets "
        "(0000:01:00.0, 0000:11:00.0"
    )
    assert "while VM 203 (hostpci0, stopped) uses it" in conv.summary
    assert report.check("vm").status == "SKIP"


def test_verify_names_a_mapping_line_that_no_longer_matches_its_hardware(host):
    spec, ports = applied(host, spec_text(host))
    cfg = host.paths.pve / "mapping/pci.cfg"
    cfg.write_text(cfg.read_text().replace("iommugroup=25,", "iommugroup=99,"))
    vm = verify(spec, ports, root=str(host.paths.root), only=["vm"]).check("vm")
    assert vm.status == "FAIL"
    assert "mapping pro6000-vm: error: Invalid configuration: 'iommugroup' does not match" in vm.summary
    assert "(used by VM 201: its start fails)" in vm.summary


# --- the guest check ---------------------------------------------------------------------------------------


def test_guest_check_starts_a_stopped_vm_and_stops_it_again(host):
    spec, ports = applied(host, spec_text(host, start="false", verify_guest="false"))
    assert ports.proxmox.guest_status("qemu", 201) == "stopped"
    assert verify(spec, ports, root=str(host.paths.root)).check("guest") is None  # not asked for
    report = verify(spec, ports, root=str(host.paths.root), start_vms=True)
    guest = report.check("guest")
    assert guest.status == "PASS" and guest.details["201"]["started_here"] is True, guest.summary
    assert ports.proxmox.guest_status("qemu", 201) == "stopped"


def test_guest_check_without_an_agent_or_with_one_that_never_answers(host):
    spec, ports = applied(host, spec_text(host).replace("timeout: 120", "timeout: 120\n  guest_timeout: 0.5"))
    hang_agent(host.paths.run, 201)
    t0 = time.monotonic()
    guest = verify(spec, ports, root=str(host.paths.root), only=["guest"]).check("guest")
    assert guest.status == "FAIL" and "its guest agent did not answer within 0.5 s" in guest.summary
    assert "QEMU guest agent is not running" in guest.summary and time.monotonic() - t0 < 15
    hang_agent(host.paths.run, 201, hung=False)
    px = ports.proxmox
    px.qemu_update(201, {}, ["agent"], px.qemu_config(201)["digest"])  # pending until the next start
    px.guest_action("qemu", 201, "stop", 30)
    guest = verify(spec, ports, root=str(host.paths.root), only=["guest"]).check("guest")
    assert guest.status == "FAIL" and "No QEMU guest agent configured" in guest.summary


# --- rollback -----------------------------------------------------------------------------------------------


def test_a_failing_vm_start_rolls_its_config_back_to_the_byte(host):
    from gputopo.errors import ApplyFailed

    before = applysim.fingerprint(host)
    ports = host.ports()
    host.api.inject_fault("qmstart", 201, "start failed: QEMU exited with code 1")
    with pytest.raises(ApplyFailed) as e:
        apply(parse_spec(spec_text(host)), ports, root=str(host.paths.root), timeouts=T)
    assert e.value.rolled_back and "VM 201" in str(e.value)
    assert applysim.diff(before, applysim.fingerprint(host)) == []
    assert ports.proxmox.guest_status("qemu", 201) == "stopped"
