"""HA placement written by a node's own apply (its plan's ``ha_placement`` step) on a simulated
PVE 8 cluster: rolled back with the node's other steps, undone by ``gputopo recover`` after a
crash inside the step, left alone with ``--no-ha``, and a plan holding only that step applied.

The cluster: pve1 and pve2 give NUMA 1 to the VM mapping ``pro6000-vm`` that VMs 201-203 use,
pve3 keeps its GPUs. Once pve1 applied, pve2's apply is the one whose lines let the VMs run on
two nodes: its HA step makes a restricted group per VM and puts the VM in it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gputopo.adapters.clusterapi import ClusterApi
from gputopo.adapters.credentials import ApiConfig
from gputopo.adapters.proxmox import ProxmoxClient
from gputopo.apply.journal import list_journals, parse_journal
from gputopo.plan.spec import parse_spec
from gputopo.ports import Ports
from gputopo.sim.cluster import SimCluster
from gputopo.sim.pveapi import PveApiServer, PveshSim
from gputopo.usecases.apply import apply
from helpers.clusterharness import cleanup, copy_cluster, make_template, spec_text

pytestmark = pytest.mark.slow  # simulated clusters and node applies (seconds each)

TESTS = Path(__file__).resolve().parents[1]
DRIVER = TESTS / "helpers" / "crashdriver.py"
HA_FILES = ("groups.cfg", "resources.cfg", "rules.cfg")


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gputopo", *args], capture_output=True, text=True, timeout=600, env=env
    )


def ha_files(cluster: SimCluster) -> dict[str, str]:
    """The HA manager's files of the shared /etc/pve, as they are on disk ('' when absent: once
    written, a file whose last section was deleted stays, empty, as Proxmox writes it whole)."""
    out = {}
    for name in HA_FILES:
        p = cluster.dir / "pve" / "ha" / name
        out[name] = p.read_text() if p.exists() else ""
    return out


@pytest.fixture(scope="module")
def pve1_applied():
    """A PVE 8 cluster where pve1 applied the split (``container_restart: always``), and the spec."""
    d = make_template()
    cluster = SimCluster(d)
    spec = d.parent / "spec.yaml"
    spec.write_text(spec_text(cluster, split=["pve1", "pve2"], whole=["pve3"], restart=True))
    res = cli(
        "cluster", "apply", "--yes", "--no-verify", "--nodes", "pve1", "--sim", str(d), "--spec", str(spec)
    )
    assert res.returncode == 0, res.stderr
    yield d, spec
    cleanup(d.parent)


@pytest.fixture
def after_pve1(pve1_applied, tmp_path):
    source, spec = pve1_applied
    c = copy_cluster(source, tmp_path / "cluster")
    yield c, spec
    c.stop()


def node_apply(cluster: SimCluster, node: str, spec: Path, *extra: str) -> subprocess.CompletedProcess:
    """The node's own ``gputopo apply``, as its shell runs it (``--sim`` its directory)."""
    return cli(
        "apply",
        "--spec",
        str(spec),
        "--yes",
        "--json",
        "--no-verify",
        "--sim",
        str(cluster.node_dir(node)),
        *extra,
    )


def journal(cluster: SimCluster, node: str) -> list:
    return parse_journal(list_journals(cluster.node_dir(node) / "root")[-1].read_text())


