"""Planning VMs as consumers of a mapping (pure): their hostpciN lines, NUMA placement, the
firmware's MMIO window, what is refused before anything is written, and mapping safety."""

from __future__ import annotations

import pytest

from gputopo.actions import DeleteMapping, SetMapping, StartGuest, StopGuest, UpdateVmConfig
from gputopo.errors import PlanRefused
from gputopo.facts.discover import discover
from gputopo.model.facts import NumaNode
from gputopo.model.state import ContainerState, CurrentState, GuestState, MappingState
from gputopo.plan.mappings import map_entry
from gputopo.plan.planner import expected_after, plan
from gputopo.plan.spec import parse_spec

NUMA0 = ["0000:01:00.0", "0000:11:00.0", "0000:61:00.0", "0000:71:00.0"]
NUMA1 = ["0000:81:00.0", "0000:91:00.0", "0000:e1:00.0", "0000:f1:00.0"]
NODE1_CPUS = "64-127,192-255"
VM201 = {
    "agent": "1",
    "bios": "ovmf",
    "cores": "32",
    "cpu": "host",
    "hostpci0": "mapping=pro6000-vm,pcie=1",
    "hostpci1": "0000:22:00.0",
    "machine": "q35",
    "memory": "131072",
    "numa": "1",
    "sockets": "1",
    "digest": "2" * 40,
}


def spec_text(
    consumer: str = "", container: str = "numa: [0]", vm_gpus: str = "numa: [1]", extra: str = ""
) -> str:
    text = f"""\
apiVersion: gputopo/v1
kind: GpuTopology
nodes:
  - name: pve1
    containers:
      - vmid: 101
        gpus: {{{container}}}
    vms:
      mappings:
        - name: pro6000-vm
          gpus: {{{vm_gpus}}}
{extra}"""
    if consumer:
        text += "      consumers:\n        - " + consumer.replace("\n", "\n          ") + "\n"
    return text


@pytest.fixture(scope="module")
def facts(materialized):
    return discover(materialized("seed"))


def current(facts, vm: dict | None = None, status: str = "stopped", **vms) -> CurrentState:
    ct = {f"dev{i}": f"/dev/nvidia{g.minor},mode=0666" for i, g in enumerate(facts.gpus)}
    guests = {201: GuestState(status=status, config=dict(vm if vm is not None else VM201))}
    for key, (st, cfg) in vms.items():
        guests[int(key.split("_")[1])] = GuestState(status=st, config=cfg)
    for g in guests.values():
        g.hostpci = [v for k, v in sorted(g.config.items()) if k.startswith("hostpci")]
    return CurrentState(
        containers={101: ContainerState(config={**ct, "digest": "1" * 40}, status="running")},
        mappings={"pro6000": MappingState(map=[map_entry(g, "pve1") for g in facts.gpus], digest="3" * 40)},
        guests=guests,
        api_user="root@pam",  # read through the API as root@pam, who may set every key
    )


def refused(facts, spec: str, cur: CurrentState) -> list[str]:
    with pytest.raises(PlanRefused) as e:
        plan(facts, parse_spec(spec), cur)
    assert e.value.exit_code == 2
    return [str(r) for r in e.value.refusals]


def vm_update(p) -> UpdateVmConfig:
    (u,) = [a for a in p.actions if isinstance(a, UpdateVmConfig)]
    return u


# --- hostpciN lines ------------------------------------------------------------------------------


def test_one_line_per_gpu_and_unrelated_lines_keep_their_index(facts):
    p = plan(facts, parse_spec(spec_text("vmid: 201\nmapping: pro6000-vm")), current(facts))
    u = vm_update(p)
    # hostpci0 already names the mapping; hostpci1 is another device and keeps its index
    assert {k: v for k, v in u.set.items() if k.startswith("hostpci")} == {
        f"hostpci{i}": "mapping=pro6000-vm,pcie=1" for i in (2, 3, 4)
    }
    assert u.delete == [] and "hostpci1" not in u.set
    (t,) = p.vms
    assert t.gpus == 4 and t.mapping == "pro6000-vm" and t.numa_nodes == [1]
    assert [a.phase for a in p.actions if isinstance(a, UpdateVmConfig)] == ["config"]


def test_fewer_gpus_delete_only_its_own_extra_lines(facts):
    vm = {**VM201, **{f"hostpci{i}": "mapping=pro6000-vm,pcie=1" for i in (2, 3, 4)}}
    u = vm_update(
        plan(facts, parse_spec(spec_text("vmid: 201\nmapping: pro6000-vm\ngpus: 2")), current(facts, vm))
    )
    assert sorted(u.delete) == ["hostpci3", "hostpci4"] and not any(k.startswith("hostpci") for k in u.set)


