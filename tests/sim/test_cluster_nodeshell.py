"""A simulated cluster node's shell answers gputopo's node commands from the node itself (its
simulated root), never from the machine the simulator runs on: ``history``, ``show``,
``export`` and ``watch`` read the node's files; a command it does not run is refused in one
line. ``watch`` reads the node's ``/etc/gputopo/spec.yaml``, where the playbook leaves the
cluster's spec, and plans its own node's part of it."""

from __future__ import annotations

import pytest

from gputopo.watch.run import DEFAULT_SPEC
from helpers.cli import one_line
from helpers.clusterharness import cleanup, cluster, spec_text, template  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow  # a simulated cluster per test (seconds each); the full run only


def node_run(cluster, node: str, *argv: str):
    return cluster.shell().run(node, list(argv), timeout=120)


def test_history_reads_the_node_not_this_machine(cluster):
    res = node_run(cluster, "pve2", "gputopo", "history")
    assert res.rc == 0, res.stderr
    assert res.stdout.strip() == f"no apply recorded under {cluster.node_dir('pve2') / 'root'}"


@pytest.mark.parametrize(
    "argv, named",
    [
        (["gputopo", "fixtures", "list"], "gputopo fixtures"),
        (["gputopo", "cluster", "plan"], "gputopo cluster plan"),
        (["gputopo", "schema"], "gputopo schema"),
    ],
)
def test_a_command_the_node_does_not_run_is_refused_in_one_line(cluster, argv, named):
    res = node_run(cluster, "pve1", *argv)
    assert res.rc == 2 and res.stdout == ""
    line = one_line(res.stderr)
    assert line.startswith(f"gputopo: error: '{named}' does not run on a simulated node (it runs: ")
    assert "history" in line and "watch" in line


def test_export_and_show_use_the_nodes_paths(cluster):
    res = node_run(cluster, "pve3", "gputopo", "export", "-o", "/root/now.yaml")
    assert res.rc == 0, res.stderr
    assert "# gputopo export of pve3" in (cluster.node_dir("pve3") / "root/root/now.yaml").read_text()
    res = node_run(cluster, "pve3", "gputopo", "show", "/root/missing-plan.json")
    assert res.rc == 2
    assert str(cluster.node_dir("pve3") / "root/root/missing-plan.json") in res.stderr


def test_watch_reads_the_cluster_spec_at_the_default_path_and_plans_its_own_node(cluster):
    assert DEFAULT_SPEC == "/etc/gputopo/spec.yaml"
    text = spec_text(cluster, split=["pve1", "pve2"], whole=["pve3"])
    for node in cluster.nodes:
        spec = cluster.node_dir(node) / "root" / DEFAULT_SPEC.lstrip("/")
        spec.parent.mkdir(parents=True, exist_ok=True)
        spec.write_text(text)  # what the playbook leaves on every node: the whole cluster's spec
    split = node_run(cluster, "pve2", "gputopo", "watch")
    assert split.rc == 0, split.stderr
    head = split.stdout.splitlines()[0]
    assert "node pve2: drift in driver_bindings" in head, split.stdout
    assert "mappings: create PCI mapping pro6000-vm" in split.stdout
    assert "CT 102" in split.stdout and "CT 103" not in split.stdout
    whole = node_run(
        cluster, "pve3", "gputopo", "watch", "--format", "prometheus", "-o", "/root/gputopo.prom"
    )
    assert whole.rc == 0, whole.stderr
    metrics = (cluster.node_dir("pve3") / "root/root/gputopo.prom").read_text()
    assert "gputopo_watch_up 1" in metrics
    assert 'gputopo_drift{area="driver_bindings"} 0' in metrics
    assert 'gputopo_gpu_owner{address="0000:81:00.0",owner="container:103"} 1' in metrics
