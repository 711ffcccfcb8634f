"""Helpers for the cluster tests: a simulated 3-node cluster per test (a copy of one made per
session), and real OpenSSH servers on loopback, one per simulated node.

The servers are :class:`gputopo.sim.cluster.sshd.SshNodes`, as ``gputopo sim cluster-ssh``
runs them: each node's sshd on its own address (127.0.0.11, .12, ...) with its own generated
host key, the generated user key for root, and the node's shell as its ``ForceCommand``; the
client is the real ``ssh`` through the ssh_config written there. Without sshd, or not as root,
the SSH tests skip with a message, unless GPUTOPO_REQUIRE_SSH=1 (CI) makes that a failure.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from gputopo.sim.cluster import SimCluster, create_cluster
from gputopo.sim.cluster.sshd import (  # noqa: F401 (the helpers' public names)
    SSHD,
    SshNodes,
    free_port,
    keygen,
    make_keys,
    sshd_missing,
    wait_listening,
)
from gputopo.sim.kernel import SimKernel
from helpers.applysim import SCALE, cleanup, fast_tmp

REQUIRE_SSH = os.environ.get("GPUTOPO_REQUIRE_SSH") == "1"

SPEC = """\
apiVersion: gputopo/v1
kind: GpuTopology
nodes:
{nodes}
"""
SPLIT_NODE = """\
  - name: {name}
    containers:
      - vmid: {ct}
        gpus: {{numa: [0]}}
        service: {{unit: sglang.service}}
    vms:
      mappings:
        - name: pro6000-vm
          gpus: {{numa: [1]}}
          description: GPUs for VM passthrough
"""
WHOLE_NODE = """\
  - name: {name}
    containers:
      - vmid: {ct}
        gpus: {{count: 8}}
        service: {{unit: sglang.service}}
"""


def make_template(pve_version: str = "8.4.1", count: int = 3) -> Path:
    d = Path(tempfile.mkdtemp(prefix="gputopo-cluster-tpl-", dir=fast_tmp())) / "cluster"
    create_cluster(d, count, pve_version=pve_version)
    for node in SimCluster(d).nodes:
        SimKernel(d / "nodes" / node / "root").configure(time_scale=SCALE)
    return d


def copy_cluster(template: Path, dest: Path) -> SimCluster:
    subprocess.run(["cp", "-a", str(template), str(dest)], check=True)
    return SimCluster(dest)


def spec_text(cluster: SimCluster, split: list[str], whole: list[str] = (), restart: bool = False) -> str:
    """A spec: the ``split`` nodes give NUMA 1 to the VM mapping pro6000-vm, the ``whole`` nodes
    keep every GPU in their container. ``restart``: ``container_restart: always`` (by default a
    split keeps its container running and only restarts the service)."""
    parts = []
    for n in cluster.nodes:
        if n in split:
            parts.append(SPLIT_NODE.format(name=n, ct=cluster.container(n)))
        elif n in whole:
            parts.append(WHOLE_NODE.format(name=n, ct=cluster.container(n)))
    text = SPEC.format(nodes="".join(parts).rstrip("\n"))
    return text + "policy: {container_restart: always}\n" if restart else text


@pytest.fixture(scope="module")
def template():
    """A three-node PVE 8 cluster, made once per test module (``cluster`` copies it)."""
    d = make_template()
    yield d
    cleanup(d.parent)


@pytest.fixture
def cluster(template, tmp_path):
    """A private copy of the module's ``template``; its servers stop afterwards."""
    c = copy_cluster(template, tmp_path / "cluster")
    yield c
    c.stop()


# --- OpenSSH: gputopo.sim.cluster.sshd (what 'gputopo sim cluster-ssh' runs) -----------------


def require_sshd() -> None:
    why = sshd_missing()
    if why is None:
        return
    if REQUIRE_SSH:
        pytest.fail(f"GPUTOPO_REQUIRE_SSH=1 but {why}", pytrace=False)
    pytest.skip(why)


# --- HA clusters: every node split, its VM an HA consumer of its 4 mapped GPUs ------------
DESC = "          description: GPUs for VM passthrough\n"
CRM = 0.2  # the HA manager's round in the HA cluster tests


def ha_spec(cluster: SimCluster) -> str:
    """Every node split; each node's VM takes its node's 4 mapped GPUs and runs (an HA start)."""
    head, *rest = spec_text(cluster, split=cluster.nodes).split(DESC)
    out = head
    for node, tail in zip(cluster.nodes, rest, strict=True):
        vm = cluster.vm(node)
        out += (
            DESC + f"      consumers:\n        - {{vmid: {vm}, mapping: pro6000-vm, gpus: 4, start: true}}\n"
        )
        out += tail
    return out


def run_gputopo(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gputopo", *args], capture_output=True, text=True, timeout=600
    )


def ha_applied(count: int):
    """A PVE 9 cluster template of ``count`` nodes, each split with an HA VM consumer, applied."""
    d = make_template(pve_version="9.1.2", count=count)
    spec = d.parent / "spec.yaml"
    spec.write_text(ha_spec(SimCluster(d)))
    res = run_gputopo("cluster", "apply", "--yes", "--no-verify", "--sim", str(d), "--spec", str(spec))
    assert res.returncode == 0, res.stderr
    return d
