"""A cluster node read in one round trip (``gputopo cluster node-read``): the document a node
prints, the reads it is sent, the version refusal, and the state the cluster side makes of it,
which must be the state the node's own reads give."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
import time

import pytest

import gputopo
from gputopo.adapters.hostfiles import RealHostFiles
from gputopo.adapters.pvefiles import PveFiles
from gputopo.adapters.ssh import RecordedExec, RecordedFiles, SshRunner
from gputopo.cluster.gather import read_cluster
from gputopo.cluster.noderead import (
    COMMAND,
    NodeReads,
    node_facts,
    parse_node_read,
    parse_reads,
    read_node,
    reads_document,
    remote_read,
)
from gputopo.errors import NodeUnreachable, RemoteCommandFailed, SpecError, VersionMismatch
from gputopo.facts.observe import observe
from gputopo.model.documents import NodeReadDoc
from gputopo.model.reads import ContainerRead, Reads, ServiceRead
from gputopo.plan.reads import reads_of, spec_reads
from gputopo.plan.render import MODPROBE_PATH
from gputopo.plan.spec import parse_spec
from gputopo.ports import ExecResult
from gputopo.sim.container import SimExec
from helpers.applysim import copy_host, seed_spec, template  # noqa: F401 (fixtures)

MODPROBE = "softdep nvidia pre: vfio-pci\n"


@pytest.fixture
def host(template, tmp_path):
    h = copy_host(template, tmp_path / "sim")
    # a persistence file that exists (the others do not), so both answers are recorded
    path = h.paths.root / MODPROBE_PATH
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(MODPROBE)
    return h


class NoLiveReads:
    """The live port behind the recorded ones: any read reaching it fails the test."""

    def __getattr__(self, name):
        raise AssertionError(f"read live: {name}")


def node_document(host) -> dict:
    spec = seed_spec(host)
    root = str(host.paths.root)
    return read_node(node_facts(root), reads_of(spec.nodes[0]), SimExec(host.dir), RealHostFiles(root))


# --- the reads sent to a node --------------------------------------------------------------------


def test_the_reads_a_node_is_sent_come_back_the_same():
    reads = Reads(
        containers=(
            ContainerRead(101, ServiceRead("sglang.service", "/etc/x.d/gputopo.conf")),
            ContainerRead(7),
        ),
        files=("etc/a", "etc/b"),
    )
    assert parse_reads(json.dumps(reads_document(reads)), "stdin") == reads


@pytest.mark.parametrize(
    ("data", "culprit"),
    [
        (
            {"containers": [], "files": [], "vms": []},
            "stdin: expected an object with exactly containers, files",
        ),
        ({"containers": [{"vmid": "101", "service": None}], "files": []}, "containers[0].vmid"),
        ({"containers": [{"vmid": 1, "service": {"unit": ""}}], "files": []}, "containers[0].service"),
        ({"containers": [], "files": "etc/a"}, "files"),
    ],
)
def test_a_bad_reads_document_is_refused_naming_the_key(data, culprit):
    with pytest.raises(SpecError) as e:
        parse_reads(json.dumps(data), "stdin")
    assert culprit in str(e.value) and "\n" not in str(e.value)


# --- the document a node prints ------------------------------------------------------------------


def test_the_document_holds_the_version_facts_service_reads_and_files(host):
    doc = NodeReadDoc.model_validate(json.loads(json.dumps(node_document(host))))
    assert doc.schema_version == 1 and doc.gputopo_version == gputopo.__version__
    assert doc.facts["host"]["hostname"] == host.node and len(doc.facts["gpus"]) == 8
    assert [(r.vmid, r.argv[0]) for r in doc.exec] == [(101, "systemctl"), (101, "cat")]
    assert "ActiveState=active" in doc.exec[0].stdout and doc.exec[1].rc == 1  # no drop-in yet
    assert doc.files[MODPROBE_PATH] == MODPROBE
    assert {p: t for p, t in doc.files.items() if p != MODPROBE_PATH} == {
        "etc/udev/rules.d/90-gputopo-vfio.rules": None,
        "etc/modules-load.d/gputopo-vfio.conf": None,
    }


def test_the_recorded_reads_give_the_state_the_node_reads_in_place(host):
    """observe() on the node's answers, with nothing read live, equals observe() on the node."""
    spec = seed_spec(host)
    root = str(host.paths.root)
    pve = PveFiles(host.paths.pve, host.node)
    got = parse_node_read(host.node, json.dumps(node_document(host)))
    remote = observe(
        got.facts,
        spec_reads(spec),
        proxmox=pve,
        exec=RecordedExec(got.exec, NoLiveReads()),
        files=RecordedFiles(got.files, NoLiveReads()),
    )
    local = observe(root, spec_reads(spec), proxmox=pve, exec=SimExec(host.dir), files=RealHostFiles(root))
    assert remote.facts.model_dump() == local.facts.model_dump()
    assert remote.current == local.current
    assert remote.current.containers[101].service.active and remote.current.files[MODPROBE_PATH] == MODPROBE


