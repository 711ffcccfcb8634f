"""Rolling apply, HA placement and cluster verify on a simulated cluster whose nodes' shells run
here (test_cluster_ssh reaches the same shells through real sshd)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from gputopo.adapters.clusterapi import ClusterApi
from gputopo.cluster.gather import read_cluster
from gputopo.cluster.ha import read_ha
from gputopo.cluster.plan import plan_cluster
from gputopo.cluster.rolling import rolling_apply
from gputopo.errors import ClusterApplyFailed
from gputopo.formats.pcicfg import parse_pci_cfg
from gputopo.plan.spec import parse_spec
from gputopo.sim.pveapi import PveApiServer
from helpers.applysim import diff as fp_diff
from helpers.applysim import fingerprint
from helpers.clusterharness import cleanup, cluster, copy_cluster, make_template, spec_text, template  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow  # a simulated cluster per test (seconds each); the full run only


@pytest.fixture(scope="module")
def template9():
    d = make_template("9.1.2")
    yield d
    cleanup(d.parent)


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gputopo", *args], capture_output=True, text=True, timeout=900
    )


def write_spec(cluster, tmp_path, split, whole=()):
    path = tmp_path / "spec.yaml"
    path.write_text(spec_text(cluster, split=split, whole=list(whole)))
    return path


def node_fp(cluster, node: str) -> dict:
    """The node's fingerprint with only its own part of the shared /etc/pve."""
    fp = fingerprint(cluster.member(node), cluster.container(node))
    return {k: v for k, v in fp.items() if not k.startswith("pve:") or k.startswith(f"pve:nodes/{node}/")}


def map_nodes(cluster, mid: str) -> list[str]:
    for m in parse_pci_cfg((cluster.dir / "pve/mapping/pci.cfg").read_text()):
        if m.id == mid:
            return sorted(e.split("node=")[1].split(",")[0] for e in m.maps)
    return []


