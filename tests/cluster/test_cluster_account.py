"""The account a rolling apply ends with, on the failures an operator meets: a node whose
verification fails after it applied (its changes stay), a node whose sshd goes away after an
earlier node changed, and the connection lost while a node applies. Each ends with every
node's outcome in text and ``--json`` and an exit code that says whether anything changed; the
nodes are judged by what runs on them. The SSH tests reach each simulated node through a real
sshd on loopback and skip without one (unless GPUTOPO_REQUIRE_SSH=1)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest

from gputopo import exitcodes
from gputopo.apply.journal import list_journals
from gputopo.apply.lock import HostLock
from gputopo.cli.schema import schema_of
from gputopo.errors import LockHeld
from gputopo.formats.pcicfg import parse_pci_cfg
from gputopo.sim.container.faults import break_container
from helpers.applysim import diff as fp_diff
from helpers.applysim import fingerprint
from helpers.clusterharness import (  # noqa: F401 (fixtures)
    SshNodes,
    cluster,
    make_keys,
    require_sshd,
    spec_text,
    template,
)

pytestmark = pytest.mark.slow  # a simulated cluster per test, applies of seconds each


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    require_sshd()
    return make_keys(tmp_path_factory.mktemp("ssh"), ["pve1", "pve2", "pve3"])


@pytest.fixture
def ssh(cluster, keys, tmp_path):
    nodes = SshNodes(cluster, tmp_path, keys)
    yield nodes.start()
    nodes.stop()


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gputopo", *args], capture_output=True, text=True, timeout=900
    )


def node_fp(cluster, node: str) -> dict:
    """The node's fingerprint with only its own part of the shared /etc/pve."""
    fp = fingerprint(cluster.member(node), cluster.container(node))
    return {k: v for k, v in fp.items() if not k.startswith("pve:") or k.startswith(f"pve:nodes/{node}/")}


def vm_gpus(cluster, node: str) -> list[str]:
    """The addresses the VM mapping pro6000-vm lists for ``node``."""
    for m in parse_pci_cfg((cluster.dir / "pve/mapping/pci.cfg").read_text()):
        if m.id == "pro6000-vm":
            return [e.split("path=")[1].split(",")[0] for e in m.maps if f"node={node}," in e]
    return []


def account(stdout: str) -> dict[str, str]:
    """node -> outcome, from the account's lines."""
    block = stdout.split("Rollout account:\n", 1)[1]
    return {m[1]: m[2] for m in re.finditer(r"^  (pve\d)\s+(\S+)", block, re.M)}


def assert_runs_the_spec(cluster, node: str, spec: Path) -> None:
    """What runs on ``node`` is what the spec asks: its own verify and diff say so, and its VM
    GPUs are on vfio-pci."""
    d = str(cluster.node_dir(node))
    ver = cli("verify", "--sim", d, "--node", node, "--spec", str(spec))
    assert ver.returncode == 0, ver.stdout + ver.stderr
    diff = cli("diff", "--exit-code", "--sim", d, "--node", node, "--spec", str(spec))
    assert diff.returncode == 0, diff.stdout + diff.stderr
    fp = node_fp(cluster, node)
    gpus = vm_gpus(cluster, node)
    assert len(gpus) == 4 and all(fp[f"pci:{a}"][0] == "vfio-pci" for a in gpus), gpus


def wait_for_journal(root: Path, timeout: float = 120.0) -> None:
    """Until an apply under ``root`` has begun (its journal exists)."""
    deadline = time.monotonic() + timeout
    while not list_journals(root):
        assert time.monotonic() < deadline, f"no apply began under {root}"
        time.sleep(0.02)


