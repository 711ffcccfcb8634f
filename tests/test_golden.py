"""Golden files: plan text and rendered files per scenario, on fixture hosts.

On a mismatch the test shows GOT and WANT; ``GPUTOPO_UPDATE_GOLDEN=1`` rewrites the files.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gputopo.facts.discover import discover
from gputopo.errors import PlanRefused
from gputopo.model.state import ContainerState, CurrentState, MappingState, ServiceState
from gputopo.plan.planner import expected_after, plan
from gputopo.formats.devn import format_dev
from gputopo.plan.mappings import map_entry
from gputopo.formats.lxcconf import validate_lxc_conf
from gputopo.formats.pcicfg import validate_pci_cfg
from gputopo.plan.render import render
from gputopo.plan.spec import parse_spec
from gputopo.plan.starter import spec_from_split
from test_plan import SEED_CMD, SEED_SPEC

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("GPUTOPO_UPDATE_GOLDEN") == "1"


@pytest.fixture(scope="module")
def hosts(materialized):
    """Fixture host name -> discovered Facts (the shared materialised roots, read-only)."""
    cache: dict[str, object] = {}

    def get(name: str):
        if name not in cache:
            cache[name] = discover(materialized(name))
        return cache[name]

    return get


def check(scenario: str, name: str, got: str) -> None:
    path = GOLDEN / scenario / name
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(got)
        return
    if not path.is_file():
        pytest.fail(f"missing golden file {path} (run with GPUTOPO_UPDATE_GOLDEN=1)\nGOT:\n{got}")
    want = path.read_text()
    if got != want:
        pytest.fail(f"{scenario}/{name} differs\n--- GOT ---\n{got}--- WANT ---\n{want}")


def check_all(scenario: str, p, spec, facts) -> None:
    check(scenario, "plan.txt", p.to_text())
    files = render(p, spec, facts)
    for rel, text in files.items():
        if rel.startswith("pve/lxc/"):
            assert validate_lxc_conf(text, allow_description=False) == [], rel
        if rel == "pve/mapping/pci.cfg":
            assert validate_pci_cfg(text) == [], rel
        check(scenario, f"files/{rel}", text)
    listed = sorted(str(q.relative_to(GOLDEN / scenario / "files")) for q in (GOLDEN / scenario / "files").rglob("*")
                    if q.is_file()) if (GOLDEN / scenario / "files").is_dir() else []
    if not UPDATE:
        assert listed == sorted(files), "rendered file set differs from the golden one"


def seed_current(facts) -> CurrentState:
    """Container 101 with all eight GPUs, sglang at --tp 8, one mapping pro6000 of all eight."""
    cfg = {"arch": "amd64", "hostname": "infer", "digest": "0" * 40}
    paths = [f"/dev/nvidia{g.minor}" for g in facts.gpus] + [
        "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset",
        "/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-caps/nvidia-cap2"]
    cfg.update({f"dev{i}": format_dev(p, None, "0666") for i, p in enumerate(paths)})
    return CurrentState(
        containers={101: ContainerState(config=cfg, status="running", service=ServiceState(
            unit="sglang.service", active=True, exec_start=SEED_CMD, tp=8))},
        mappings={"pro6000": MappingState(map=[map_entry(g, "pve1") for g in facts.gpus],
                                          description="RTX PRO 6000", digest="1" * 40)},
    )


def test_seed_numa_split(hosts):
    facts = hosts("seed")
    spec = parse_spec(SEED_SPEC)
    check_all("seed-numa-split", plan(facts, spec, seed_current(facts)), spec, facts)


def test_seed_converged_no_changes(hosts):
    facts = hosts("seed")
    spec = parse_spec(SEED_SPEC)
    cur = seed_current(facts)
    f2, c2 = expected_after(plan(facts, spec, cur), facts, cur)
    p = plan(f2, spec, c2)
    assert p.actions == []
    check_all("seed-converged", p, spec, f2)


def test_esc8000a_audio_functions(hosts):
    facts = hosts("esc8000a")
    spec = spec_from_split(facts, container=101, vm_mapping="ada-vm", container_mapping="ada")
    check_all("esc8000a-audio", plan(facts, spec, CurrentState()), spec, facts)


def node_spec(facts, body: str):
    """A spec for the one node of ``facts``; ``body`` is the node's YAML below its name."""
    return parse_spec(f"apiVersion: gputopo/v1\nkind: GpuTopology\nnodes:\n  - name: {facts.host.hostname}\n{body}")


def test_shared_group_refused(hosts):
    facts = hosts("shared-group")
    spec = node_spec(facts, """\
    vms:
      mappings:
        - name: vm-gpus
          gpus: rest
""")
    with pytest.raises(PlanRefused) as e:
        plan(facts, spec, CurrentState())
    check("shared-group-refused", "plan.txt", "".join(f"refused: {r}\n" for r in e.value.refusals))
    assert any(r.code == "shared-group" for r in e.value.refusals)


def test_numa_unknown(hosts):
    facts = hosts("numa-unknown")
    spec = node_spec(facts, """\
    containers:
      - vmid: 101
        gpus: {numa: [0]}
    vms:
      mappings:
        - name: vm-gpus
          gpus: {numa: [1]}
""")
    p = plan(facts, spec, CurrentState())
    assert sum("NUMA node unknown" in w for w in p.warnings) == 2
    check_all("numa-unknown", p, spec, facts)
