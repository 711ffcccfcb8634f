"""The rollback's order, computed from what each kind's undo needs and restores
(:func:`gputopo.actions.undo_order`), on the steps of real plan shapes: the reverse change with VM
201 a consumer of the mapping it deletes, and the split."""

from __future__ import annotations

import random

import pytest

from gputopo.actions import (
    ActionModel,
    DeleteMapping,
    PlaceHa,
    Rebind,
    RemoveHostFile,
    Resource,
    SetMapping,
    StartGuest,
    StartService,
    StopGuest,
    StopService,
    UpdateContainer,
    UpdateVmConfig,
    WriteHostFile,
    WriteServiceDropin,
    action_kinds,
    undo_order,
)

NUMA1 = ["0000:81:00.0", "0000:91:00.0", "0000:e1:00.0", "0000:f1:00.0"]
DROPIN = "/etc/systemd/system/sglang.service.d/gputopo.conf"


def _map(addresses: list[str]) -> list[str]:
    return [f"id=10de:2bb5,iommugroup=1,node=pve1,path={a}" for a in addresses]


def reverse_steps() -> list[ActionModel]:
    """The 18 steps of the reverse change (GPUs back to CT 101; VM 201 consumes pro6000-vm with
    when_gpus_leave: remove), as ``gputopo plan`` lists them."""
    return [
        RemoveHostFile(path="etc/udev/rules.d/90-gputopo-vfio.rules"),
        RemoveHostFile(path="etc/modules-load.d/gputopo-vfio.conf"),
        RemoveHostFile(path="etc/modprobe.d/gputopo-vfio.conf"),
        DeleteMapping(id="pro6000-vm", node="pve1", base=_map(NUMA1)),
        SetMapping(id="pro6000", node="pve1", map=_map(NUMA1), create=False),
        WriteServiceDropin(vmid=101, unit="sglang.service", path=DROPIN, content="[Service]\n", tp=8),
        StopService(vmid=101, unit="sglang.service"),
        StopGuest(guest="lxc", vmid=101),
        StopGuest(guest="qemu", vmid=201),
        *[Rebind(address=a, members=[a], from_drivers={a: "vfio-pci"}, to_driver="nvidia") for a in NUMA1],
        UpdateContainer(vmid=101, resolve=NUMA1),
        UpdateVmConfig(vmid=201, delete=["hostpci0", "hostpci1", "hostpci2", "hostpci3"]),
        StartGuest(guest="lxc", vmid=101),
        StartService(vmid=101, unit="sglang.service"),
        StartGuest(guest="qemu", vmid=201),
    ]


def split_steps() -> list[ActionModel]:
    """The split with the container restarted (policy.container_restart: always) and VM 201 a
    consumer that runs afterwards, on a member of a cluster (its HA placement)."""
    return [
        WriteHostFile(path="etc/modprobe.d/gputopo-vfio.conf", content="x\n"),
        SetMapping(id="pro6000-vm", node="pve1", map=_map(NUMA1), create=True),
        WriteServiceDropin(vmid=101, unit="sglang.service", path=DROPIN, content="[Service]\n", tp=4),
        StopService(vmid=101, unit="sglang.service"),
        StopGuest(guest="lxc", vmid=101),
        *[
            Rebind(address=a, members=[a, a[:-1] + "1"], from_drivers={a: "nvidia"}, to_driver="vfio-pci")
            for a in NUMA1
        ],
        UpdateContainer(vmid=101, delete=["dev4", "dev5", "dev6", "dev7"]),
        UpdateVmConfig(vmid=201, set={"hostpci0": "mapping=pro6000-vm,pcie=1"}),
        PlaceHa(node="pve1", managed=["pro6000-vm"], release=9),
        StartGuest(guest="lxc", vmid=101),
        StartService(vmid=101, unit="sglang.service"),
        StartGuest(guest="qemu", vmid=201),
    ]


def pending(steps: list[ActionModel], begun: list[int] | None = None) -> list[tuple[int, ActionModel]]:
    """(index, action) of the begun steps, newest first, as the runner hands them over."""
    order = list(range(len(steps))) if begun is None else begun
    return [(n, steps[n]) for n in reversed(order)]


def unmet(order: list[int], steps: list[ActionModel], todo: set[int]) -> list[str]:
    """Every undo in ``order`` that runs before another pending undo restoring what it needs."""
    pos = {n: i for i, n in enumerate(order)}
    out = []
    for n in order:
        for m in todo - {n}:
            met = [need for need in steps[n].undo_needs() for r in steps[m].undo_restores() if need.covers(r)]
            if met and pos[m] > pos[n]:
                out.append(
                    f"{n + 1} ({steps[n].describe()}) before {m + 1} ({steps[m].describe()}): {met[0]}"
                )
    return out