def wait_unlocked(root: Path, timeout: float = 120.0) -> None:
    """Until no apply holds the lock under ``root``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            HostLock(root).check()
            return
        except LockHeld:
            assert time.monotonic() < deadline, f"an apply still holds the lock under {root}"
            time.sleep(0.1)


def children(pid: int) -> list[int]:
    """Every process under ``pid`` (its children, theirs, ...)."""
    by_parent: dict[int, list[int]] = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                ppid = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            by_parent.setdefault(ppid, []).append(int(p.name))
    out, todo = [], [pid]
    while todo:
        for c in by_parent.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_a_node_whose_verify_fails_after_applying_is_named_failed_verify_kept(cluster, tmp_path, as_json):
    """pve2's inference service answers the smoke test wrong: its apply does every step, then its
    verification fails; the changes stay (its own apply exits 1). The account says so, never
    'applied and kept: none'; pve3 is not started; exit 1."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(spec_text(cluster, split=["pve1", "pve2", "pve3"]))
    break_container(cluster.node_dir("pve2"), cluster.container("pve2"), "wrong_answer", answer="92")
    pve3 = node_fp(cluster, "pve3")
    res = cli(
        "cluster",
        "apply",
        "--yes",
        *(["--json"] if as_json else []),
        "--sim",
        str(cluster.dir),
        "--spec",
        str(spec),
    )
    assert res.returncode == 1, res.stderr
    (err,) = res.stderr.strip().splitlines()[-1:]
    assert err.startswith("gputopo: error: stopped at node pve2: applied, but its verification failed: ")
    assert "inference" in err and err.endswith("; applied and kept: pve1, pve2; not started: pve3")
    if as_json:
        doc = json.loads(res.stdout)
        jsonschema.validate(doc, schema_of("cluster-apply"))
        assert (doc["status"], doc["exit_code"], doc["changed"]) == ("stopped", 1, True)
        nodes = {n["node"]: n for n in doc["nodes"]}
        assert [n["node"] for n in doc["nodes"]] == ["pve1", "pve2", "pve3"]
        assert {k: n["outcome"] for k, n in nodes.items()} == {
            "pve1": "applied-and-kept",
            "pve2": "failed-verify-kept",
            "pve3": "not-started",
        }
        p2 = nodes["pve2"]
        assert p2["kept"] is True and p2["failed"] is True and p2["exit_code"] == 1
        assert p2["apply"]["status"] == "applied" and p2["apply"]["verify"]["ok"] is False
        assert p2["steps"] == len(p2["apply"]["steps"]) > 0
        assert nodes["pve3"]["kept"] is False and nodes["pve3"]["apply"] is None
        assert doc["error"] == err.removeprefix("gputopo: error: ")
    else:
        assert account(res.stdout) == {
            "pve1": "applied-and-kept",
            "pve2": "failed-verify-kept",
            "pve3": "not-started",
        }
        assert "next: its changes stay: 'gputopo verify' on pve2" in res.stdout
        assert (
            res.stdout.rstrip().splitlines()[-1].endswith("applied and kept: pve1, pve2; not started: pve3")
        )
    # what runs: pve2 kept its new state (its VM GPUs on vfio-pci, its history: applied), pve3 untouched
    fp2 = node_fp(cluster, "pve2")
    assert all(fp2[f"pci:{a}"][0] == "vfio-pci" for a in vm_gpus(cluster, "pve2"))
    hist = json.loads(cli("history", "--sim", str(cluster.node_dir("pve2")), "--json").stdout)
    assert [a["outcome"] for a in hist["applies"]] == ["applied"]
    assert fp_diff(pve3, node_fp(cluster, "pve3")) == []


def test_sshd_of_pve2_gone_after_pve1_changed_is_not_nothing_changed(cluster, ssh, tmp_path):
    """pve2's sshd stops while pve1 applies: pve1 stays applied (what runs there is the spec),
    pve2 and pve3 are not started, exit 1; nothing says 'nothing was changed'."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(spec_text(cluster, split=["pve1", "pve2", "pve3"]))
    before = {n: node_fp(cluster, n) for n in ("pve2", "pve3")}
    run = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gputopo",
            "cluster",
            "apply",
            "--yes",
            "--sim",
            str(cluster.dir),
            "--ssh-config",
            str(ssh.config),
            "--spec",
            str(spec),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_journal(cluster.member("pve1").paths.root)
        ssh.stop("pve2")  # pve1's session goes on: only the listener stops
        out, err = run.communicate(timeout=600)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == 1, err
    assert "nothing was changed" not in out + err
    assert account(out) == {"pve1": "applied-and-kept", "pve2": "not-started", "pve3": "not-started"}
    assert re.search(
        r"^  pve2\s+not-started\s+node pve2: unreachable over SSH: .*Connection refused", out, re.M
    )
    (line,) = err.strip().splitlines()[-1:]
    assert line.startswith("gputopo: error: stopped at node pve2: node pve2: unreachable over SSH: ")
    assert line.endswith("; applied and kept: pve1; not started: pve2, pve3")
    assert_runs_the_spec(cluster, "pve1", spec)
    for n in ("pve2", "pve3"):
        assert fp_diff(before[n], node_fp(cluster, n)) == [], n


def test_a_connection_lost_during_pve2s_apply_is_unknown_with_the_next_step(cluster, ssh, tmp_path):
    """pve2's SSH session dies while its apply runs: the rollout cannot know how that apply
    ended, says so and what to run there, exits 3; pve1 stays applied, pve3 is not started."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(spec_text(cluster, split=["pve1", "pve2", "pve3"]))
    pve3 = node_fp(cluster, "pve3")
    root2 = cluster.member("pve2").paths.root
    # pve2's service takes 3 s to start again: its apply is in its start phase when the link drops
    break_container(cluster.node_dir("pve2"), cluster.container("pve2"), "slow_start", seconds=3)
    run = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gputopo",
            "cluster",
            "apply",
            "--yes",
            "--json",
            "--sim",
            str(cluster.dir),
            "--ssh-config",
            str(ssh.config),
            "--spec",
            str(spec),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_journal(root2)
        time.sleep(1.0)
        # the session's sshd processes die (the connection drops); pve2's apply itself is left
        listener = ssh.procs["pve2"].pid
        sessions = [p for p in children(listener) if Path(f"/proc/{p}/exe").resolve().name == "sshd"]
        assert sessions
        for p in sessions:
            os.kill(p, signal.SIGKILL)
        out, err = run.communicate(timeout=600)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    wait_unlocked(root2)  # pve2's orphaned apply ends on its own
    assert run.returncode == 3, err
    doc = json.loads(out)
    jsonschema.validate(doc, schema_of("cluster-apply"))
    assert (doc["status"], doc["exit_code"], doc["changed"]) == ("stopped", 3, True)
    nodes = {n["node"]: n for n in doc["nodes"]}
    assert {k: n["outcome"] for k, n in nodes.items()} == {
        "pve1": "applied-and-kept",
        "pve2": "unknown",
        "pve3": "not-started",
    }
    p2 = nodes["pve2"]
    assert p2["kept"] is None and p2["exit_code"] is None and p2["apply"] is None
    assert p2["reason"].startswith("the connection was lost during its apply")
    assert "gputopo history" in p2["next_step"] and "gputopo recover" in p2["next_step"]
    (line,) = err.strip().splitlines()[-1:]
    assert line.startswith("gputopo: error: stopped at node pve2: the connection was lost during its apply")
    assert line.endswith(
        "; applied and kept: pve1; outcome unknown: pve2 (see its 'gputopo history'); not started: pve3"
    )
    # the apply did begin on pve2 (its history names it), so "unknown" and not "not started"
    hist = json.loads(cli("history", "--sim", str(cluster.node_dir("pve2")), "--json").stdout)
    assert len(hist["applies"]) == 1
    assert_runs_the_spec(cluster, "pve1", spec)
    assert fp_diff(pve3, node_fp(cluster, "pve3")) == []


