"""Trying a simulated cluster from the command line: ``gputopo sim cluster-ssh DIR`` (a real sshd
per node on loopback, DIR/ssh_config for the cluster commands), ``gputopo sim break|heal
node-unreachable --node NODE``, ``gputopo init --sim <cluster dir>``, and docs/clusters.md's
"trying a cluster" run as written.

The tests that start sshd skip without it (or not as root), unless GPUTOPO_REQUIRE_SSH=1.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from helpers import TESTS
from helpers.applysim import fingerprint
from helpers.cli import one_line, run
from helpers.clusterharness import cleanup, copy_cluster, make_template, require_sshd

pytestmark = pytest.mark.slow  # a simulated cluster per test, real sshd for some; the full run only

CLUSTERS = TESTS.parent / "docs" / "clusters.md"


@pytest.fixture(scope="module")
def template():
    d = make_template()
    yield d
    cleanup(d.parent)


@pytest.fixture
def cluster(template, tmp_path):
    c = copy_cluster(template, tmp_path / "cluster")
    yield c
    c.stop()


def cli(*args: str, cwd: Path | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gputopo", *args], capture_output=True, text=True, timeout=timeout, cwd=cwd
    )


class Served:
    """``gputopo sim cluster-ssh DIR`` in its own process, until :meth:`stop`."""

    def __init__(self, dir: Path):
        self.dir = dir
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gputopo", "sim", "cluster-ssh", str(dir)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.lines: list[str] = []
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if line.startswith("Ctrl-C stops it."):
                break
        else:
            raise AssertionError(f"sim cluster-ssh ended: {self.proc.wait()} {self.proc.stderr.read()}")
        self.ports = {
            m[1]: int(m[2])
            for m in (re.match(r"  (pve\d): root@[\d.]+ port (\d+)$", ln) for ln in self.lines)
            if m
        }

    def stop(self, sig: int = signal.SIGTERM) -> tuple[int, str]:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        rc = self.proc.wait(30)
        return rc, self.proc.stderr.read()


def refused(address: str, port: int) -> bool:
    try:
        socket.create_connection((address, port), timeout=2).close()
        return False
    except ConnectionRefusedError:
        return True


def wait_for(pred, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    return pred()


def spec_of(cluster, tmp_path: Path) -> Path:
    spec = tmp_path / "cluster.yaml"
    assert cli("init", "--sim", str(cluster.dir), "-o", str(spec)).returncode == 0
    return spec


# --- sim cluster-ssh ---------------------------------------------------------------------------


def test_cluster_ssh_serves_each_node_until_sigterm_and_breaks_a_node_on_request(cluster, tmp_path):
    require_sshd()
    served = Served(cluster.dir)
    try:
        config = cluster.dir / "ssh_config"
        assert f"ssh_config: {config}" in served.lines and set(served.ports) == {"pve1", "pve2", "pve3"}
        assert any(f"--ssh-config {config}" in ln for ln in served.lines)
        # the real client, through the written config: each node answers for itself
        who = subprocess.run(
            ["ssh", "-F", str(config), "pve3", "--", "gputopo", "discover", "--json"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert who.returncode == 0 and json.loads(who.stdout)["host"]["hostname"] == "pve3", who.stderr
        # a second one on the same directory is refused, naming the first
        second = cli("sim", "cluster-ssh", str(cluster.dir), timeout=60)
        assert second.returncode == 2 and f"pid {served.proc.pid}" in one_line(second.stderr)

        spec = spec_of(cluster, tmp_path)
        common = ["--sim", str(cluster.dir), "--ssh-config", str(config), "--spec", str(spec)]
        assert cli("cluster", "plan", *common).returncode == 0

        broke = cli("sim", "break", "node-unreachable", "--node", "pve2", str(cluster.dir))
        assert broke.returncode == 0, broke.stderr
        # its sshd stops: the kernel refuses the connection
        assert wait_for(lambda: refused("127.0.0.12", served.ports["pve2"]))
        plan = cli("cluster", "plan", *common)
        assert plan.returncode == 2
        assert one_line(plan.stderr) == (
            f"gputopo: error: node pve2: unreachable over SSH: ssh: connect to host 127.0.0.12 port "
            f"{served.ports['pve2']}: Connection refused"
        )
        assert cli("sim", "heal", "--node", "pve2", str(cluster.dir)).stdout == "healed: node-unreachable\n"
        assert wait_for(lambda: not refused("127.0.0.12", served.ports["pve2"]))
        assert cli("cluster", "plan", *common).returncode == 0
    finally:
        rc, err = served.stop()
    assert rc == 0 and err.strip().endswith("stopped")
    assert not (cluster.dir / "ssh_config").exists()
    assert all(refused(cluster.addresses[n], p) for n, p in served.ports.items())


def test_heal_returns_once_the_nodes_sshd_accepts(cluster):
    """'sim heal node-unreachable' on a served cluster: the very next connection is accepted,
    every time."""
    require_sshd()
    served = Served(cluster.dir)
    try:
        for _ in range(3):
            broke = cli("sim", "break", "node-unreachable", "--node", "pve2", str(cluster.dir))
            assert broke.returncode == 0, broke.stderr
            assert wait_for(lambda: refused("127.0.0.12", served.ports["pve2"]))
            healed = cli("sim", "heal", "node-unreachable", "--node", "pve2", str(cluster.dir))
            assert healed.stdout == "healed: node-unreachable\n", healed.stderr
            assert not refused("127.0.0.12", served.ports["pve2"])
    finally:
        assert served.stop()[0] == 0


def test_heal_starts_again_an_sshd_that_was_killed_and_says_so(cluster):
    """An sshd killed outside 'sim break': the server says so on stderr, and 'sim heal' (every
    fault, or the node's) starts it again and says so."""
    require_sshd()
    served = Served(cluster.dir)
    try:
        for heal in (["sim", "heal", str(cluster.dir)], ["sim", "heal", "--node", "pve3", str(cluster.dir)]):
            pid = int((cluster.dir / "run/ssh/sshd-pve3.pid").read_text())
            os.kill(pid, signal.SIGKILL)
            assert wait_for(lambda: refused("127.0.0.13", served.ports["pve3"]))
            healed = cli(*heal)
            assert healed.returncode == 0, healed.stderr
            said = "sshd started again (it had been killed by signal 9)"
            assert healed.stdout == f"healed: {'pve3: ' if '--node' not in heal else ''}{said}\n"
            assert not refused("127.0.0.13", served.ports["pve3"])
            ok = subprocess.run(
                ["ssh", "-F", str(cluster.dir / "ssh_config"), "pve3", "--", "gputopo", "--version"],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert ok.returncode == 0, ok.stderr
        assert cli("sim", "heal", str(cluster.dir)).stdout == "nothing to heal\n"
    finally:
        rc, err = served.stop()
    assert rc == 0
    assert err.count("the sshd of pve3 has been killed by signal 9: 'gputopo sim heal") == 2, err


def test_a_killed_cluster_ssh_leaves_no_server_and_the_next_one_takes_over(cluster):
    require_sshd()
    first = Served(cluster.dir)
    assert first.stop(signal.SIGKILL)[0] == -signal.SIGKILL
    # each sshd goes with the command that started it
    assert wait_for(lambda: all(refused(cluster.addresses[n], p) for n, p in first.ports.items()))
    second = Served(cluster.dir)
    try:
        ok = subprocess.run(
            ["ssh", "-F", str(cluster.dir / "ssh_config"), "pve1", "--", "gputopo", "--version"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert ok.returncode == 0, ok.stderr
    finally:
        assert second.stop()[0] == 0


def test_cluster_ssh_refuses_in_one_line_without_sshd_or_root(capsys, cluster, monkeypatch):
    import gputopo.sim.cluster.sshd as sshd

    monkeypatch.setattr(sshd, "SSHD", "/nonexistent/sshd")
    code, _, err = run(capsys, "sim", "cluster-ssh", str(cluster.dir))
    assert code == 2
    assert one_line(err) == (
        f"gputopo: error: {cluster.dir}: cannot serve the nodes over SSH: /nonexistent/sshd is not "
        "installed (apt-get install -y openssh-server)"
    )
    # installed, but not root
    monkeypatch.setattr(sshd, "SSHD", sys.executable)
    monkeypatch.setattr(sshd.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    code, _, err = run(capsys, "sim", "cluster-ssh", str(cluster.dir))
    assert code == 2 and one_line(err).endswith(
        "cannot serve the nodes over SSH: sshd must run as root to log in as root@<node>"
    )
    assert not (cluster.dir / "ssh_config").exists() and not (cluster.dir / "run" / "ssh").exists()


def test_cluster_ssh_of_a_host_directory_is_refused(capsys, tmp_path):
    code, _, err = run(capsys, "sim", "cluster-ssh", str(tmp_path))
    assert code == 2 and "not a simulated cluster" in one_line(err)


# --- node-unreachable without sshd: the node's shell refuses -------------------------------------


def test_an_unreachable_node_stops_the_plan_naming_it_until_healed(cluster, tmp_path):
    spec = spec_of(cluster, tmp_path)
    common = ["--sim", str(cluster.dir), "--spec", str(spec)]
    before = fingerprint(cluster.member("pve2"), cluster.container("pve2"))
    assert cli("sim", "break", "node-unreachable", "--node", "pve2", str(cluster.dir)).returncode == 0
    plan = cli("cluster", "plan", *common)
    assert plan.returncode == 2 and one_line(plan.stderr) == (
        "gputopo: error: node pve2: unreachable over SSH: ssh: connect to host 127.0.0.12 port 22: "
        "Connection refused"
    )
    applied = cli("cluster", "apply", "--yes", *common)
    assert applied.returncode == 2 and "node pve2: unreachable" in applied.stderr
    assert fingerprint(cluster.member("pve2"), cluster.container("pve2")) == before
    assert cli("sim", "heal", "node-unreachable", "--node", "pve2", str(cluster.dir)).returncode == 0
    assert cli("cluster", "plan", *common).returncode == 0


def test_break_on_a_cluster_needs_a_node(capsys, cluster):
    code, _, err = run(capsys, "sim", "break", "wrong-answer", str(cluster.dir))
    assert code == 2 and one_line(err).endswith("a cluster: name the node with --node (pve1, pve2, pve3)")
    code, _, err = run(capsys, "sim", "break", "wrong-answer", "--node", "pve9", str(cluster.dir))
    assert code == 2 and one_line(err).endswith("no node pve9 (have pve1, pve2, pve3)")
    code, out, _ = run(capsys, "sim", "break", "wrong-answer", "--node", "pve3", str(cluster.dir))
    assert code == 0 and out.startswith("broke wrong-answer: CT 103: ")  # pve3's own container
    code, out, _ = run(capsys, "sim", "heal", "--node", "pve3", str(cluster.dir))
    assert (code, out) == (0, "healed: wrong-answer\n")
    # without --node, heal takes every fault out of every node
    for node in ("pve1", "pve3"):
        assert run(capsys, "sim", "break", "wrong-answer", "--node", node, str(cluster.dir))[0] == 0
    assert run(capsys, "sim", "break", "node-unreachable", "--node", "pve2", str(cluster.dir))[0] == 0
    code, out, _ = run(capsys, "sim", "heal", str(cluster.dir))
    assert (code, out) == (0, "healed: pve1: wrong-answer, pve2: node-unreachable, pve3: wrong-answer\n")
    assert run(capsys, "sim", "heal", str(cluster.dir))[1] == "nothing to heal\n"


# --- init --sim <cluster dir> --------------------------------------------------------------------


def test_init_on_a_cluster_writes_every_node_and_cluster_plan_takes_it(cluster, tmp_path):
    spec = spec_of(cluster, tmp_path)
    doc = yaml.safe_load(spec.read_text())
    assert [(n["name"], n["containers"][0]["vmid"]) for n in doc["nodes"]] == [
        ("pve1", 101),
        ("pve2", 102),
        ("pve3", 103),
    ]
    assert all(n["containers"][0]["service"]["unit"] == "sglang.service" for n in doc["nodes"])
    assert {n["vms"]["mappings"][0]["name"] for n in doc["nodes"]} == {"pro6000-vm"}
    plan = cli("cluster", "plan", "--sim", str(cluster.dir), "--spec", str(spec))
    assert plan.returncode == 0, plan.stderr
    assert [ln for ln in plan.stdout.splitlines() if ln.startswith("Node ")] == [
        "Node pve1",
        "Node pve2",
        "Node pve3",
    ]

    one = cli("init", "--sim", str(cluster.dir), "--node", "pve2")
    assert one.returncode == 0, one.stderr
    nodes = yaml.safe_load(one.stdout)["nodes"]
    assert [(n["name"], n["containers"][0]["vmid"]) for n in nodes] == [("pve2", 102)]


def test_init_on_a_cluster_refuses_what_names_one_node_without_node(capsys, cluster, tmp_path):
    out = tmp_path / "spec.yaml"
    for argv, words in (
        (["--vm", "202"], "--vm names one node's VM: give --node with it on a simulated cluster"),
        (["--node", "pve7"], "no node pve7 (have pve1, pve2, pve3)"),
    ):
        code, _, err = run(capsys, "init", "--sim", str(cluster.dir), *argv, "-o", str(out))
        assert code == 2 and one_line(err).endswith(words), err
    assert not out.exists()


# --- docs/clusters.md's "trying a cluster", as written ----------------------------------------


def _readme_console() -> str:
    text = CLUSTERS.read_text()
    section = text[text.index("## trying a cluster\n") :]
    m = re.search(r"```\n(\$ gputopo sim create --nodes 3 .*?)```", section, re.S)
    assert m, "no console block in docs/clusters.md's 'trying a cluster'"
    return m[1]


def _ports_hidden(text: str) -> str:
    return re.sub(r" port \d+", " port N", text)


def test_the_readme_cluster_walkthrough_runs_as_written(tmp_path):
    require_sshd()
    steps: list[tuple[str, list[str]]] = []
    for line in _readme_console().replace("/tmp/cluster", str(tmp_path / "cluster")).splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        else:
            steps[-1][1].append(line)
    served = None
    try:
        for command, shown in steps:
            words = shlex.split(command.split(" | tail -")[0], comments=True)
            assert words[0] == "gputopo", command
            if words[-1] == "&":
                assert words[1:3] == ["sim", "cluster-ssh"] and not shown
                served = Served(Path(words[3]))
                continue
            p = cli(*words[1:], cwd=tmp_path)
            tail = int(command.split(" | tail -")[1].split()[0]) if " | tail -" in command else 0
            if shown and shown[0].startswith("gputopo: error: "):
                assert p.returncode == 2, (command, p.stderr)
                assert _ports_hidden(p.stderr).splitlines() == _ports_hidden("\n".join(shown)).splitlines()
                continue
            assert p.returncode == 0, (command, p.stdout[-2000:], p.stderr)
            if shown:
                assert p.stdout.splitlines()[-tail if tail else 0 :] == shown, (command, p.stdout)
    finally:
        if served is not None:
            assert served.stop()[0] == 0
    assert served is not None, "the walkthrough starts no sim cluster-ssh"
