"""The spec's VM entries (``vms.consumers``): strict, with errors that name the field; a spec
without them is what it was."""

from __future__ import annotations

import pytest

from gputopo.errors import SpecError
from gputopo.plan.spec import Spec, parse_spec
from helpers.hosts import SPLIT_SPEC as HEAD  # the seed split without VM entries


def consumers(*entries: str) -> str:
    return HEAD + "      consumers:\n" + "".join(f"        - {e}\n" for e in entries)


def test_defaults_and_proxmox_spellings():
    spec = parse_spec(consumers("{vmid: 201, mapping: pro6000-vm, x-vga: true, hugepages: 1024}"))
    (c,) = spec.nodes[0].vms.consumers
    assert (c.gpus, c.pcie, c.x_vga, c.rombar, c.affinity, c.numa, c.hugepages) == (
        None,
        True,
        True,
        True,
        True,
        True,
        "1024",
    )
    assert (c.when_gpus_leave, c.repoint_to, c.start, c.verify_guest, c.mmio64_mb) == (
        "refuse",
        None,
        False,
        False,
        None,
    )
    assert (
        parse_spec(HEAD).nodes[0].vms.consumers == []
        and parse_spec(HEAD).nodes[0].vms.other_mappings == "keep"
    )


@pytest.mark.parametrize(
    "entries, path, needle",
    [
        (["{vmid: 201, mapping: pro6000-vm, pci: 1}"], "nodes[0].vms.consumers[0].pci", "unknown key"),
        (
            ["{vmid: 20, mapping: pro6000-vm}"],
            "nodes[0].vms.consumers[0].vmid",
            "greater than or equal to 100",
        ),
        (["{vmid: 201, mapping: 9vm}"], "nodes[0].vms.consumers[0].mapping", "should match pattern"),
        (
            ["{vmid: 201, mapping: pro6000-vm, gpus: 17}"],
            "nodes[0].vms.consumers[0].gpus",
            "less than or equal to 16",
        ),
        (
            ["{vmid: 201, mapping: pro6000-vm, hugepages: 4}"],
            "nodes[0].vms.consumers[0].hugepages",
            "'2', '1024' or 'any'",
        ),
        (
            ["{vmid: 201, mapping: pro6000-vm, when_gpus_leave: repoint}"],
            "nodes[0].vms.consumers[0].repoint_to",
            "a mapping is required with when_gpus_leave: repoint",
        ),
        (
            ["{vmid: 201, mapping: pro6000-vm, repoint_to: other}"],
            "nodes[0].vms.consumers[0].repoint_to",
            "only used with when_gpus_leave: repoint",
        ),
        (
            ["{vmid: 201, mapping: pro6000-vm, when_gpus_leave: repoint, repoint_to: PRO6000-vm}"],
            "nodes[0].vms.consumers[0].repoint_to",
            "is the VM's own mapping",
        ),
        (
            ["{vmid: 201, mapping: pro6000-vm}", "{vmid: 201, mapping: pro6000-vm}"],
            "nodes[0].vms.consumers[1].vmid",
            "VM 201 is listed twice",
        ),
        (
            ["{vmid: 101, mapping: pro6000-vm}"],
            "nodes[0].vms.consumers[0].vmid",
            "101 is a container of this node",
        ),
    ],
)
def test_errors_name_the_field(entries, path, needle):
    with pytest.raises(SpecError) as e:
        parse_spec(consumers(*entries))
    assert e.value.exit_code == 2
    assert f": {path}: " in str(e.value) and needle in str(e.value), str(e.value)


def test_other_mappings_is_keep_or_shrink():
    assert parse_spec(HEAD + "      other_mappings: shrink\n").nodes[0].vms.other_mappings == "shrink"
    with pytest.raises(SpecError) as e:
        parse_spec(HEAD + "      other_mappings: delete\n")
    assert "nodes[0].vms.other_mappings" in str(e.value)


def test_schema_documents_the_vm_entries():
    schema = Spec.model_json_schema()
    props = schema["$defs"]["VmConsumer"]["properties"]
    assert {
        "vmid",
        "mapping",
        "gpus",
        "pcie",
        "x-vga",
        "rombar",
        "affinity",
        "numa",
        "hugepages",
        "mmio64_mb",
        "when_gpus_leave",
        "repoint_to",
        "start",
        "verify_guest",
    } == set(props)


@pytest.mark.slow
def test_init_writes_a_consumer_for_vm(materialized, capsys):
    from gputopo.cli import main

    assert main(["init", "--root", str(materialized("seed")), "--vm", "201"]) is None
    spec = parse_spec(capsys.readouterr().out)
    (c,) = spec.nodes[0].vms.consumers
    assert (c.vmid, c.mapping, c.when_gpus_leave, c.start, c.verify_guest) == (
        201,
        "pro6000-vm",
        "remove",
        True,
        True,
    )
    assert main(["init", "--root", str(materialized("seed"))]) is None
    assert parse_spec(capsys.readouterr().out).nodes[0].vms.consumers == []