def test_a_rollout_refused_before_any_node_says_so_in_its_document(cluster, tmp_path):
    """Refused before any node's apply (a spec naming a node outside the cluster): the document
    says refused, nothing changed, exit 2, with the one-line error."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(spec_text(cluster, split=["pve1"]) + "\n  - name: pve7\n")
    res = cli("cluster", "apply", "--yes", "--json", "--sim", str(cluster.dir), "--spec", str(spec))
    assert res.returncode == 2
    doc = json.loads(res.stdout)
    jsonschema.validate(doc, schema_of("cluster-apply"))
    assert (doc["status"], doc["exit_code"], doc["changed"]) == ("refused", 2, False)
    assert res.stderr.strip() == f"gputopo: error: {doc['error']}"
    assert doc["error"].startswith("unknown node 'pve7'")


@pytest.mark.parametrize(
    ("signum", "code", "said"),
    [
        (signal.SIGINT, 130, "Ctrl-C"),
        (signal.SIGTERM, 143, "SIGTERM"),  # systemd stopping the unit it runs in, a kill
        (signal.SIGHUP, 129, "SIGHUP"),  # the SSH session to the jump host dropped
    ],
    ids=["ctrl-c", "sigterm", "sighup"],
)
def test_a_signal_during_pve2s_apply_ends_with_the_account(cluster, tmp_path, signum, code, said):
    """Ctrl-C, SIGTERM or SIGHUP to the process group (the terminal's Ctrl-C, systemd's stop, a
    dropped session's hangup all reach the cluster apply and the ssh of pve2's apply under it)
    while pve2 applies: pve2 rolls itself back and says so, the rollout prints its account and
    exits 130, 143 or 129 (each in the cluster exit table); pve1 stays applied, pve3 is not
    started."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(spec_text(cluster, split=["pve1", "pve2", "pve3"]))
    before = {n: node_fp(cluster, n) for n in ("pve2", "pve3")}
    break_container(cluster.node_dir("pve2"), cluster.container("pve2"), "slow_start", seconds=3)
    run = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gputopo",
            "cluster",
            "apply",
            "--yes",
            "--sim",
            str(cluster.dir),
            "--spec",
            str(spec),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        wait_for_journal(cluster.member("pve2").paths.root)
        time.sleep(1.0)
        os.killpg(run.pid, signum)
        out, err = run.communicate(timeout=600)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == code, err
    assert code in exitcodes.COMMANDS["cluster"]
    assert account(out) == {
        "pve1": "applied-and-kept",
        "pve2": "applied-then-rolled-back",
        "pve3": "not-started",
    }
    assert out.rstrip().splitlines()[-1].startswith(f"interrupted ({said}) in ")
    (line,) = err.strip().splitlines()[-1:]
    assert line.startswith(f"gputopo: error: stopped at node pve2: interrupted ({said}) during its apply; ")
    assert line.endswith("; applied and kept: pve1; not started: pve3")
    assert_runs_the_spec(cluster, "pve1", spec)
    for n in ("pve2", "pve3"):
        assert fp_diff(before[n], node_fp(cluster, n)) == [], n