def test_a_read_the_node_could_not_make_is_made_again_live():
    class Live:
        def __init__(self):
            self.asked = []

        def run(self, vmid, argv, timeout, input=None):
            self.asked.append((vmid, argv))
            return ExecResult(0, "live", "")

        def read(self, path):
            self.asked.append(path)
            return "live"

    live = Live()
    recorded = RecordedExec({(101, ("cat", "/a")): ExecResult(1, "", "no")}, live)
    assert recorded.run(101, ["cat", "/a"], 5).stderr == "no"
    assert recorded.run(101, ["cat", "/b"], 5).stdout == "live"
    files = RecordedFiles({"etc/a": None}, live)
    assert files.read("etc/a") is None and files.read("etc/b") == "live"
    assert live.asked == [(101, ["cat", "/b"]), "etc/b"]


@pytest.mark.slow  # a gputopo process
def test_the_command_prints_the_document(host, tmp_path):
    reads = tmp_path / "reads.json"
    reads.write_text(json.dumps(reads_document(reads_of(seed_spec(host).nodes[0]))))
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "gputopo",
            "cluster",
            "node-read",
            "--sim",
            str(host.dir),
            "--reads",
            str(reads),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    got = parse_node_read(host.node, res.stdout)
    assert got.facts.host.hostname == host.node and got.files[MODPROBE_PATH] == MODPROBE
    assert sorted(argv[0] for _, argv in got.exec) == ["cat", "systemctl"]


@pytest.mark.slow  # a gputopo process
def test_the_command_refuses_bad_reads_in_one_line(host, tmp_path):
    reads = tmp_path / "reads.json"
    reads.write_text('{"containers": [], "files": [], "extra": 1}')
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "gputopo",
            "cluster",
            "node-read",
            "--sim",
            str(host.dir),
            "--reads",
            str(reads),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr == f"gputopo: error: {reads}: expected an object with exactly containers, files\n"


# --- the cluster side: version, model ------------------------------------------------------------


def test_another_version_is_refused_with_both_before_the_model(host):
    doc = node_document(host)
    doc["gputopo_version"] = "0.0.9"
    doc["facts"] = {"another": "shape"}  # what another version prints is not this one's model
    with pytest.raises(VersionMismatch) as e:
        parse_node_read("pve2", json.dumps(doc))
    assert str(e.value) == (
        f"node pve2 runs gputopo 0.0.9, this is gputopo {gputopo.__version__}: install gputopo "
        f"{gputopo.__version__} on every node first; nothing was changed"
    )


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda d: d.update(extra=1), "not a node-read document (1 errors)"),
        (lambda d: d.pop("gputopo_version"), "not a node-read document (no gputopo_version)"),
        (lambda d: d["exec"].append({"vmid": 101, "argv": ["x"]}), "not a node-read document (3 errors)"),
        (lambda d: d["facts"].update(gpus="none"), "not a node-read document"),
    ],
)
def test_a_document_that_is_not_the_model_is_refused(host, change, reason):
    doc = node_document(host)
    change(doc)
    with pytest.raises(RemoteCommandFailed) as e:
        parse_node_read("pve1", json.dumps(doc))
    assert str(e.value).startswith(f"node pve1: gputopo cluster node-read exited 0: {reason}")


class Shell:
    """A node shell answering from a table: argv (joined) -> ExecResult."""

    def __init__(self, answers):
        self.answers = answers
        self.ran = []

    def run(self, node, argv, timeout, input=None):
        self.ran.append(" ".join(argv))
        return self.answers[" ".join(argv)]


SPEC = parse_spec(
    "apiVersion: gputopo/v1\nkind: GpuTopology\nnodes:\n  - name: pve1\n    containers:\n"
    "      - vmid: 101\n        gpus: {count: 8}\n"
)