def test_line_options_render_as_proxmox_writes_them(facts):
    vm = {**VM201, "hostpci0": "mapping=pro6000-vm"}
    spec = spec_text("vmid: 201\nmapping: pro6000-vm\ngpus: 1\nrombar: false", vm_gpus="count: 1")
    u = vm_update(plan(facts, parse_spec(spec), current(facts, vm)))
    assert u.set["hostpci0"] == "mapping=pro6000-vm,pcie=1,rombar=0"


def test_no_free_index_is_refused(facts):
    vm = {**VM201, **{f"hostpci{i}": f"0000:{i + 0x30:02x}:00.0" for i in range(1, 16)}}
    (r,) = refused(facts, spec_text("vmid: 201\nmapping: pro6000-vm"), current(facts, vm))
    assert r == "VM 201 needs 4 hostpci line(s), but only 1 of 16 indices are free"


# --- bad input: exit 2, one line each -----------------------------------------------------------


@pytest.mark.parametrize(
    "consumer, vm, want",
    [
        ("vmid: 299\nmapping: pro6000-vm", VM201, "VM 299 does not exist on node pve1"),
        (
            "vmid: 201\nmapping: gpus-x",
            VM201,
            "VM 201: mapping gpus-x is not a mapping of this cluster (have: pro6000, pro6000-vm)",
        ),
        (
            "vmid: 201\nmapping: pro6000-vm\ngpus: 6",
            VM201,
            "VM 201 asks 6 GPU(s) of mapping pro6000-vm, which has 4 on node pve1",
        ),
        (
            "vmid: 201\nmapping: pro6000-vm",
            {**VM201, "machine": "pc-i440fx-9.0"},
            "VM 201 is i440fx (machine: pc-i440fx-9.0) but pcie=1 needs machine q35: set machine: q35 or pcie: false",
        ),
        (
            "vmid: 201\nmapping: pro6000-vm\nx-vga: true",
            VM201,
            "VM 201: x-vga=1 is dropped with bios ovmf (qemu-server passes it to SeaBIOS only): set x-vga: false",
        ),
        (
            "vmid: 201\nmapping: pro6000-vm",
            {**VM201, "bios": "seabios"},
            "VM 201 boots SeaBIOS, which cannot map 512.1 GiB of 64-bit BARs (4 GPU(s), largest BAR 128 GiB): set bios: ovmf (with an efidisk0)",
        ),
        (
            "vmid: 201\nmapping: pro6000-vm\nmmio64_mb: 65536",
            VM201,
            "VM 201: mmio64_mb 65536 is smaller than its GPUs' 512.1 GiB of 64-bit BARs",
        ),
        (
            "vmid: 201\nmapping: pro6000-vm",
            {**VM201, "args": "-smbios 'type=0,vendor=FOO"},
            'VM 201: args: unbalanced quote in "-smbios \'type=0,vendor=FOO -fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=1048576": QEMU would get none of its arguments',
        ),
        (
            "vmid: 201\nmapping: pro6000-vm",
            {**VM201, "hostpci1": "0000:C1:00.0"},
            "VM 201: unable to parse value of 'hostpci1' - hostpci host: '0000:C1:00.0' is not a PCI id (lower-case hex, e.g. 0000:81:00.0)",
        ),
    ],
)
def test_refused_before_anything_is_written(facts, consumer, vm, want):
    assert refused(facts, spec_text(consumer), current(facts, vm)) == [want]


def test_a_numa_node_without_cpus_would_be_an_empty_affinity(facts):
    f = facts.model_copy(deep=True)
    f.host.numa_nodes = [NumaNode(id=0, cpulist="0-63"), NumaNode(id=1, cpulist="", has_cpus=False)]
    (r,) = refused(f, spec_text("vmid: 201\nmapping: pro6000-vm"), current(f))
    assert r.startswith("VM 201: NUMA node 1 has no CPUs, and an empty affinity fails at VM start")


# --- placement and firmware -----------------------------------------------------------------------


