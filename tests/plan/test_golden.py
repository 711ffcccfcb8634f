"""Golden files: per scenario on a fixture host, the plan as text (``plan.txt``) and as JSON
(``plan.json``: every field of every action) and the rendered files (``files/...``).

A scenario's directory holds exactly what it produces: a file that differs, is missing or is no
longer produced fails the test, with GOT and WANT. ``GPUTOPO_UPDATE_GOLDEN=1`` rewrites the files,
deletes those no scenario produces any more, and then FAILS, so an update is never mistaken for a
pass: review ``git diff tests/golden``, then run again without it. Where ``CI`` is set the update
is refused and nothing runs: CI only compares.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from gputopo.errors import PlanRefused
from gputopo.facts.discover import discover
from gputopo.formats.devn import format_dev
from gputopo.formats.lxcrules import validate_lxc_conf
from gputopo.formats.pcicfg import validate_pci_cfg
from gputopo.formats.qemuconf import QemuConf, validate_qemu_conf, write_qemu_conf
from gputopo.model.facts import Facts
from gputopo.model.state import ContainerState, CurrentState, GuestState, MappingState, ServiceState
from gputopo.plan.mappings import map_entry
from gputopo.plan.planner import expected_after, plan
from gputopo.plan.render import render
from gputopo.plan.spec import parse_spec
from gputopo.plan.starter import spec_from_split
from helpers import TESTS
from helpers.hosts import SEED_CMD, SEED_SPEC

GOLDEN = TESTS / "golden"
UPDATE = os.environ.get("GPUTOPO_UPDATE_GOLDEN") == "1"
if UPDATE and "CI" in os.environ:
    pytest.fail(
        "GPUTOPO_UPDATE_GOLDEN=1 is refused where CI is set: CI compares golden files, it never writes them",
        pytrace=False,
    )

# scenario name -> function of the hosts fixture returning {path under golden/<name>: text}
SCENARIOS: dict[str, Callable[..., dict[str, str]]] = {}


def scenario(name: str):
    def register(f: Callable[..., dict[str, str]]) -> Callable[..., dict[str, str]]:
        SCENARIOS[name] = f
        return f

    return register


@pytest.fixture(scope="module")
def hosts(materialized):
    """Fixture host name -> discovered Facts (the shared materialised roots, read-only)."""
    cache: dict[str, object] = {}

    def get(name: str):
        if name not in cache:
            cache[name] = discover(materialized(name))
        return cache[name]

    return get


def planned(p, spec, facts) -> dict[str, str]:
    """The golden files of a plan: its text, its JSON and the files it renders (each checked
    against Proxmox's parser rules first)."""
    out = {"plan.txt": p.to_text(), "plan.json": p.model_dump_json(indent=2) + "\n"}
    for rel, text in render(p, spec, facts).items():
        if rel.startswith("pve/lxc/"):
            assert validate_lxc_conf(text, allow_description=False) == [], rel
        if rel == "pve/mapping/pci.cfg":
            assert validate_pci_cfg(text) == [], rel
        if rel.startswith("pve/qemu-server/"):
            assert validate_qemu_conf(text, allow_description=False, at_start=False) == [], rel
        out[f"files/{rel}"] = text
    return out


def on_disk(d: Path) -> dict[str, str]:
    return {p.relative_to(d).as_posix(): p.read_text() for p in sorted(d.rglob("*")) if p.is_file()}


def rewrite(d: Path, produced: dict[str, str]) -> list[str]:
    """Make ``d`` hold exactly ``produced``; returns what changed ("wrote X", "deleted Y")."""
    before = on_disk(d) if d.is_dir() else {}
    changes = []
    for rel in sorted(before.keys() - produced.keys()):
        (d / rel).unlink()
        changes.append(f"deleted {rel}")
    for sub in sorted((p for p in d.rglob("*") if p.is_dir()), reverse=True) if d.is_dir() else []:
        if not any(sub.iterdir()):
            sub.rmdir()
    for rel, text in sorted(produced.items()):
        if before.get(rel) != text:
            (d / rel).parent.mkdir(parents=True, exist_ok=True)
            (d / rel).write_text(text)
            changes.append(f"wrote {rel}")
    return changes


def compare(d: Path, produced: dict[str, str]) -> list[str]:
    """Every way ``d`` differs from ``produced``, GOT and WANT shown."""
    want = on_disk(d) if d.is_dir() else {}
    problems = [
        f"{rel}: no scenario output produces it any more" for rel in sorted(want.keys() - produced.keys())
    ]
    for rel, got in sorted(produced.items()):
        if rel not in want:
            problems.append(f"{rel}: missing golden file\n--- GOT ---\n{got}")
        elif got != want[rel]:
            problems.append(f"{rel} differs\n--- GOT ---\n{got}--- WANT ---\n{want[rel]}")
    return problems


# --- scenarios ------------------------------------------------------------------------------------


def seed_current(facts) -> CurrentState:
    """Container 101 with all eight GPUs, sglang at --tp 8, one mapping pro6000 of all eight."""
    cfg = {"arch": "amd64", "hostname": "infer", "digest": "0" * 40}
    paths = [f"/dev/nvidia{g.minor}" for g in facts.gpus] + [
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
        "/dev/nvidia-modeset",
        "/dev/nvidia-caps/nvidia-cap1",
        "/dev/nvidia-caps/nvidia-cap2",
    ]
    cfg.update({f"dev{i}": format_dev(p, None, "0666") for i, p in enumerate(paths)})
    return CurrentState(
        containers={
            101: ContainerState(
                config=cfg,
                status="running",
                service=ServiceState(unit="sglang.service", active=True, exec_start=SEED_CMD, tp=8),
            )
        },
        mappings={
            "pro6000": MappingState(
                map=[map_entry(g, "pve1") for g in facts.gpus], description="RTX PRO 6000", digest="1" * 40
            )
        },
    )


def node_spec(facts, body: str):
    """A spec for the one node of ``facts``; ``body`` is the node's YAML below its name."""
    return parse_spec(
        f"apiVersion: gputopo/v1\nkind: GpuTopology\nnodes:\n  - name: {facts.host.hostname}\n{body}"
    )


@scenario("seed-numa-split")
def seed_numa_split(hosts):
    facts = hosts("seed")
    spec = parse_spec(SEED_SPEC)
    return planned(plan(facts, spec, seed_current(facts)), spec, facts)


@scenario("seed-converged")
def seed_converged(hosts):
    facts = hosts("seed")
    spec = parse_spec(SEED_SPEC)
    cur = seed_current(facts)
    f2, c2 = expected_after(plan(facts, spec, cur), facts, cur)
    p = plan(f2, spec, c2)
    assert p.actions == []
    return planned(p, spec, f2)


@scenario("esc8000a-audio")
def esc8000a_audio_functions(hosts):
    facts = hosts("esc8000a")
    spec = spec_from_split(facts, container=101, vm_mapping="ada-vm", container_mapping="ada")
    return planned(plan(facts, spec, CurrentState()), spec, facts)


@scenario("shared-group-refused")
def shared_group_refused(hosts):
    # a refused plan has no Plan to dump: its refusals are the golden text
    facts = hosts("shared-group")
    spec = node_spec(
        facts,
        """\
    vms:
      mappings:
        - name: vm-gpus
          gpus: rest
""",
    )
    with pytest.raises(PlanRefused) as e:
        plan(facts, spec, CurrentState())
    assert any(r.code == "shared-group" for r in e.value.refusals)
    return {"plan.txt": "".join(f"refused: {r}\n" for r in e.value.refusals)}


@scenario("numa-unknown")
def numa_unknown(hosts):
    facts = hosts("numa-unknown")
    spec = node_spec(
        facts,
        """\
    containers:
      - vmid: 101
        gpus: {numa: [0]}
    vms:
      mappings:
        - name: vm-gpus
          gpus: {numa: [1]}
""",
    )
    p = plan(facts, spec, CurrentState())
    assert sum("NUMA node unknown" in w for w in p.warnings) == 2
    return planned(p, spec, facts)


# --- VMs as consumers of a mapping ----------------------------------------------------------------

VM_201 = {
    "agent": "1",
    "bios": "ovmf",
    "boot": "order=scsi0",
    "cores": "32",
    "cpu": "host",
    "efidisk0": "local-lvm:vm-201-disk-1,efitype=4m,pre-enrolled-keys=1,size=4M",
    "hostpci0": "mapping=pro6000-vm,pcie=1",
    "hostpci1": "0000:22:00.0",
    "machine": "q35",
    "memory": "131072",
    "name": "gpu-vm",
    "numa": "1",
    "ostype": "l26",
    "scsi0": "local-lvm:vm-201-disk-0,iothread=1,size=100G",
    "scsihw": "virtio-scsi-single",
    "sockets": "1",
}
CONSUMER = """      consumers:
        - vmid: 201
          mapping: pro6000-vm
          hugepages: 1024
          when_gpus_leave: remove
          start: true
"""


def vm_current(facts, status: str = "stopped") -> CurrentState:
    cur = seed_current(facts)
    cur.guests[201] = GuestState(
        status=status, config={**VM_201, "digest": "2" * 40}, hostpci=[VM_201["hostpci0"], VM_201["hostpci1"]]
    )
    return cur


def whole_vm_config(p, facts, cur, vmid: int = 201) -> dict[str, str]:
    """The VM's whole config once ``p`` is applied, written as qemu-server writes it, checked
    with everything qemu-server would refuse (at the VM's start too)."""
    _, after = expected_after(p, facts, cur)
    text = write_qemu_conf(
        QemuConf(options={k: str(v) for k, v in after.guests[vmid].config.items() if k != "digest"})
    )
    assert validate_qemu_conf(text) == [], text
    return {f"after/pve/qemu-server/{vmid}.conf": text}


@scenario("seed-vm-consumer")
def seed_vm_consumer(hosts):
    facts = hosts("seed")
    spec = parse_spec(SEED_SPEC + CONSUMER)
    cur = vm_current(facts)
    p = plan(facts, spec, cur)
    return {**planned(p, spec, facts), **whole_vm_config(p, facts, cur)}


@scenario("seed-vm-reverse")
def seed_vm_reverse(hosts):
    # the split applied with VM 201 running on its four GPUs, then every GPU back to the container
    facts = hosts("seed")
    split = parse_spec(SEED_SPEC + CONSUMER)
    cur = vm_current(facts, status="running")
    f2, c2 = expected_after(plan(facts, split, cur), facts, cur)
    back = parse_spec(
        SEED_SPEC.replace("{numa: [0]}", "{numa: [0, 1]}").replace("{numa: [1]}", "rest") + CONSUMER
    )
    p = plan(f2, back, c2)
    return {**planned(p, back, f2), **whole_vm_config(p, f2, c2)}


@scenario("seed-vm-refused")
def seed_vm_refused(hosts):
    facts = hosts("seed")
    cur = vm_current(facts)
    cur.guests[202] = GuestState(config={**VM_201, "bios": "seabios", "machine": "pc-i440fx-9.0"})
    cur.guests[203] = GuestState(config={**VM_201, "args": "-smbios 'type=0"})
    consumers = "".join(
        f"        - {{vmid: {v}, mapping: pro6000-vm, gpus: {n}}}\n"
        for v, n in ((202, 1), (203, 4), (204, 1), (201, 5))
    )
    spec = parse_spec(SEED_SPEC + "      consumers:\n" + consumers)
    with pytest.raises(PlanRefused) as e:
        plan(facts, spec, cur)
    return {"plan.txt": "".join(f"refused: {r}\n" for r in e.value.refusals)}


@scenario("facts")
def facts_json(hosts):
    # discover --json and gputopo schema facts: the facts are records whose JSON is written
    # without pydantic, their schema pydantic's (tests/model/test_records.py checks the two agree)
    facts = hosts("seed").model_copy(deep=True)
    facts.root = "/"
    return {
        "seed.json": facts.to_json() + "\n",
        "schema.json": json.dumps(Facts.model_json_schema(by_alias=True), indent=2) + "\n",
    }


# --- the tests ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_golden(hosts, name):
    d = GOLDEN / name
    produced = SCENARIOS[name](hosts)
    if UPDATE:
        changes = rewrite(d, produced)
        pytest.fail(
            f"GPUTOPO_UPDATE_GOLDEN=1: golden/{name}: {'; '.join(changes) or 'unchanged'}; review "
            "the diff, then run again without it",
            pytrace=False,
        )
    problems = compare(d, produced)
    if problems:
        pytest.fail(
            f"golden/{name} (GPUTOPO_UPDATE_GOLDEN=1 rewrites it):\n" + "\n".join(problems), pytrace=False
        )


def test_every_golden_directory_has_a_scenario():
    stale = sorted(p.name for p in GOLDEN.iterdir() if p.name not in SCENARIOS)
    if UPDATE:
        for name in stale:
            shutil.rmtree(GOLDEN / name) if (GOLDEN / name).is_dir() else (GOLDEN / name).unlink()
        if stale:
            pytest.fail(f"GPUTOPO_UPDATE_GOLDEN=1: deleted golden/{', golden/'.join(stale)}", pytrace=False)
    assert stale == [], "golden output no scenario produces (GPUTOPO_UPDATE_GOLDEN=1 deletes it)"
