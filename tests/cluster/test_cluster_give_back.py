"""The give-back after a split on a simulated cluster (its nodes' shells run here): a spec giving
every GPU back to the containers that says nothing of the VM mapping is refused on each node
that would leave pro6000-vm listing its container's GPUs while a VM there names it (verify fails
on that), exit 2 with one line per node, nothing changed anywhere; and a node whose VM names a
mapping without a device on it is told so, not that the mapping is gone."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers.applysim import diff, fingerprint
from helpers.clusterharness import cluster, spec_text, template  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow  # a simulated cluster per test (seconds each); the full run only

GIVE_BACK = """\
apiVersion: gputopo/v1
kind: GpuTopology
nodes:
{nodes}
"""
NODE = """\
  - name: {name}
    containers:
      - vmid: {ct}
        gpus: {{count: 8}}
        service: {{unit: sglang.service}}
"""


def refusal(node: str, ct: int, vm: int) -> str:
    return (
        f"mapping pro6000-vm would still list GPU(s) of {node} that a container gets (0000:81:00.0, "
        f"0000:91:00.0, 0000:e1:00.0, 0000:f1:00.0 to container {ct}) while VM {vm} (hostpci0, stopped) uses "
        f"it: verify fails on it, as Proxmox could give the VM one of them at its start; list it under "
        f"vms.mappings of {node} with the GPUs it keeps (gpus: {{addresses: []}} for none), or remove the mapping"
    )


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gputopo", *args], capture_output=True, text=True, timeout=900
    )


def test_a_cluster_give_back_that_verify_would_fail_is_refused_on_each_node_and_changes_nothing(
    cluster, tmp_path
):
    split = tmp_path / "split.yaml"
    split.write_text(spec_text(cluster, split=["pve1", "pve2"], whole=["pve3"]))
    first = cli("cluster", "plan", "--sim", str(cluster.dir), "--spec", str(split))
    assert first.returncode == 0, first.stderr
    # pve3 keeps its GPUs; VM 203 there names pro6000-vm, which pve1 and pve2 are creating
    assert (
        "VM 203 (stopped) cannot start on pve3: its hostpci0 names mapping pro6000-vm, which has no device on "
        "pve3 after the plan; Proxmox refuses its start here (PCI device mapping not found)" in first.stdout
    )
    assert "does not exist" not in first.stdout
    res = cli("cluster", "apply", "--yes", "--no-verify", "--sim", str(cluster.dir), "--spec", str(split))
    assert res.returncode == 0, res.stdout + res.stderr
    again = cli("cluster", "plan", "--sim", str(cluster.dir), "--spec", str(split))
    assert (
        "VM 203 (stopped) cannot start on pve3: its hostpci0 names mapping pro6000-vm, which has no device on "
        "pve3 after the plan (as the other nodes are now, it lists devices of pve1, pve2 only)"
        in again.stdout
    )

    back = tmp_path / "back.yaml"
    back.write_text(
        GIVE_BACK.format(nodes="".join(NODE.format(name=n, ct=cluster.container(n)) for n in cluster.nodes))
    )
    pci = (cluster.dir / "pve/mapping/pci.cfg").read_text()
    before = {n: fingerprint(cluster.member(n), cluster.container(n)) for n in cluster.nodes}
    want = [
        f"gputopo: error: refused: node {n}: {refusal(n, cluster.container(n), vm)}"
        for n, vm in (("pve1", 201), ("pve2", 202))
    ]
    for argv in (["plan"], ["apply", "--yes"]):
        res = cli("cluster", *argv, "--sim", str(cluster.dir), "--spec", str(back))
        assert res.returncode == 2, (argv, res.stdout, res.stderr)
        assert res.stderr.strip().splitlines() == want, argv
    assert (cluster.dir / "pve/mapping/pci.cfg").read_text() == pci
    for n in cluster.nodes:
        assert diff(before[n], fingerprint(cluster.member(n), cluster.container(n))) == [], n


WAY_OUT = (
    NODE
    + """\
    vms:
      mappings:
        - name: pro6000-vm
          gpus: {{addresses: []}}
"""
)


def test_the_way_out_gives_every_gpu_back_on_every_node_in_one_rollout(cluster, tmp_path):
    """Each node gives its lines of pro6000-vm up in turn; the last one's step deletes the
    mapping where the plan shown had it update it (the others' lines were there then): the same
    step, so that node applies instead of refusing a changed plan."""
    split = tmp_path / "split.yaml"
    split.write_text(spec_text(cluster, split=list(cluster.nodes), whole=[]))
    res = cli("cluster", "apply", "--yes", "--no-verify", "--sim", str(cluster.dir), "--spec", str(split))
    assert res.returncode == 0, res.stdout + res.stderr
    out = tmp_path / "out.yaml"
    out.write_text(
        GIVE_BACK.format(
            nodes="".join(WAY_OUT.format(name=n, ct=cluster.container(n)) for n in cluster.nodes)
        )
    )
    plan = cli("cluster", "plan", "--sim", str(cluster.dir), "--spec", str(out))
    assert plan.returncode == 0, plan.stderr
    assert plan.stdout.count("update PCI mapping pro6000-vm: 0 device(s)") == 3, plan.stdout
    res = cli("cluster", "apply", "--yes", "--json", "--sim", str(cluster.dir), "--spec", str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    doc = json.loads(res.stdout)
    assert [(n["node"], n["outcome"]) for n in doc["nodes"]] == [
        (n, "applied-and-kept") for n in cluster.nodes
    ]
    assert "pro6000-vm" not in (cluster.dir / "pve/mapping/pci.cfg").read_text()
    for n in cluster.nodes:  # the VM GPUs of every node are back on nvidia
        fp = fingerprint(cluster.member(n), cluster.container(n))
        vm_gpus = ("0000:81:00.0", "0000:91:00.0", "0000:e1:00.0", "0000:f1:00.0")
        assert [fp[f"pci:{a}"][0] for a in vm_gpus] == ["nvidia"] * 4, n
    diff_ = cli("cluster", "diff", "--exit-code", "--sim", str(cluster.dir), "--spec", str(out))
    assert diff_.returncode == 0, diff_.stdout + diff_.stderr