def test_pinned_to_the_gpus_node_with_memory_bound_there_and_an_mmio_window(facts):
    spec = spec_text("vmid: 201\nmapping: pro6000-vm\nhugepages: 1024")
    p = plan(facts, parse_spec(spec), current(facts))
    u = vm_update(p)
    assert u.set["affinity"] == NODE1_CPUS
    assert u.set["numa0"] == "cpus=0-31,hostnodes=1,memory=131072,policy=bind"
    assert u.set["hugepages"] == "1024" and "numa" not in u.set  # numa: 1 is already set
    # 4 x (128 GiB + 32 MiB) of 64-bit BARs: the next power of two, 1 TiB
    assert u.set["args"] == "-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=1048576"
    notes = " ".join(p.vms[0].notes)
    for needle in (
        "affinity 64-127,192-255: the CPUs of NUMA node 1",
        "numa0 hostnodes=1,policy=bind",
        "hugepages 1024: guest memory in 1 GiB pages",
        "do not fit OVMF's default 32 GiB",
    ):
        assert needle in notes
    assert "VM 201: 4 GPU(s) from pro6000-vm, NUMA node 1" in p.to_text()


def test_gpus_across_numa_nodes_are_a_warning_naming_them(facts):
    spec = spec_text(
        "vmid: 201\nmapping: pro6000-vm\ngpus: 2",
        container="numa: [0]",
        vm_gpus='addresses: ["0000:71:00.0", "0000:81:00.0"]',
    ).replace("numa: [0]", 'addresses: ["0000:01:00.0"]')
    cur = current(facts)
    p = plan(facts, parse_spec(spec), cur)
    (w,) = [w for w in p.warnings if w.startswith("VM 201")]
    assert w.startswith("VM 201: its GPUs span NUMA nodes 0, 1 (0000:71:00.0 on 0, 0000:81:00.0 on 1)")
    u = vm_update(p)
    assert u.set["affinity"] == "0-255" and "numa0" not in u.set


def test_a_window_already_large_enough_is_left_alone(facts):
    vm = {**VM201, "args": "-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=2097152 -no-reboot"}
    u = vm_update(plan(facts, parse_spec(spec_text("vmid: 201\nmapping: pro6000-vm")), current(facts, vm)))
    assert "args" not in u.set


def test_guest_cpu_without_the_address_bits_is_a_warning(facts):
    vm = {k: v for k, v in VM201.items() if k != "cpu"}
    p = plan(facts, parse_spec(spec_text("vmid: 201\nmapping: pro6000-vm")), current(facts, vm))
    assert any("40 phys-bits" in w and "set cpu: host" in w for w in p.warnings), p.warnings


def test_a_running_consumer_is_stopped_for_its_config_and_started_again(facts):
    p = plan(facts, parse_spec(spec_text("vmid: 201\nmapping: pro6000-vm")), current(facts, status="running"))
    kinds = [(a.kind, getattr(a, "vmid", None)) for a in p.actions]
    assert (
        kinds.index(("stop_guest", 201))
        < kinds.index(("update_vm_config", 201))
        < kinds.index(("start_guest", 201))
    )


def test_start_true_starts_a_stopped_vm_and_converges(facts):
    spec = parse_spec(spec_text("vmid: 201\nmapping: pro6000-vm\nstart: true"))
    cur = current(facts)
    p = plan(facts, spec, cur)
    assert isinstance(p.actions[-1], StartGuest) and p.actions[-1].vmid == 201
    f2, c2 = expected_after(p, facts, cur)
    assert plan(f2, spec, c2).actions == []


# --- mapping safety ---------------------------------------------------------------------------------


def split_then(facts, first: str, cur: CurrentState):
    """Facts and current state once ``first`` (a spec text) is applied."""
    spec = parse_spec(first)
    return expected_after(plan(facts, spec, cur), facts, cur)


def test_reverse_split_with_the_vm_running_on_the_mapping_is_refused_naming_vm_and_mapping(facts):
    split = spec_text(extra="      guests: [201]\n")
    f2, c2 = split_then(facts, split, current(facts, status="running"))
    back = spec_text(container="numa: [0, 1]", vm_gpus="numa: [1]", extra="      guests: [201]\n").replace(
        "gpus: {numa: [1]}", "gpus: rest"
    )
    (r,) = refused(f2, back, c2)
    assert r.startswith(
        "VM 201 is running with mapping pro6000-vm (hostpci0), whose GPU(s) go to a container "
        "(0000:81:00.0, 0000:91:00.0, 0000:e1:00.0, 0000:f1:00.0 to container 101)"
    )


def test_read_from_files_a_vm_may_be_running_and_the_plan_says_so(facts):
    f2, c2 = split_then(facts, spec_text(extra="      guests: [201]\n"), current(facts, status="running"))
    c2.guest_status_known = False  # Proxmox's files cannot tell: every guest counts as running
    back = spec_text(container="numa: [0, 1]", extra="      guests: [201]\n").replace(
        "gpus: {numa: [1]}", "gpus: rest"
    )
    (r,) = refused(f2, back, c2)
    assert r.startswith(
        "VM 201 may be running (Proxmox's files cannot tell: plan with --local or --api-url to know) "
        "with mapping pro6000-vm (hostpci0)"
    )