def test_a_node_whose_apply_fails_after_its_ha_step_puts_the_ha_placement_back(after_pve1, tmp_path):
    cluster, spec = after_pve1
    # pve2's VM 202 takes 4 of its mapping's GPUs and should run; its start, the step after the
    # HA step, fails
    text = spec.read_text()
    head, sep, tail = text.partition("  - name: pve2\n")
    node, _, rest = tail.partition("  - name: pve3\n")
    assert node.endswith("description: GPUs for VM passthrough\n"), node
    node += "      consumers:\n        - {vmid: 202, mapping: pro6000-vm, gpus: 4, start: true}\n"
    started = tmp_path / "spec.yaml"
    started.write_text(head + sep + node + "  - name: pve3\n" + rest)
    # VM 202 is no HA resource here (its start is its own qmstart task, not the HA manager's)
    resources = cluster.dir / "pve" / "ha" / "resources.cfg"
    kept = [s for s in resources.read_text().split("\n\n") if s.strip() and not s.startswith("vm: 202\n")]
    resources.write_text("\n\n".join(kept) + "\n\n")
    pve2 = cluster.member("pve2")
    PveApiServer(pve2.paths.pve, pve2.paths.run, pve2.paths.root, "pve2").inject_fault(
        "qmstart", 202, "start failed: QEMU exited with code 1"
    )
    before = ha_files(cluster)
    res = node_apply(cluster, "pve2", started)
    assert res.returncode == 1, res.stderr
    assert "rolled back" in res.stderr and "QEMU exited with code 1" in res.stderr
    records = journal(cluster, "pve2")
    (begin,) = [r for r in records if r.type == "begin" and r.action.kind == "ha_placement"]
    assert begin.action.changes, "the HA step planned no change: the test would prove nothing"
    assert records[-1].type == "end"
    # the step was done before the VM's start failed, and its undo put back what it had written
    assert any(r.type == "done" and r.step == begin.step for r in records)
    assert any(r.type == "begin" and r.action.kind == "start_guest" and r.step > begin.step for r in records)
    (undone,) = [r for r in records if r.type == "undo-done" and r.step == begin.step]
    assert undone.what.startswith("restored HA placement: take HA resource vm:201 out of its group;")
    assert "delete HA group gputopo-vm201" in undone.what
    assert ha_files(cluster) == before


