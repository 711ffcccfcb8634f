"""Planner tests on hosts built directly from gputopo.model (no sysfs tree needed)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gputopo.errors import PlanRefused
from gputopo.model import Facts, GroupMember, Gpu, HostFacts, MemberRole, Modules, NumaNode
from gputopo.plan import (
    ContainerState,
    CurrentState,
    GuestState,
    MappingState,
    Rebind,
    ServiceState,
    SetMapping,
    StopGuest,
    UpdateContainer,
    WriteServiceDropin,
    expected_after,
    format_dev,
    map_entry,
    plan,
)
from gputopo.spec import Spec, parse_spec, spec_from_split

SEED_NUMA = {"01": 0, "11": 0, "61": 0, "71": 0, "81": 1, "91": 1, "e1": 1, "f1": 1}
SEED_MINOR = {"01": 0, "11": 1, "61": 3, "71": 2, "81": 4, "91": 5, "e1": 7, "f1": 6}
SEED_CMD = "/usr/bin/python3 -m sglang.launch_server --model-path /models/qwen --tp 8 --port 30000"


def gpu(bus: str, numa: int | None, minor: int | None, group: int, *, driver="nvidia", members=(), **kw) -> Gpu:
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
    return GroupMember(address=f"0000:{bus}:00.1", role=MemberRole.FUNCTION, vendor="0x10de",
                       device="0x22ba", **{"class": "0x040300"}, driver=driver)


def host(gpus: list[Gpu], **kw) -> Facts:
    h = dict(hostname="pve1", iommu_enabled=True, iommu_group_count=100, iommu_mode="translated",
             modules=Modules(vfio=True, vfio_pci=True, vfio_iommu_type1=True, nvidia=True),
             sev_snp=True, numa_nodes=[NumaNode(id=0), NumaNode(id=1)])
    h.update(kw)
    return Facts(gpus=sorted(gpus, key=lambda g: g.address), host=HostFacts(**h))


def seed_facts() -> Facts:
    gpus = [gpu(b, SEED_NUMA[b], SEED_MINOR[b], 10 + i) for i, b in enumerate(SEED_NUMA)]
    vga = Gpu(address="0000:c2:00.0", vendor="0x1a03", device="0x2000", **{"class": "0x030000"},
              driver="ast", iommu_group=90, numa_node=1, boot_vga=True)
    return host(gpus + [vga])


def seed_current(tp: int = 8, dropin: str | None = None) -> CurrentState:
    """Container 101 running with all eight GPUs, service at --tp 8, nothing for VMs yet."""
    cfg = {"arch": "amd64", "hostname": "infer", "digest": "d0"}
    paths = [f"/dev/nvidia{SEED_MINOR[b]}" for b in SEED_NUMA] + [
        "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset",
        "/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-caps/nvidia-cap2"]
    for i, p in enumerate(paths):
        cfg[f"dev{i}"] = format_dev(p, None, "0666")
    return CurrentState(
        containers={101: ContainerState(config=cfg, status="running", service=ServiceState(
            unit="sglang.service", active=True, exec_start=SEED_CMD, tp=tp, dropin=dropin))},
        mappings={"pro6000": MappingState(map=[map_entry(g, "pve1") for g in seed_facts().gpus if g.vendor == "0x10de"],
                                          description="all eight", digest="m0")},
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


# --- the seed split ----------------------------------------------------------------------------


def test_seed_split_owners_drivers_and_tp():
    p = plan(seed_facts(), seed_spec(), seed_current())
    owners = {t.address: t.owner for t in p.target}
    assert [a for a, o in owners.items() if o == "container:101"] == [
        "0000:01:00.0", "0000:11:00.0", "0000:61:00.0", "0000:71:00.0"]
    assert [a for a, o in owners.items() if o == "vm:pro6000-vm"] == [
        "0000:81:00.0", "0000:91:00.0", "0000:e1:00.0", "0000:f1:00.0"]
    assert owners["0000:c2:00.0"] == "host"
    rebinds = [a for a in p.actions if isinstance(a, Rebind)]
    assert sorted(r.address for r in rebinds) == ["0000:81:00.0", "0000:91:00.0", "0000:e1:00.0", "0000:f1:00.0"]
    assert all(r.to_driver == "vfio-pci" and r.from_drivers[r.address] == "nvidia" for r in rebinds)
    (ct,) = p.containers
    assert ct.service.tp == 4 and ct.service.current_tp == 8
    drop = next(a for a in p.actions if isinstance(a, WriteServiceDropin))
    assert "--tp 4 --port 30000" in drop.content and "NCCL_P2P_DISABLE=1" in drop.content


def test_seed_devices_follow_real_minors_and_keep_the_rest():
    p = plan(seed_facts(), seed_spec(), seed_current())
    (upd,) = [a for a in p.actions if isinstance(a, UpdateContainer)]
    # NUMA-1 GPUs have minors 4,5,7,6 and sat at dev4..dev7; only those go
    assert sorted(upd.delete) == ["dev4", "dev5", "dev6", "dev7"]
    assert upd.set == {} and upd.digest == "d0"
    gpu_devs = sorted(v.split(",")[0] for v in p.containers[0].devices.values() if v.startswith("/dev/nvidia") and v[11:12].isdigit())
    assert gpu_devs == ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia2", "/dev/nvidia3"]


def test_seed_action_order_and_phases():
    p = plan(seed_facts(), seed_spec(), seed_current())
    phases = [a.phase for a in p.actions]
    assert phases == sorted(phases, key=["prepare", "stop", "switch", "config", "start"].index)
    kinds = [a.kind for a in p.actions]
    assert kinds.index("stop_service") < kinds.index("stop_guest") < kinds.index("rebind")
    assert kinds[-2:] == ["start_service", "start_guest"] or "start_guest" in kinds
    # VM 200 uses pro6000-vm, which is created: it must be stopped and started again
    assert any(isinstance(a, StopGuest) and a.guest == "qemu" and a.vmid == 200 for a in p.actions)
    sm = {a.id: a for a in p.actions if isinstance(a, SetMapping)}
    assert sm["pro6000-vm"].create and len(sm["pro6000-vm"].map) == 4
    assert not sm["pro6000"].create and sm["pro6000"].digest == "m0" and len(sm["pro6000"].map) == 4
    assert all(len(a.describe().splitlines()) == 1 for a in p.actions)


def test_map_entry_is_canonical():
    g = seed_facts().gpu("0000:81:00.0")
    assert map_entry(g, "pve1") == "id=10de:2bb5,iommugroup=14,node=pve1,path=0000:81:00.0,subsystem-id=10de:204e"


def test_converged_seed_plans_nothing():
    facts, cur = seed_facts(), seed_current()
    p = plan(facts, seed_spec(), cur)
    f2, c2 = expected_after(p, facts, cur)
    p2 = plan(f2, seed_spec(), c2)
    assert p2.actions == [], p2.to_text()
    assert "No changes" in p2.to_text()


def test_only_dropin_changes_restart_only_the_service():
    facts, cur = seed_facts(), seed_current()
    f2, c2 = expected_after(plan(facts, seed_spec(), cur), facts, cur)
    spec = seed_spec(SEED_SPEC.replace('tp_flag: "--tp"}', 'tp_flag: "--tp", command: "python3 -m sglang.launch_server --tp 2"}'))
    kinds = [a.kind for a in plan(f2, spec, c2).actions]
    assert kinds == ["write_service_dropin", "stop_service", "start_service"]


def test_converged_but_stopped_container_or_service_is_started():
    """The spec says the container serves its GPUs: stopped is not converged."""
    facts, cur = seed_facts(), seed_current()
    f2, c2 = expected_after(plan(facts, seed_spec(), cur), facts, cur)
    c2.containers[101].status = "stopped"
    p = plan(f2, seed_spec(), c2)
    assert [a.kind for a in p.actions] == ["start_guest", "start_service"]
    f3, c3 = expected_after(p, f2, c2)
    assert plan(f3, seed_spec(), c3).actions == []
    c2.containers[101].status = "running"
    c2.containers[101].service.active = False
    assert [a.kind for a in plan(f2, seed_spec(), c2).actions] == ["start_service"]


def test_container_not_touched_is_not_stopped():
    facts, cur = seed_facts(), seed_current()
    f2, c2 = expected_after(plan(facts, seed_spec(), cur), facts, cur)
    spec = seed_spec(SEED_SPEC.replace("description: RTX PRO 6000 on NUMA node 1", "description: changed"))
    p = plan(f2, spec, c2)
    assert [a.kind for a in p.actions] == ["set_mapping"]


def test_quick_split_matches_numa():
    p = plan(seed_facts(), spec_from_split(seed_facts(), container=101, vm_mapping="pro6000-vm"), seed_current())
    assert {t.address for t in p.target if t.driver == "vfio-pci"} == {
        "0000:81:00.0", "0000:91:00.0", "0000:e1:00.0", "0000:f1:00.0"}


def test_moving_back_clears_override_and_unknown_minor_warns():
    facts = seed_facts()
    for g in facts.gpus:
        if g.numa_node == 1 and g.vendor == "0x10de":
            g.driver, g.driver_override, g.minor = "vfio-pci", "vfio-pci", None
    spec = seed_spec(SEED_SPEC.replace("gpus: {numa: [0]}", "gpus: {numa: [0, 1]}").replace(
        "gpus: {numa: [1]}", "gpus: {count: 1}"))
    with pytest.raises(PlanRefused) as e:
        plan(facts, spec, seed_current())
    assert "pro6000-vm wants 1 GPU(s), only 0 unclaimed" in str(e.value)
    spec = seed_spec(SEED_SPEC.replace("gpus: {numa: [0]}", "gpus: {numa: [0, 1]}").replace(
        "        - name: pro6000-vm\n          gpus: {numa: [1]}\n          description: RTX PRO 6000 on NUMA node 1\n", ""
    ).replace("mappings:\n", "mappings: []\n"))
    p = plan(facts, spec, seed_current())
    rb = [a for a in p.actions if isinstance(a, Rebind)]
    assert len(rb) == 4 and all(r.to_driver == "nvidia" for r in rb)
    assert any("minor unknown" in w for w in p.warnings)
    assert any("span NUMA nodes [0, 1]" in w for w in p.warnings)


# --- refusals ------------------------------------------------------------------------------------


def _refusals(facts, spec_text, cur=None) -> list[str]:
    with pytest.raises(PlanRefused) as e:
        plan(facts, seed_spec(spec_text), cur or CurrentState())
    assert e.value.exit_code == 2
    return [str(r) for r in e.value.refusals]


def test_shared_group_with_nvme_is_refused():
    facts = seed_facts()
    g = facts.gpu("0000:81:00.0")
    g.iommu_members.append(GroupMember(address="0000:82:00.0", role=MemberRole.FOREIGN, vendor="0x144d",
                                       device="0xa808", **{"class": "0x010802"}, driver="nvme"))
    (r,) = _refusals(facts, SEED_SPEC)
    assert r.startswith("0000:81:00.0: IOMMU group 14 also holds 0000:82:00.0") and "\n" not in r


def test_double_claim_and_missing_address_refused():
    text = SEED_SPEC.replace("gpus: {numa: [0]}", 'gpus: {addresses: ["81:00.0", "0000:aa:00.0"]}')
    rs = _refusals(seed_facts(), text)
    assert "0000:aa:00.0: no such GPU on this host (container:101)" in rs
    assert "0000:81:00.0: claimed by both container:101 and vm:pro6000-vm" in rs


def test_boot_vga_sriov_and_iommu_off_refused():
    facts = seed_facts()
    facts.gpu("0000:81:00.0").boot_vga = True
    facts.gpu("0000:91:00.0").sriov_numvfs = 4
    rs = _refusals(facts, SEED_SPEC)
    assert any(r.startswith("0000:81:00.0: is the boot VGA") for r in rs)
    assert any(r.startswith("0000:91:00.0: has 4 SR-IOV VFs") for r in rs)
    facts = seed_facts()
    facts.host.iommu_enabled = False
    rs = _refusals(facts, SEED_SPEC)
    assert len(rs) == 4 and all("IOMMU is off" in r for r in rs)


def test_tp_check_error_or_warning():
    text = SEED_SPEC.replace("gpus: {numa: [0]}", 'gpus: {count: 3}').replace("gpus: {numa: [1]}", "gpus: rest")
    (r,) = _refusals(seed_facts(), text)
    assert r == "container 101: tensor parallel 3 is not a power of two"
    p = plan(seed_facts(), seed_spec(text + "policy: {tp_check: warn}\n"), seed_current())
    assert "container 101: tensor parallel 3 is not a power of two" in p.warnings
    assert len([t for t in p.target if t.owner == "vm:pro6000-vm"]) == 5


def test_heads_must_divide():
    text = SEED_SPEC.replace('tp_flag: "--tp"}', 'tp_flag: "--tp", attention_heads: 6}')
    (r,) = _refusals(seed_facts(), text)
    assert "does not divide the 6 attention heads" in r


def test_vfio_module_missing_is_a_warning():
    facts = seed_facts()
    facts.host.modules.vfio_pci = False
    p = plan(facts, seed_spec(), seed_current())
    assert any("vfio-pci module is not loaded" in w for w in p.warnings)


def test_audio_function_moves_with_gpu():
    gpus = [gpu("01", 0, 0, 1, members=[audio("01")]), gpu("41", 0, 1, 2, members=[audio("41")]),
            gpu("c1", 1, 2, 3, members=[audio("c1")]), gpu("e1", 1, 3, 4, members=[audio("e1")])]
    p = plan(host(gpus), spec_from_split(host(gpus)), CurrentState())
    rb = {a.address: a for a in p.actions if isinstance(a, Rebind)}
    assert rb["0000:c1:00.0"].members == ["0000:c1:00.0", "0000:c1:00.1"]
    assert rb["0000:c1:00.0"].from_drivers == {"0000:c1:00.0": "nvidia", "0000:c1:00.1": "snd_hda_intel"}
    assert "0000:c1:00.1" in p.vfio_addresses()


def test_legacy_mode_lines():
    text = SEED_SPEC.replace("mapping: pro6000\n", "mapping: pro6000\n        device_mode: legacy\n"
                             "        legacy_majors: {nvidia-uvm: 508, nvidia-caps: 236}\n")
    p = plan(seed_facts(), seed_spec(text), seed_current())
    (upd,) = [a for a in p.actions if isinstance(a, UpdateContainer)]
    assert len(upd.delete) == 14 and not upd.set
    assert ["lxc.cgroup2.devices.allow", "c 508:* rwm"] in upd.lxc_add
    assert ["lxc.mount.entry", "/dev/nvidia3 dev/nvidia3 none bind,optional,create=file"] in upd.lxc_add
    f2, c2 = expected_after(p, seed_facts(), seed_current())
    assert plan(f2, seed_spec(text), c2).actions == []


# --- properties ---------------------------------------------------------------------------------


@st.composite
def hosts_and_specs(draw):
    n = draw(st.integers(1, 6))
    gpus = []
    for i in range(n):
        bus = f"{0x10 * (i + 1):02x}"
        numa = draw(st.sampled_from([0, 1, None]))
        on_vfio = draw(st.booleans())
        g = gpu(bus, numa, None if on_vfio else i, 10 + i, driver="vfio-pci" if on_vfio else "nvidia",
                members=[audio(bus, "vfio-pci" if on_vfio else "snd_hda_intel")] if draw(st.booleans()) else [])
        gpus.append(g)
    facts = host(gpus)
    sels = [{"numa": [0]}, {"numa": [1]}, {"numa": [0, 1]}, {"count": 1}, {"count": 2},
            {"addresses": [gpus[0].address]}]
    ct_sel = draw(st.sampled_from(sels))
    vm_sel = draw(st.sampled_from(sels + ["rest"]))
    spec = Spec.model_validate({
        "apiVersion": "gputopo/v1", "kind": "GpuTopology",
        "nodes": [{"name": "pve1",
                   "containers": [{"vmid": 101, "gpus": ct_sel, "service": {"unit": "vllm.service", "command": "vllm serve m"}}],
                   "vms": {"mappings": [{"name": "vmgpus", "gpus": vm_sel}]}}],
        "policy": {"tp_check": "warn"},
    })
    running = draw(st.booleans())
    cur = CurrentState(containers={101: ContainerState(status="running" if running else "stopped",
                                                       config={"dev0": "/dev/dri/renderD128", "digest": "x"})})
    return facts, spec, cur


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(hosts_and_specs())
def test_property_one_owner_and_convergence(case):
    facts, spec, cur = case
    try:
        p = plan(facts, spec, cur)
    except PlanRefused as e:
        assert all("\n" not in str(r) for r in e.refusals)
        return
    claimed = [t.address for t in p.target if t.owner != "host"]
    assert len(claimed) == len(set(claimed))
    ct = p.containers[0]
    vm = set(p.mappings["vmgpus"].map)
    assert not {a for a in ct.gpus} & {e.split("path=")[1].split(",")[0] for e in vm}
    assert ct.devices.get("dev0") == "/dev/dri/renderD128"
    f2, c2 = expected_after(p, facts, cur)
    p2 = plan(f2, spec, c2)
    if any("minor unknown" in w for w in p.warnings):
        # a minor unknown on the first pass is read after nvidia binds it: one more pass adds it
        p2 = plan(*expected_after(p2, f2, c2)[:1], spec, expected_after(p2, f2, c2)[1])
    assert p2.actions == [], p2.to_text()