def test_the_reverse_rollback_starts_vm_201_after_its_mapping_config_and_gpus_are_back():
    steps = reverse_steps()
    order = undo_order(pending(steps, list(range(17))))  # step 17, the service's start, failed
    at = {n: i for i, n in enumerate(order)}
    assert sorted(order) == list(range(17))
    vm_start = at[8]  # the undo of "stop VM 201" starts it
    assert vm_start > at[3], "VM 201 starts before its mapping pro6000-vm is back"
    assert vm_start > at[14], "VM 201 starts before its hostpci lines are back"
    assert all(vm_start > at[n] for n in range(9, 13)), "VM 201 starts before its GPUs are on vfio-pci"
    # the container stops (undo of its start) before its GPUs leave nvidia; its devN entries
    # wait for the GPUs; it starts once they and its config are back, and only then can the
    # drop-in inside it be put back
    assert at[15] < min(at[n] for n in range(9, 13)) < max(at[n] for n in range(9, 13)) < at[13]
    assert at[13] < at[7] < at[5]
    # a guest that ran before starts last: only what needs it running comes after
    assert set(order[-3:]) == {7, 8, 5} and order[-1] == 5
    assert unmet(order, steps, set(order)) == []


def test_undo_order_is_newest_first_where_nothing_forces_another(monkeypatch):
    steps = [
        WriteHostFile(path=f"etc/f{i}", content="x") if i % 2 else SetMapping(id=f"m{i}", map=[], create=True)
        for i in range(6)
    ]
    assert undo_order(pending(steps)) == [5, 4, 3, 2, 1, 0]
    # two undos of one resource run newest first, even when the newer waits for an older step
    # and the other one could run at once
    monkeypatch.setattr(SetMapping, "undo_needs", lambda self: {Resource("file", "etc/f")})
    newer, older = SetMapping(id="m", map=[], create=True), DeleteMapping(id="m")
    oldest = WriteHostFile(path="etc/f", content="x")
    assert undo_order([(2, newer), (1, older), (0, oldest)]) == [0, 2, 1]


@pytest.mark.parametrize("shape", [reverse_steps, split_steps], ids=["reverse", "split"])
def test_every_need_is_met_whatever_was_begun_or_undone_already(shape):
    """Whichever steps began (a failure at any step) and whichever undos an earlier process
    completed (a recover after a crash in the rollback), every undo runs after each pending undo
    that restores what it needs, and the order is the same every time it is computed."""
    steps = shape()
    rng = random.Random(25)
    for failed_at in range(len(steps)):
        begun = list(range(failed_at + 1))
        for _ in range(20):
            done = set(rng.sample(begun, rng.randint(0, len(begun) - 1)))
            todo = [n for n in begun if n not in done]
            order = undo_order(pending(steps, todo))
            assert sorted(order) == todo
            assert unmet(order, steps, set(todo)) == [], (failed_at, sorted(done))
            assert undo_order(pending(steps, todo)) == order


def test_every_kind_declares_resources_and_no_two_kinds_need_each_other():
    """Needs that formed a cycle would leave no order to undo in: a plan holding each kind twice,
    in every order of kinds, still has one."""
    steps = split_steps() + reverse_steps()
    kinds = {type(a) for a in steps}
    assert kinds == set(action_kinds().values()), "a kind without a step here"
    for a in steps:
        assert all(isinstance(r, Resource) for r in a.undo_restores() | a.undo_needs()), a.kind
    rng = random.Random(25)
    for _ in range(20):
        shuffled = rng.sample(steps, len(steps))
        order = undo_order(pending(shuffled))
        assert sorted(order) == list(range(len(steps)))
        assert unmet(order, shuffled, set(order)) == []


def test_needs_that_form_a_cycle_are_named(monkeypatch):
    a = WriteHostFile(path="etc/chicken", content="x")
    b = SetMapping(id="egg", map=[], create=True)
    assert undo_order([(1, b), (0, a)]) == [1, 0]
    monkeypatch.setattr(WriteHostFile, "undo_needs", lambda self: {Resource("mapping", "egg")})
    assert undo_order([(1, b), (0, a)]) == [1, 0]
    monkeypatch.setattr(SetMapping, "undo_needs", lambda self: {Resource("file", "etc/chicken")})
    with pytest.raises(ValueError, match=r"^the undo steps 1, 2 need each other$"):
        undo_order([(1, b), (0, a)])
