"""A VM update that only root@pam may make through the API (``affinity``, ``args``,
``hugepages``: qemu-server's ``only root can set '<key>' config``) is refused at plan time for any
other login, an API token of root@pam included, and is a warning when who applies is not known."""

from __future__ import annotations

import pytest

from gputopo.actions import UpdateVmConfig
from gputopo.errors import PlanRefused
from gputopo.facts.discover import discover
from gputopo.model.state import ContainerState, CurrentState, GuestState, MappingState
from gputopo.plan.findings import Findings
from gputopo.plan.mappings import map_entry
from gputopo.plan.planner import plan
from gputopo.plan.spec import parse_spec
from gputopo.plan.vm.perms import check_writer
from helpers.hosts import SPLIT_SPEC

VM201 = {
    "bios": "ovmf",
    "cores": "32",
    "hostpci0": "mapping=pro6000-vm,pcie=1",
    "machine": "q35",
    "memory": "131072",
    "numa": "1",
    "sockets": "1",
    "digest": "2" * 40,
}
SPEC = SPLIT_SPEC + "      consumers:\n        - vmid: 201\n          mapping: pro6000-vm\n"


@pytest.fixture(scope="module")
def facts(materialized):
    return discover(materialized("seed"))


def state(facts, api_user: str | None, vm: dict | None = None) -> CurrentState:
    ct = {f"dev{i}": f"/dev/nvidia{g.minor},mode=0666" for i, g in enumerate(facts.gpus)}
    cfg = dict(vm if vm is not None else VM201)
    return CurrentState(
        containers={101: ContainerState(config={**ct, "digest": "1" * 40}, status="running")},
        mappings={"pro6000": MappingState(map=[map_entry(g, "pve1") for g in facts.gpus], digest="3" * 40)},
        guests={201: GuestState(status="stopped", config=cfg, hostpci=[cfg["hostpci0"]])},
        api_user=api_user,
    )


def spec(**consumer: str):
    return parse_spec(SPEC + "".join(f"          {k}: {v}\n" for k, v in consumer.items()))


def refusals(facts, sp, cur) -> list[str]:
    with pytest.raises(PlanRefused) as e:
        plan(facts, sp, cur)
    return [r.reason for r in e.value.refusals]


def vm_update(p) -> UpdateVmConfig:
    (u,) = [a for a in p.actions if isinstance(a, UpdateVmConfig)]
    return u


def test_root_with_a_password_plans_every_key(facts):
    u = vm_update(plan(facts, spec(hugepages=1024), state(facts, "root@pam")))
    assert {"affinity", "args", "hugepages"} <= set(u.set)


def test_a_token_of_root_is_refused_with_the_keys_and_every_fix(facts):
    (why,) = refusals(facts, spec(hugepages=1024), state(facts, "root@pam!gputopo"))
    assert why.startswith(
        "VM 201: API token root@pam!gputopo may not set affinity, args, hugepages "
        "(qemu-server: only root can set 'affinity' config): log in as root@pam with a password "
        "(GPUTOPO_PVE_PASSWORD), run with --local on the node, or use a spec without them "
        "(affinity: false; hugepages unset; args set once by root@pam (qm set 201 --args '-fw_cfg "
        "name=opt/ovmf/X-PciMmio64Mb,string="
    ), why
    assert "\n" not in why


def test_another_user_is_refused_for_the_one_key_it_would_set(facts):
    # no hugepages in the spec, the pinning off, the MMIO window already in args: nothing root-only
    # is left but what args needs, and then nothing at all
    p = plan(facts, spec(affinity="false"), state(facts, "root@pam"))
    args = vm_update(p).set["args"]
    (why,) = refusals(facts, spec(affinity="false"), state(facts, "ops@pve"))
    assert why == (
        "VM 201: user ops@pve may not set args (qemu-server: only root can set 'args' config): log in as "
        "root@pam with a password (GPUTOPO_PVE_PASSWORD), run with --local on the node, or use a spec "
        f"without it (args set once by root@pam (qm set 201 --args '{args}'))"
    )
    done = state(facts, "ops@pve", {**VM201, "args": args})
    assert set(vm_update(plan(facts, spec(affinity="false"), done)).set) == {
        "numa0",
        "hostpci1",
        "hostpci2",
        "hostpci3",
    }


def test_a_delete_of_a_root_only_key_is_refused_as_a_set_is():
    # qemu-server checks the deleted keys first, with the same rule
    found = Findings()
    check_writer(201, {"numa": "1"}, ["hugepages"], "root@pam!gputopo", found)
    (r,) = found.refusals
    assert r.code == "vm-root-only" and r.reason.startswith(
        "VM 201: API token root@pam!gputopo may not set hugepages"
    )
    found = Findings()
    check_writer(201, {"numa": "1", "hostpci0": "mapping=pro6000-vm"}, ["numa0"], "root@pam!gputopo", found)
    assert not found.refusals and not found.warnings


def test_who_applies_unknown_is_a_warning(facts):
    p = plan(facts, spec(), state(facts, None))
    (w,) = [w for w in p.warnings if "only root@pam" in w]
    assert w.startswith("VM 201: only root@pam may set affinity, args through the Proxmox API")