def test_reverse_split_removes_the_consumers_lines_and_never_starts_it_on_container_gpus(facts):
    consumer = "vmid: 201\nmapping: pro6000-vm\nwhen_gpus_leave: remove"
    f2, c2 = split_then(facts, spec_text(consumer), current(facts, status="running"))
    assert c2.guests[201].hostpci[:1] == ["mapping=pro6000-vm,pcie=1"]
    back = spec_text(consumer, container="numa: [0, 1]").replace("gpus: {numa: [1]}", "gpus: rest")
    p = plan(f2, parse_spec(back), c2)
    kinds = [(a.kind, getattr(a, "vmid", getattr(a, "id", None))) for a in p.actions]
    assert ("delete_mapping", "pro6000-vm") in kinds
    u = vm_update(p)
    assert sorted(u.delete) == ["hostpci0", "hostpci2", "hostpci3", "hostpci4"] and "hostpci1" not in u.delete
    # it ran: it is stopped, changed, and started again without the GPUs
    assert (
        kinds.index(("stop_guest", 201))
        < kinds.index(("update_vm_config", 201))
        < kinds.index(("start_guest", 201))
    )
    assert any("their hostpci lines are removed" in n for n in p.vms[0].notes)
    f3, c3 = expected_after(p, f2, c2)
    assert plan(f3, parse_spec(back), c3).actions == []


def test_repoint_needs_a_mapping_without_container_gpus(facts):
    consumer = "vmid: 201\nmapping: pro6000-vm\nwhen_gpus_leave: repoint\nrepoint_to: pro6000"
    f2, c2 = split_then(facts, spec_text(consumer.split("\nwhen")[0]), current(facts))
    back = spec_text(consumer, container="numa: [0, 1]").replace("gpus: {numa: [1]}", "gpus: rest")
    (r,) = refused(f2, back, c2)
    assert r == "VM 201: cannot repoint to mapping pro6000, which lists container GPUs too"


def test_a_vm_is_never_started_on_a_mapping_listing_container_gpus(facts):
    # VM 202 runs on pro6000 (all eight GPUs); the split rebinds four of them: it must stop, and
    # pro6000 would still list the container's four GPUs afterwards
    vm202 = {"machine": "q35", "hostpci0": "mapping=pro6000,pcie=1", "digest": "4" * 40}
    (r,) = refused(facts, spec_text(), current(facts, vm_202=("running", vm202)))
    assert r.startswith(
        "VM 202 would be started, but its hostpci0 names mapping pro6000, which lists container "
        "GPU(s) (0000:01:00.0, 0000:11:00.0, 0000:61:00.0, 0000:71:00.0 to container 101)"
    )


def test_other_mappings_shrink_removes_container_gpus_from_mappings_the_spec_does_not_manage(facts):
    spec = spec_text(extra="      other_mappings: shrink\n")
    p = plan(facts, parse_spec(spec), current(facts))
    (s,) = [a for a in p.actions if isinstance(a, SetMapping) and a.id == "pro6000"]
    assert [e.split("path=")[1].split(",")[0] for e in s.map] == NUMA1
    back = spec_text(container="numa: [0, 1]", extra="      other_mappings: shrink\n").replace(
        "gpus: {numa: [1]}", "gpus: rest"
    )
    f2, c2 = expected_after(p, facts, current(facts))
    p2 = plan(f2, parse_spec(back), c2)
    assert {a.id for a in p2.actions if isinstance(a, DeleteMapping)} == {"pro6000", "pro6000-vm"}


def test_a_stopped_vm_on_a_deleted_mapping_is_a_warning(facts):
    f2, c2 = split_then(facts, spec_text(), current(facts))
    back = spec_text(container="numa: [0, 1]").replace("gpus: {numa: [1]}", "gpus: rest")
    p = plan(f2, parse_spec(back), c2)
    assert (
        "VM 201 (stopped) cannot start on pve1: its hostpci0 names mapping pro6000-vm, which has no device "
        "on pve1 after the plan (the plan deletes it); Proxmox refuses its start here (PCI device mapping not "
        "found)" in p.warnings
    )
    assert not [a for a in p.actions if isinstance(a, (StopGuest, StartGuest)) and a.guest == "qemu"]


# --- what verify is certain to fail is refused ----------------------------------------------------