def test_the_first_failure_stops_the_run_and_names_what_is_done(cluster, tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(spec_text(cluster, split=["pve1", "pve2", "pve3"], restart=True))
    # pve2's container will not start again: its apply fails in the start phase and rolls back
    pve2 = cluster.member("pve2")
    PveApiServer(pve2.paths.pve, pve2.paths.run, pve2.paths.root, "pve2").inject_fault(
        "vzstart", 102, "startup for container '102' failed"
    )
    before = {n: node_fp(cluster, n) for n in ("pve2", "pve3")}
    res = cli("cluster", "apply", "--yes", "--no-verify", "--sim", str(cluster.dir), "--spec", str(spec))
    assert res.returncode == 1, res.stderr
    (err,) = res.stderr.strip().splitlines()
    assert err.startswith("gputopo: error: stopped at node pve2: apply failed at step ")
    assert "rolled back" in err and err.endswith("; applied and kept: pve1; not started: pve3")
    assert re.search(r"^pve1: applied-and-kept", res.stdout, re.M)
    assert re.search(r"^pve2: applied-then-rolled-back", res.stdout, re.M)
    assert "pve3:" not in res.stdout
    # the account at the end names every node's outcome
    account = res.stdout.split("Rollout account:\n")[1].splitlines()
    assert [ln.split()[:2] for ln in account[:3]] == [
        ["pve1", "applied-and-kept"],
        ["pve2", "applied-then-rolled-back"],
        ["pve3", "not-started"],
    ]
    assert account[3].endswith("applied and kept: pve1; rolled back: pve2; not started: pve3")
    # pve2 is as it was (its own rollback), pve3 untouched, pve1 applied: its lines only
    for n in ("pve2", "pve3"):
        assert fp_diff(before[n], node_fp(cluster, n)) == [], n
    assert map_nodes(cluster, "pro6000-vm") == ["pve1"] * 4


def test_canary_first_then_the_rest_in_batches_and_a_second_run_changes_nothing(cluster, tmp_path):
    spec = write_spec(cluster, tmp_path, split=["pve1", "pve2"], whole=["pve3"])
    res = cli(
        "cluster",
        "apply",
        "--yes",
        "--no-verify",
        "--canary",
        "pve2",
        "--serial",
        "2",
        "--sim",
        str(cluster.dir),
        "--spec",
        str(spec),
    )
    assert res.returncode == 0, res.stderr
    order = [m.group(1) for m in re.finditer(r"^(pve\d): applied", res.stdout, re.M)]
    assert order[0] == "pve2" and sorted(order) == ["pve1", "pve2", "pve3"]
    assert map_nodes(cluster, "pro6000-vm") == ["pve1"] * 4 + ["pve2"] * 4
    # HA (PVE 8): VMs whose mapping spans pve1 and pve2 are restricted to them (a group's comment
    # is written as is: only Rules.pm encodes one)
    assert (
        "group: gputopo-vm201\n\tcomment gputopo: nodes with the GPUs of mapping pro6000-vm\n"
        "\tnodes pve1,pve2\n\trestricted 1\n" in (cluster.dir / "pve/ha/groups.cfg").read_text()
    )
    again = cli("cluster", "apply", "--yes", "--sim", str(cluster.dir), "--spec", str(spec))
    assert again.returncode == 0 and "Cluster: no changes on 3 node(s)" in again.stdout
    diff = cli("cluster", "diff", "--exit-code", "--sim", str(cluster.dir), "--spec", str(spec))
    assert diff.returncode == 0, diff.stdout


def test_a_mapping_edited_by_hand_after_the_plan_is_not_overwritten(cluster, tmp_path):
    spec_yaml = spec_text(cluster, split=["pve1", "pve2", "pve3"])
    spec = parse_spec(spec_yaml)
    ports = cluster.ports()
    shell = cluster.shell()
    order = cluster.nodes
    cplan = plan_cluster(spec, read_cluster(spec, order, shell, ports.proxmox), order)
    # between the plan and the apply, someone maps a GPU of pve2 by hand
    hand = "id=10de:2bb5,iommugroup=3,node=pve2,path=0000:01:00.0,subsystem-id=10de:204e"
    ports.proxmox.mapping_create("pro6000-vm", [hand], "made by hand")
    with pytest.raises(ClusterApplyFailed) as e:
        rolling_apply(cplan, spec_yaml, shell, None, verify=False)
    assert e.value.node == "pve2" and e.value.kept == ["pve1"] and e.value.not_started == ["pve3"]
    assert "the host changed since the plan was made (its plan is now" in str(e.value)
    # pve2 refused (nothing changed there), but pve1 was changed and kept: not "nothing changed"
    assert [(o.node, o.status) for o in e.value.account.outcomes] == [
        ("pve1", "applied-and-kept"),
        ("pve2", "refused"),
        ("pve3", "not-started"),
    ]
    assert e.value.exit_code == 1
    maps = next(
        m for m in parse_pci_cfg((cluster.dir / "pve/mapping/pci.cfg").read_text()) if m.id == "pro6000-vm"
    )
    assert hand in maps.maps and sum("node=pve1," in x for x in maps.maps) == 4
    assert not any("node=pve3," in x for x in maps.maps)


def test_a_spec_node_outside_the_cluster_is_refused(cluster, tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(spec_text(cluster, split=["pve1"]) + "\n  - name: pve7\n")
    res = cli("cluster", "plan", "--sim", str(cluster.dir), "--spec", str(spec))
    assert res.returncode == 2
    assert (
        res.stderr.strip()
        == "gputopo: error: unknown node 'pve7': not a member of the cluster (have pve1, pve2, pve3)"
    )


def test_ha_rules_and_verify_on_pve9(template9, tmp_path):
    cluster = copy_cluster(template9, tmp_path / "c9")
    try:
        spec = write_spec(cluster, tmp_path, split=["pve1", "pve2"], whole=["pve3"])
        res = cli(
            "cluster",
            "apply",
            "--yes",
            "--no-verify",
            "--serial",
            "3",
            "--sim",
            str(cluster.dir),
            "--spec",
            str(spec),
        )
        assert res.returncode == 0, res.stderr
        # the plan shows the placement once every node is done; the nodes (all three at once)
        # each write their part in their own apply
        assert "  - create HA rule gputopo-vm201: vm:201 on pve1,pve2 (strict)" in res.stdout
        rules = (cluster.dir / "pve/ha/rules.cfg").read_text()
        assert rules.count("node-affinity: gputopo-vm") == 3 and "\tnodes pve1,pve2\n" in rules
        diff = cli("cluster", "diff", "--exit-code", "--sim", str(cluster.dir), "--spec", str(spec))
        assert diff.returncode == 0, diff.stdout
        ver = cli("cluster", "verify", "--json", "--sim", str(cluster.dir), "--spec", str(spec))
        report = json.loads(ver.stdout)
        assert ver.returncode == 0, ver.stderr
        checks = {c["name"]: c for c in report["checks"]}
        assert checks["converged"]["status"] == "PASS"
        # VMs 201/202 may not go to pve3 (no device there); their strict rule keeps HA away from it
        assert checks["migration"]["status"] == "WARN"
        assert (
            "VM 201 (pve1): an offline migration would fail on pve3 (hostpci0 mapping pro6000-vm)"
            in checks["migration"]["summary"]
        )
        assert [n["node"] for n in report["nodes"]] == ["pve1", "pve2", "pve3"]
        # an operator's rule that lets VM 201 anywhere makes the migration check fail
        api = ClusterApi(cluster.ports().proxmox)
        api.ha_rule_delete("gputopo-vm201")
        api.ha_rule_create(
            "anywhere",
            {"type": "node-affinity", "resources": "vm:201", "nodes": "pve1,pve2,pve3", "strict": True},
        )
        assert read_ha(api).rules
        ver = cli("cluster", "verify", "--json", "--sim", str(cluster.dir), "--spec", str(spec))
        assert ver.returncode == 1
        migration = {c["name"]: c for c in json.loads(ver.stdout)["checks"]}["migration"]
        assert migration["status"] == "FAIL"
        assert migration["summary"].startswith(
            "VM 201 (pve1): HA may recover it on pve3, where its mapping has no "
            "device: pve3 (hostpci0 mapping pro6000-vm)"
        )
        assert ver.stderr.strip().startswith("gputopo: error: verification failed: migration (3 node(s)")
    finally:
        cluster.stop()


def test_a_node_whose_lock_is_held_stops_the_run_with_exit_4(cluster, tmp_path):
    """Another apply running on pve1, the first node (its lock held): pve1 refuses before
    changing anything and the rollout passes on its exit code 4, as nothing was changed anywhere.
    The same lock on pve2, after pve1 was changed and kept, is exit 1: something changed."""
    from gputopo.apply.lock import HostLock

    spec = write_spec(cluster, tmp_path, split=["pve1", "pve2", "pve3"])
    before = {n: node_fp(cluster, n) for n in cluster.nodes}
    with HostLock(str(cluster.member("pve1").paths.root)):
        res = cli("cluster", "apply", "--yes", "--no-verify", "--sim", str(cluster.dir), "--spec", str(spec))
    assert res.returncode == 4, res.stderr
    (err,) = res.stderr.strip().splitlines()
    assert err.startswith("gputopo: error: stopped at node pve1: ") and "lock" in err
    assert err.endswith("; applied and kept: none; not started: pve2, pve3")
    assert re.search(r"^  pve1  refused ", res.stdout, re.M)
    assert res.stdout.rstrip().endswith("nothing was changed anywhere; not started: pve2, pve3")
    for n in cluster.nodes:
        assert fp_diff(before[n], node_fp(cluster, n)) == [], n

    with HostLock(str(cluster.member("pve2").paths.root)):
        res = cli("cluster", "apply", "--yes", "--no-verify", "--sim", str(cluster.dir), "--spec", str(spec))
    assert res.returncode == 1, res.stderr
    (err,) = res.stderr.strip().splitlines()
    assert err.startswith("gputopo: error: stopped at node pve2: ") and "lock" in err
    assert err.endswith("; applied and kept: pve1; not started: pve3")
    assert "nothing was changed" not in res.stdout + res.stderr
    for n in ("pve2", "pve3"):
        assert fp_diff(before[n], node_fp(cluster, n)) == [], n
    assert fp_diff(before["pve1"], node_fp(cluster, "pve1")) != []


def test_a_node_whose_gpu_falls_off_the_bus_stops_the_run_with_exit_3(cluster, tmp_path):
    """pve2's GPU falls off the bus mid-rebind: pve2 rolls back what it can and names the device
    for a human (its exit 3), which the rolling apply passes on; pve3 is never started."""
    from gputopo.sim.kernel import SimKernel

    spec = write_spec(cluster, tmp_path, split=["pve1", "pve2", "pve3"])
    SimKernel(cluster.member("pve2").paths.root).inject("0000:91:00.0", "unbind", "fall_off")
    before = node_fp(cluster, "pve3")
    res = cli("cluster", "apply", "--yes", "--no-verify", "--sim", str(cluster.dir), "--spec", str(spec))
    assert res.returncode == 3, res.stderr
    (err,) = res.stderr.strip().splitlines()
    assert err.startswith("gputopo: error: stopped at node pve2: ") and "needs a human: 0000:91:00.0" in err
    assert err.endswith("; applied and kept: pve1; needs a human: pve2; not started: pve3")
    assert re.search(r"^  pve2  needs-human ", res.stdout, re.M)
    assert re.search(
        r"^\s+next: fix what the error names, then run 'gputopo recover' on pve2$", res.stdout, re.M
    )
    assert fp_diff(before, node_fp(cluster, "pve3")) == []
