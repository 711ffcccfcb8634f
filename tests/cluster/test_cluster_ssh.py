"""The cluster commands against a simulated cluster whose nodes are reached with the real OpenSSH
client through real sshd servers on loopback (one per node, generated host and user keys).

Without sshd (or not as root) these tests skip, unless GPUTOPO_REQUIRE_SSH=1.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import gputopo
from gputopo.adapters.ssh import SshExec, SshFiles, SshRunner
from gputopo.cluster.gather import NodeInput, node_view, read_cluster
from gputopo.cluster.plan import plan_cluster
from gputopo.errors import NodeUnreachable
from gputopo.facts.observe import observe
from gputopo.model.facts import Facts
from gputopo.plan.reads import spec_reads
from gputopo.plan.spec import parse_spec
from helpers.applysim import diff as fp_diff
from helpers.applysim import fingerprint
from helpers.clusterharness import (
    SshNodes,
    cleanup,
    copy_cluster,
    make_keys,
    make_template,
    require_sshd,
    spec_text,
)

pytestmark = pytest.mark.slow  # a real sshd per simulated node; the full run only


@pytest.fixture(scope="module")
def template():
    require_sshd()
    d = make_template()
    yield d
    cleanup(d.parent)


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    require_sshd()
    return make_keys(tmp_path_factory.mktemp("ssh"), ["pve1", "pve2", "pve3"])


@pytest.fixture
def cluster(template, tmp_path):
    return copy_cluster(template, tmp_path / "cluster")


@pytest.fixture
def ssh(cluster, keys, tmp_path):
    nodes = SshNodes(cluster, tmp_path, keys)
    yield nodes
    nodes.stop()


def cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gputopo", *args], capture_output=True, text=True, timeout=timeout
    )


def fingerprints(cluster) -> dict:
    return {n: fingerprint(cluster.member(n), cluster.container(n)) for n in cluster.nodes}


def test_each_node_answers_for_itself_over_ssh(cluster, ssh):
    ssh.start()
    runner = SshRunner(config_file=str(ssh.config), connect_timeout=5)
    version = runner.run("pve2", ["gputopo", "--version"], timeout=60)
    assert version.rc == 0 and f"version {gputopo.__version__}" in version.stdout
    res = runner.run("pve3", ["gputopo", "discover", "--json"], timeout=60)
    facts = Facts.model_validate_json(res.stdout)
    assert facts.host.hostname == "pve3" and len(facts.gpus) == 8
    missing = runner.run("pve1", ["cat", "/etc/modprobe.d/gputopo-vfio.conf"], timeout=60)
    assert missing.rc == 1 and "No such file or directory" in missing.stderr


def test_a_host_key_that_is_not_the_known_one_is_refused(cluster, ssh):
    ssh.start()
    text = ssh.known_hosts.read_text()
    # pve1's entry now carries pve2's key: ssh must refuse, never accept the new one
    keys = {line.split()[0]: line.split(None, 1)[1] for line in text.splitlines()}
    ssh.known_hosts.write_text(text.replace(f"pve1 {keys['pve1']}", f"pve1 {keys['pve2']}"))
    with pytest.raises(NodeUnreachable) as e:
        SshRunner(config_file=str(ssh.config), connect_timeout=5).run(
            "pve1", ["gputopo", "--version"], timeout=60
        )
    assert str(e.value).startswith("node pve1: unreachable over SSH: ")
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in str(e.value) or "Host key verification failed" in str(
        e.value
    )


def test_plan_apply_and_a_second_apply_over_ssh(cluster, ssh, tmp_path):
    ssh.start()
    spec = tmp_path / "spec.yaml"
    spec.write_text(spec_text(cluster, split=["pve1", "pve2"], whole=["pve3"]))
    common = ["--sim", str(cluster.dir), "--ssh-config", str(ssh.config), "--spec", str(spec)]
    plan = cli("cluster", "plan", *common)
    assert plan.returncode == 0, plan.stderr
    assert [ln for ln in plan.stdout.splitlines() if ln.startswith("Node ")] == [
        "Node pve1",
        "Node pve2",
        "Node pve3",
    ]
    # the mapping once, with every planned node's lines
    block = plan.stdout.split("Cluster-wide PCI mappings")[1]
    assert len(re.findall(r"node=pve1,", block)) == 4 and len(re.findall(r"node=pve2,", block)) == 4

    applied = cli("cluster", "apply", "--yes", "--serial", "2", *common)
    assert applied.returncode == 0, applied.stderr + applied.stdout
    assert re.search(r"^pve1: applied", applied.stdout, re.M) and re.search(
        r"^pve2: applied", applied.stdout, re.M
    )
    pci = (cluster.dir / "pve/mapping/pci.cfg").read_text()
    section = pci.split("pro6000-vm\n")[1].split("\n\n")[0]
    assert section.count("node=pve1,") == 4 and section.count("node=pve2,") == 4

    again = cli("cluster", "apply", "--yes", *common)
    assert again.returncode == 0, again.stderr
    assert "Cluster: no changes on 3 node(s)" in again.stdout
    diff = cli("cluster", "diff", "--exit-code", *common)
    assert diff.returncode == 0, diff.stdout + diff.stderr


def test_one_round_trip_per_node_reads_what_the_reads_one_by_one_read(cluster, ssh):
    """read_cluster over sshd (each node's node-read, one connection each) gives the facts,
    the state and the cluster plan that reading each part over its own SSH call gives."""
    ssh.start()
    spec = parse_spec(spec_text(cluster, split=["pve1", "pve2"], whole=["pve3"]))
    runner = SshRunner(config_file=str(ssh.config), connect_timeout=5)
    calls = []
    start = runner.start
    runner.start = lambda node, argv, stdin=True: calls.append((node, argv[:3])) or start(node, argv, stdin)
    ports = cluster.ports()
    try:
        fast = read_cluster(spec, cluster.nodes, runner, ports.proxmox, ha=False)  # HA: from the API, not ssh
        assert sorted(calls) == [(n, ["gputopo", "cluster", "node-read"]) for n in cluster.nodes]
        # each part read over SSH by itself, as the cluster commands read a node before
        one_by_one = {}
        for n in cluster.nodes:
            facts = Facts.model_validate_json(runner.run(n, ["gputopo", "discover", "--json"], 60).stdout)
            one_by_one[n] = NodeInput(
                n,
                *observe(
                    facts,
                    spec_reads(spec, n),
                    proxmox=node_view(ports.proxmox, n),
                    exec=SshExec(runner, n),
                    files=SshFiles(runner, n),
                ),
            )
        for n in cluster.nodes:
            assert fast[n].facts.model_dump() == one_by_one[n].facts.model_dump()
            # the node also read its served model's files (the simulated container's
            # /models/Qwen3-235B-A22B-FP8), which the reads one by one leave to a later step; the
            # rest is the same
            for ct in fast[n].current.containers.values():
                if ct.service is not None and ct.status == "running":
                    assert ct.footprint is not None and ct.footprint_unread is None, ct.footprint_unread
                    assert ct.footprint.path == "/models/Qwen3-235B-A22B-FP8"
                    ct.footprint = None
            assert fast[n].current == one_by_one[n].current
        assert fast["pve1"].current.containers[cluster.container("pve1")].service.active
        assert plan_cluster(spec, fast, cluster.nodes).to_data() == (
            plan_cluster(spec, one_by_one, cluster.nodes).to_data()
        )
    finally:
        cluster.stop()


def test_an_unreachable_node_stops_everything_before_any_change(cluster, ssh, tmp_path):
    ssh.start()
    ssh.stop("pve3")
    spec = tmp_path / "spec.yaml"
    spec.write_text(spec_text(cluster, split=["pve1", "pve2", "pve3"]))
    before = fingerprints(cluster)
    res = cli(
        "cluster",
        "apply",
        "--yes",
        "--sim",
        str(cluster.dir),
        "--ssh-config",
        str(ssh.config),
        "--spec",
        str(spec),
    )
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gputopo: error: node pve3: unreachable over SSH: "), (
        res.stderr
    )
    assert "Connection refused" in lines[0]
    after = fingerprints(cluster)
    assert {n: fp_diff(before[n], after[n]) for n in cluster.nodes} == {n: [] for n in cluster.nodes}


def test_a_node_that_never_answers_times_out_naming_it(cluster, ssh, tmp_path):
    ssh.start()
    ssh.stop("pve2")
    # something accepts the connection on pve2's port but never speaks SSH
    silent = socket.socket()
    silent.bind((cluster.addresses["pve2"], ssh.ports["pve2"]))
    silent.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        silent.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(silent.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    spec = tmp_path / "spec.yaml"
    spec.write_text(spec_text(cluster, split=["pve1", "pve2"]))
    try:
        res = cli(
            "cluster",
            "plan",
            "--sim",
            str(cluster.dir),
            "--ssh-config",
            str(ssh.config),
            "--ssh-timeout",
            "1",
            "--timeout",
            "20",
            "--spec",
            str(spec),
            timeout=120,
        )
    finally:
        stop.set()
        t.join()
        for s in held:
            s.close()
        silent.close()
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gputopo: error: node pve2: unreachable over SSH: "), (
        res.stderr
    )
    assert re.search(r"timed out|no answer within", lines[0])


def test_a_node_running_another_version_is_refused_with_both(cluster, keys, tmp_path):
    other = tmp_path / "other-install"
    shutil.copytree(
        Path(gputopo.__file__).parent, other / "gputopo", ignore=shutil.ignore_patterns("__pycache__")
    )
    init = other / "gputopo" / "__init__.py"
    init.write_text(
        init.read_text().replace(f'__version__ = "{gputopo.__version__}"', '__version__ = "0.0.9"')
    )
    nodes = SshNodes(cluster, tmp_path, keys)
    try:
        nodes.start(env={"pve2": {"PYTHONPATH": str(other)}})
        spec = tmp_path / "spec.yaml"
        spec.write_text(spec_text(cluster, split=["pve1", "pve2"]))
        before = fingerprints(cluster)
        res = cli(
            "cluster",
            "apply",
            "--yes",
            "--sim",
            str(cluster.dir),
            "--ssh-config",
            str(nodes.config),
            "--spec",
            str(spec),
        )
    finally:
        nodes.stop()
    assert res.returncode == 2
    assert res.stderr.strip() == (
        f"gputopo: error: node pve2 runs gputopo 0.0.9, this is gputopo {gputopo.__version__}: "
        f"install gputopo {gputopo.__version__} on every node first; nothing was changed"
    )
    after = fingerprints(cluster)
    assert {n: fp_diff(before[n], after[n]) for n in cluster.nodes} == {n: [] for n in cluster.nodes}


def test_plan_through_the_https_api_of_any_node(cluster, ssh, tmp_path):
    """The production path: proxmoxer over HTTPS to one node (here pve2's), ssh to every node."""
    ssh.start()
    host = cluster.start("pve2")
    try:
        spec = tmp_path / "spec.yaml"
        spec.write_text(spec_text(cluster, split=["pve1", "pve3"], whole=["pve2"]))
        env = dict(os.environ, GPUTOPO_PVE_PASSWORD=host.credentials()["password"])
        res = subprocess.run(
            [
                sys.executable,
                "-m",
                "gputopo",
                "cluster",
                "plan",
                "--api-url",
                f"https://127.0.0.1:{host.api.port}",
                "--ca-bundle",
                str(host.api.ca_cert_path),
                "--ssh-config",
                str(ssh.config),
                "--spec",
                str(spec),
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
        )
    finally:
        cluster.stop()
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert [n["node"] for n in data["nodes"]] == ["pve1", "pve2", "pve3"]
    vm_lines = data["mappings"]["pro6000-vm"]["map"]
    assert [e.split("node=")[1].split(",")[0] for e in vm_lines] == ["pve1"] * 4 + ["pve3"] * 4
    # each node's plan is the one its own apply makes (the same signature)
    for n in ("pve1", "pve2"):
        own = cli(
            "apply",
            "--dry-run",
            "--json",
            "--sim",
            str(cluster.node_dir(n)),
            "--node",
            n,
            "--spec",
            str(spec),
        )
        assert own.returncode == 0, own.stderr
        assert json.loads(own.stdout)["signature"] == next(
            x["signature"] for x in data["nodes"] if x["node"] == n
        )
    assert data["ha_release"] == 8 and {c["id"] for c in data["ha"]} >= {"gputopo-vm201", "gputopo-vm203"}