def test_a_crash_inside_the_ha_step_is_undone_by_recover(after_pve1, tmp_path):
    cluster, spec = after_pve1
    # a clean run on a copy: how many changing calls were made when the HA step began
    trace_copy = copy_cluster(cluster.dir, tmp_path / "trace")
    count = tmp_path / "count.json"
    args = ["apply", "--spec", str(spec), "--yes", "--no-verify"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "GPUTOPO_CRASH_COUNT": str(count)}
    run = subprocess.run(
        [sys.executable, str(DRIVER), *args, "--sim", str(trace_copy.node_dir("pve2"))],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr
    records = journal(trace_copy, "pve2")
    n = next(i for i, r in enumerate(records, 1) if r.type == "begin" and r.action.kind == "ha_placement")
    calls = next(c for what, r, c in json.loads(count.read_text())["trace"] if what == "begin" and r == n)

    before = ha_files(cluster)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "GPUTOPO_CRASH_AT": f"call:{calls + 1}"}
    crashed = subprocess.run(
        [sys.executable, str(DRIVER), *args, "--sim", str(cluster.node_dir("pve2"))],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert crashed.returncode == -9, crashed.stderr
    # killed right after the step's first write: a group is there, its VM not yet in it
    mid = ha_files(cluster)
    assert mid["groups.cfg"] and "group: gputopo-vm201\n" in mid["groups.cfg"]
    assert mid["resources.cfg"] == before["resources.cfg"]
    res = cli("recover", "--sim", str(cluster.node_dir("pve2")))
    assert res.returncode == 0, res.stderr
    assert ha_files(cluster) == before
    assert journal(cluster, "pve2")[-1].type == "end"


def test_no_ha_leaves_ha_alone_and_a_plan_of_only_the_ha_step_is_applied(after_pve1):
    cluster, spec = after_pve1
    before = ha_files(cluster)
    res = node_apply(cluster, "pve2", spec, "--no-ha")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["status"] == "applied"
    assert not [s for s in doc["steps"] if "HA placement" in s["description"]]
    assert ha_files(cluster) == before
    # pve1 and pve2 now differ only in their HA placement: each one's plan holds only that step
    diff = cli(
        "cluster",
        "diff",
        "--exit-code",
        "--nodes",
        "pve1,pve2",
        "--sim",
        str(cluster.dir),
        "--spec",
        str(spec),
    )
    assert diff.returncode == 2, diff.stdout
    assert diff.stdout.count("== ha placement") == 2
    for node in ("pve1", "pve2"):
        plan = cli("plan", "--json", "--spec", str(spec), "--sim", str(cluster.node_dir(node)))
        assert [a["kind"] for a in json.loads(plan.stdout)["actions"]] == ["ha_placement"], node
    again = node_apply(cluster, "pve2", spec)
    assert again.returncode == 0, again.stderr
    doc = json.loads(again.stdout)
    assert doc["status"] == "applied" and len(doc["steps"]) == 1
    groups = ha_files(cluster)["groups.cfg"]
    for vmid in (201, 202, 203):
        assert f"group: gputopo-vm{vmid}\n" in groups
    assert "\tgroup gputopo-vm202\n" in ha_files(cluster)["resources.cfg"]
    diff = cli(
        "cluster",
        "diff",
        "--exit-code",
        "--nodes",
        "pve1,pve2",
        "--sim",
        str(cluster.dir),
        "--spec",
        str(spec),
    )
    assert diff.returncode == 0, diff.stdout


def test_the_ha_step_reads_and_writes_through_pvesh_on_the_node(after_pve1):
    """``--local``: the HA reads and writes are ``pvesh`` commands on the node, as every other call."""
    cluster, spec = after_pve1
    host = cluster.start("pve2")
    sim_ports = host.ports()
    pvesh = PveshSim(host.api)
    client = ProxmoxClient.from_config(ApiConfig(backend="local", node="pve2", timeout=30), runner=pvesh)
    ports = Ports(
        sysfs=sim_ports.sysfs,
        proxmox=client,
        exec=sim_ports.exec,
        files=sim_ports.files,
        http=sim_ports.http,
        cluster=ClusterApi(client),
    )
    res = apply(parse_spec(spec.read_text()), ports, root=str(host.paths.root), node="pve2")
    assert res.status == "applied"
    assert "group: gputopo-vm201\n" in ha_files(cluster)["groups.cfg"]
    made = [c for c in pvesh.calls if c[1] == "create" and c[2].strip("/") == "cluster/ha/groups"]
    assert len(made) == 3, pvesh.calls
    # the other nodes' VMs were read through pvesh too (pveproxy hands their paths to them)
    assert [c for c in pvesh.calls if c[1] == "get" and c[2].strip("/") == "nodes/pve1/qemu"]


def test_a_login_that_may_not_change_ha_leaves_it_with_a_warning(after_pve1):
    """ops@pve may read the HA configuration (Sys.Audit) but not change it (no Sys.Console): the
    node's apply goes on, its HA step says what it could not write."""
    cluster, spec = after_pve1
    assert node_apply(cluster, "pve2", spec, "--no-ha").returncode == 0
    before = ha_files(cluster)
    host = cluster.start("pve2")
    root_ports = host.ports()
    cfg = ApiConfig(
        backend="https",
        host="127.0.0.1",
        port=host.api.port,
        node="pve2",
        user=host.api.operator_user,
        token_name=host.api.operator_token_id.split("!")[1],
        verify_ssl=bool(host.api.ca_cert_path),
        ca_bundle=str(host.api.ca_cert_path) if host.api.ca_cert_path else None,
        timeout=30.0,
    )
    ops = ProxmoxClient.from_config(cfg, env={"GPUTOPO_PVE_TOKEN_SECRET": host.api.operator_token_secret})
    ports = dataclasses.replace(root_ports, proxmox=ops, cluster=ClusterApi(ops))
    res = apply(parse_spec(spec.read_text()), ports, root=str(host.paths.root), node="pve2")
    assert res.status == "applied"
    (step,) = res.steps
    assert step.warnings and step.warnings[0].startswith("HA placement not written: Permission check failed")
    assert ha_files(cluster) == before