GIVE_BACK = """\
apiVersion: gputopo/v1
kind: GpuTopology
nodes:
  - name: pve1
    containers:
      - vmid: 101
        gpus: {numa: [0, 1]}
"""


def test_giving_the_gpus_back_without_saying_what_the_vm_mapping_keeps_is_refused(facts):
    """The split, then a spec giving every GPU back that says nothing of pro6000-vm: the mapping
    would still list the container's GPUs and stopped VM 201 names it, which verify's vm check
    fails. Refused with one line naming mapping, node, GPUs, VM and the way out."""
    f2, c2 = split_then(facts, spec_text(), current(facts))
    with pytest.raises(PlanRefused) as e:
        plan(f2, parse_spec(GIVE_BACK), c2)
    assert e.value.exit_code == 2
    (r,) = e.value.refusals
    assert r.code == "mapping-lists-container-gpus" and r.address is None
    assert r.reason == (
        "mapping pro6000-vm would still list GPU(s) of pve1 that a container gets (0000:81:00.0, "
        "0000:91:00.0, 0000:e1:00.0, 0000:f1:00.0 to container 101) while VM 201 (hostpci0, stopped) uses "
        "it: verify fails on it, as Proxmox could give the VM one of them at its start; list it under "
        "vms.mappings of pve1 with the GPUs it keeps (gpus: {addresses: []} for none), or remove the mapping"
    )
    # the way out the line gives: the mapping listed with no GPUs is deleted, VM 201 cannot start
    # here (a warning: it stays stopped) and the result plans nothing again
    way_out = (
        GIVE_BACK + "    vms:\n      mappings:\n        - name: pro6000-vm\n          gpus: {addresses: []}\n"
    )
    p = plan(f2, parse_spec(way_out), c2)
    assert {a.id for a in p.actions if isinstance(a, DeleteMapping)} == {"pro6000-vm"}
    assert any(
        w.startswith("VM 201 (stopped) cannot start on pve1: its hostpci0 names mapping") for w in p.warnings
    )
    f3, c3 = expected_after(p, f2, c2)
    assert plan(f3, parse_spec(way_out), c3).actions == []


def test_a_mapping_listing_container_gpus_that_no_vm_names_is_not_refused(facts):
    # verify only warns about such a mapping (no VM can be given a container GPU through it)
    vm = {k: v for k, v in VM201.items() if k != "hostpci0"}
    f2, c2 = split_then(facts, spec_text(), current(facts, vm))
    assert plan(f2, parse_spec(GIVE_BACK), c2).actions


def test_a_running_vm_on_a_mapping_that_already_lists_container_gpus_is_refused(facts):
    # nothing moves: pro6000 lists the container's eight GPUs now, and VM 202 runs on it
    vm202 = {"machine": "q35", "hostpci0": "mapping=pro6000,pcie=1", "digest": "4" * 40}
    spec = GIVE_BACK.replace("numa: [0, 1]", "count: 8")
    (r,) = refused(facts, spec, current(facts, vm={}, vm_202=("running", vm202)))
    assert r.startswith(
        "mapping pro6000 would still list GPU(s) of pve1 that a container gets (0000:01:00.0,"
    )
    assert "while VM 202 (hostpci0, running) uses it" in r


def test_a_vm_whose_mapping_has_no_device_on_this_node_is_said_so(facts):
    """The mapping exists with another node's lines only: Proxmox's start on this node dies
    ("PCI device mapping not found", qemu-server PCI.pm parse_hostpci): a stopped VM is warned
    about (it stays stopped and can still run on pve2), in words that do not say the mapping is
    gone."""
    pve2 = [map_entry(g, "pve2") for g in facts.gpus if g.address in NUMA1]
    cur = current(facts)
    cur.mappings["pro6000-vm"] = MappingState(map=pve2, digest="5" * 40)
    whole = GIVE_BACK.replace("numa: [0, 1]", "count: 8")
    p = plan(facts, parse_spec(whole), cur)
    assert (
        "VM 201 (stopped) cannot start on pve1: its hostpci0 names mapping pro6000-vm, which has no device "
        "on pve1 after the plan (as the other nodes are now, it lists devices of pve2 only); Proxmox refuses "
        "its start here (PCI device mapping not found)" in p.warnings
    )
    # a mapping that does not exist at all (in a cluster another node may be creating it)
    del cur.mappings["pro6000-vm"]
    p = plan(facts, parse_spec(whole), cur)
    assert (
        "VM 201 (stopped) cannot start on pve1: its hostpci0 names mapping pro6000-vm, which has no device "
        "on pve1 after the plan; Proxmox refuses its start here (PCI device mapping not found)" in p.warnings
    )