def test_a_node_whose_gputopo_has_no_node_read_is_refused_naming_its_version():
    no_such = ExecResult(2, "", "gputopo: error: cluster: No such command 'node-read'.\n")
    shell = Shell(
        {" ".join(COMMAND): no_such, "gputopo --version": ExecResult(0, "gputopo, version 0.0.8\n", "")}
    )
    with pytest.raises(VersionMismatch, match="node pve1 runs gputopo 0.0.8"):
        remote_read(shell, "pve1", SPEC, 10)
    same = ExecResult(0, f"gputopo, version {gputopo.__version__}\n", "")
    shell = Shell(
        {
            " ".join(COMMAND): ExecResult(2, "", "gputopo: error: /: not a host root\n"),
            "gputopo --version": same,
        }
    )
    with pytest.raises(RemoteCommandFailed) as e:
        remote_read(shell, "pve1", SPEC, 10)
    assert str(e.value) == "node pve1: gputopo cluster node-read exited 2: /: not a host root"


def test_each_node_is_reached_once(host):
    """One round trip per node: the shell is asked once, and nothing else is read live."""
    text = json.dumps(node_document(host))
    shell = Shell({" ".join(COMMAND): ExecResult(0, text, "")})
    spec = seed_spec(host)
    got = read_cluster(spec, [host.node], shell, PveFiles(host.paths.pve, host.node), ha=False)
    assert shell.ran == [" ".join(COMMAND)]
    assert got[host.node].current.containers[101].service.active


# --- ssh: a read begun early, ended when its answer is no longer wanted --------------------------


def test_reads_still_running_end_when_something_else_failed(tmp_path):
    slow = tmp_path / "ssh"
    slow.write_text("#!/bin/sh\nexec sleep 30\n")
    slow.chmod(slow.stat().st_mode | stat.S_IEXEC)
    runner = SshRunner(binary=str(slow))
    started = time.monotonic()
    pending = NodeReads(SPEC, ["pve1"], runner, timeout=60)
    while not runner._running and time.monotonic() - started < 10:
        time.sleep(0.01)
    pending.close(abort=True)
    assert time.monotonic() - started < 10
    with pytest.raises(NodeUnreachable, match="node pve1: .*left unanswered .*another node failed first"):
        pending.get("pve1")
    assert not runner._running


def test_an_answer_is_read_after_the_input_is_sent(tmp_path):
    echo = tmp_path / "ssh"
    echo.write_text("#!/bin/sh\nexec cat\n")  # prints what it is sent
    echo.chmod(echo.stat().st_mode | stat.S_IEXEC)
    runner = SshRunner(binary=str(echo))
    call = runner.start("pve1", ["true"])  # begun before what it is sent is known
    assert call.result(10, "sent later") == ExecResult(0, "sent later", "")
    assert not runner._running


@pytest.mark.slow  # a gputopo process
def test_the_node_reads_its_served_models_footprint_as_a_host_reads_in_place(host, tmp_path):
    """The footprint travels in the node's document: the cluster side plans the capacity line
    from what the node read in its container's root, the same footprint a read in place gives."""
    from gputopo import resources
    from gputopo.adapters.ctfiles import RootContainerFiles
    from gputopo.cluster.gather import footprints_of
    from gputopo.facts.footprint import read_footprint
    from helpers.modelgen import write_model

    config = json.loads((resources.fixtures_dir() / "real/models/Qwen3-8B/config.json").read_text())
    write_model(host.paths.rootfs(101) / "models/Qwen3-235B-A22B-FP8", config, shards=2)
    reads = tmp_path / "reads.json"
    reads.write_text(json.dumps(reads_document(reads_of(seed_spec(host).nodes[0]))))
    argv = [
        sys.executable,
        "-m",
        "gputopo",
        "cluster",
        "node-read",
        "--sim",
        str(host.dir),
        "--reads",
        str(reads),
    ]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    got = parse_node_read(host.node, res.stdout)
    spec = seed_spec(host)
    remote = observe(
        got.facts,
        spec_reads(spec),
        proxmox=PveFiles(host.paths.pve, host.node),
        exec=RecordedExec(got.exec, NoLiveReads()),
        files=RecordedFiles(got.files, NoLiveReads()),
    ).current
    footprints_of(remote, got.footprints or {})
    command = remote.containers[101].service.exec_start
    local, why = read_footprint(
        RootContainerFiles(lambda v: str(host.paths.rootfs(v))), SimExec(host.dir), 101, command
    )
    assert why is None and remote.containers[101].footprint == local
    assert local.weights.files == 2 and local.attention.kv_heads == 8
