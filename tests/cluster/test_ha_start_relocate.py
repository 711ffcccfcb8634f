"""A failed HA start on a simulated two-node cluster: restarted ``max_restart`` times on its node,
then relocated to the other node its rule allows, and in ``error`` only when that fails too
(pve-ha-manager src/PVE/HA/Manager.pm l.1468-1497, src/PVE/HA/LRM.pm l.857-903)."""

from __future__ import annotations

import time

import pytest

from gputopo.sim import state
from gputopo.sim.cluster import SimCluster
from gputopo.sim.pveapi.harules import MOVES
from gputopo.sim.pveapi.qemu_vm import START_FAILS
from helpers.applysim import fingerprint
from helpers.clusterharness import CRM, cleanup, copy_cluster
from helpers.clusterharness import ha_applied as _applied
from helpers.clusterharness import ha_spec as _spec
from helpers.clusterharness import run_gputopo as _gputopo

pytestmark = pytest.mark.slow  # a simulated cluster and two node applies (seconds each)

BUSY = 299  # a VM outside HA that holds pve1's mapped GPUs


@pytest.fixture(scope="module")
def applied():
    d = _applied(2)
    yield d
    cleanup(d.parent)


@pytest.fixture
def cluster(applied, tmp_path):
    c = copy_cluster(applied, tmp_path / "cluster")
    for node in c.nodes:
        state.write_state(c.node_dir(node) / "run", "latencies", {"ha.crm": CRM})
    yield c
    c.stop()


def _status(cluster: SimCluster, node: str, vmid: int) -> str:
    return state.guest_status(cluster.node_dir(node) / "run", "qemu", vmid)


def _wait(cluster: SimCluster, until, rounds: int = 40) -> None:
    """Let the HA manager run its rounds (a status read runs one that is due) until ``until()``."""
    api = cluster.start("pve1").api
    for _ in range(rounds):
        if until():
            return
        time.sleep(CRM * 0.6)
        for node in cluster.nodes:  # pve1 answers for every node
            for vmid in (201, 202):
                try:
                    api.dispatch("GET", f"/nodes/{node}/qemu/{vmid}/status/current", {}, None)
                except Exception:
                    pass
    assert until()


def _stop(cluster: SimCluster, node: str, vmid: int) -> None:
    api = cluster.start("pve1").api
    api.dispatch("POST", f"/nodes/{node}/qemu/{vmid}/status/stop", {}, None)
    _wait(cluster, lambda: _status(cluster, node, vmid) == "stopped")


def _busy_pve1(cluster: SimCluster) -> None:
    """VM 299 on pve1 (not HA) takes the mapping's GPUs of pve1: VM 201's start fails there."""
    conf = cluster.dir / "pve/nodes/pve1/qemu-server"
    (conf / f"{BUSY}.conf").write_text((conf / "201.conf").read_text())
    api = cluster.start("pve1").api
    api.dispatch("POST", f"/nodes/pve1/qemu/{BUSY}/status/start", {}, None)
    _wait(cluster, lambda: _status(cluster, "pve1", BUSY) == "running")


def _moves(cluster: SimCluster, node: str) -> list[dict]:
    return state.read_state(cluster.node_dir(node) / "run", MOVES, []) or []


def test_a_start_that_fails_on_its_node_is_relocated_and_started_on_the_other(cluster):
    _stop(cluster, "pve1", 201)
    _stop(cluster, "pve2", 202)  # pve2's GPUs free
    _busy_pve1(cluster)
    api = cluster.start("pve1").api
    api.dispatch("POST", "/nodes/pve1/qemu/201/status/start", {}, None)
    _wait(cluster, lambda: _status(cluster, "pve2", 201) == "running")
    assert not (cluster.dir / "pve/nodes/pve1/qemu-server/201.conf").exists()
    assert (cluster.dir / "pve/nodes/pve2/qemu-server/201.conf").exists()
    moves = _moves(cluster, "pve1")
    assert [(m["sid"], m["op"], m["node"], m["target"]) for m in moves] == [
        ("vm:201", "relocate", "pve1", "pve2")
    ]
    assert "could not find a free device" in moves[0]["why"]
    # the busy VM is left alone; the service runs on pve2 as the manager says
    assert _status(cluster, "pve1", BUSY) == "running"
    ha = api.dispatch("GET", "/nodes/pve2/qemu/201/status/current", {}, None).data["ha"]
    assert ha == {"managed": 1, "state": "started"}


def test_a_start_that_fails_on_both_nodes_ends_in_error_on_the_second(cluster):
    _stop(cluster, "pve1", 201)
    _busy_pve1(cluster)  # pve2's GPUs stay VM 202's: 201 fails there too
    api = cluster.start("pve1").api
    api.dispatch("POST", "/nodes/pve1/qemu/201/status/start", {}, None)

    def errored() -> bool:
        try:
            ha = api.dispatch("GET", "/nodes/pve2/qemu/201/status/current", {}, None).data["ha"]
        except Exception:
            return False
        return ha.get("state") == "error"

    _wait(cluster, errored)
    assert [(m["op"], m["target"]) for m in _moves(cluster, "pve1")] == [("relocate", "pve2")]
    assert _moves(cluster, "pve2") == []  # not sent back: pve1 failed it already
    assert _status(cluster, "pve2", 201) == "stopped"
    assert _status(cluster, "pve2", 202) == "running"


def test_apply_whose_ha_vm_is_relocated_after_its_start_failed_here_says_so_and_rolls_back(cluster, tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(_spec(cluster))
    _stop(cluster, "pve1", 201)
    _stop(cluster, "pve2", 202)  # pve2's GPUs free: VM 201 can start there
    # QEMU dies at VM 201's every start on pve1 (the node's own trouble, not its config's)
    died = "start failed: QEMU exited with code 1"
    state.write_state(cluster.node_dir("pve1") / "run", START_FAILS, {"201": died})
    cluster.stop()
    host = cluster.member("pve1")
    before = fingerprint(host, cluster.container("pve1"))
    res = _gputopo(
        "apply",
        "--spec",
        str(spec),
        "--yes",
        "--no-verify",
        "--sim",
        str(cluster.node_dir("pve1")),
    )
    out = res.stdout + res.stderr
    assert res.returncode == 1, out  # a failed step, rolled back
    assert "VM 201 was relocated by the HA manager to node pve2 after its start failed here" in out, out
    assert "rolled back" in out.lower(), out
    # VM 201 is pve2's now; nothing on pve1 is half done: every GPU on its driver, the
    # container and its service with their GPUs, the node's files, the guests
    assert (cluster.dir / "pve/nodes/pve2/qemu-server/201.conf").exists()
    after = fingerprint(host, cluster.container("pve1"))
    moved = {k for k in before.keys() | after.keys() if k.endswith("qemu-server/201.conf")}
    assert moved == {"pve:nodes/pve1/qemu-server/201.conf", "pve:nodes/pve2/qemu-server/201.conf"}
    assert {k: v for k, v in before.items() if k not in moved} == {
        k: v for k, v in after.items() if k not in moved
    }
    assert _status(cluster, "pve1", 201) == "stopped"
