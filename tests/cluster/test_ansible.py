"""The Ansible collection, run by real ansible-core: the example playbook (serial 1, max fail 0)
with the gputopo.proxmox.topology module against a simulated cluster (local connection, each
host's commands on its simulated node). Check mode plans and changes nothing, --diff shows files
before and after, a run applies, a second run changes nothing, a failing node stops the rollout
with gputopo's one-line reason.

Skips without ansible-core (pip install 'gputopo[test]'), unless GPUTOPO_REQUIRE_ANSIBLE=1.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gputopo.sim.pveapi import PveApiServer
from helpers import REPO
from helpers.applysim import diff as fp_diff
from helpers.applysim import fingerprint
from helpers.clusterharness import cleanup, copy_cluster, make_template, spec_text

pytestmark = pytest.mark.slow  # ansible-core runs the playbook on a simulated cluster; the full run only

PLAYBOOK = REPO / "ansible_collections/gputopo/proxmox/playbooks/rolling_apply.yml"
PLUGINS = Path(__file__).resolve().parent / "ansible_plugins"


def ansible_playbook() -> str:
    exe = Path(sys.executable).parent / "ansible-playbook"
    found = str(exe) if exe.exists() else shutil.which("ansible-playbook")
    if found is None:
        if os.environ.get("GPUTOPO_REQUIRE_ANSIBLE") == "1":
            pytest.fail("GPUTOPO_REQUIRE_ANSIBLE=1 but ansible-playbook is not installed", pytrace=False)
        pytest.skip("ansible-core is not installed (pip install 'gputopo[test]')")
    return found


@pytest.fixture(scope="module")
def template():
    ansible_playbook()
    d = make_template()
    yield d
    cleanup(d.parent)


@pytest.fixture
def cluster(template, tmp_path):
    return copy_cluster(template, tmp_path / "cluster")


def play(cluster, tmp_path, spec: Path, *extra: str) -> tuple[int, dict]:
    """Run the example playbook; returns its exit status and the json callback's report."""
    inventory = {
        "proxmox_gpu_nodes": {
            "hosts": {
                n: {
                    "ansible_connection": "local",
                    "ansible_python_interpreter": sys.executable,
                    "gputopo_sim": str(cluster.node_dir(n)),
                    "gputopo_spec": str(spec),
                    "gputopo_verify": False,
                }
                for n in cluster.nodes
            }
        }
    }
    inv = tmp_path / "inventory.json"
    inv.write_text(json.dumps(inventory))
    record = tmp_path / "record.json"
    record.unlink(missing_ok=True)
    env = dict(
        os.environ,
        ANSIBLE_COLLECTIONS_PATH=str(REPO),
        ANSIBLE_CALLBACK_PLUGINS=str(PLUGINS),
        ANSIBLE_CALLBACKS_ENABLED="record",
        GPUTOPO_ANSIBLE_RECORD=str(record),
        ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-local"),
        ANSIBLE_REMOTE_TEMP=str(tmp_path / "ansible-remote"),
        ANSIBLE_NOCOLOR="1",
        PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
    )
    res = subprocess.run(
        [ansible_playbook(), "-i", str(inv), str(PLAYBOOK), *extra],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    if not record.exists():
        pytest.fail(
            f"ansible-playbook recorded nothing (exit {res.returncode}): {res.stdout[-2000:]} {res.stderr[-2000:]}"
        )
    return res.returncode, json.loads(record.read_text())


def module_results(report: dict) -> dict[str, dict]:
    """host -> the gputopo.proxmox.topology task's result (``status``: ok, failed or skipped)."""
    return {
        r["host"]: {**r["result"], "status_": r["status"]}
        for r in report["results"]
        if r["task"] == "Plan (check mode) or apply the spec on this node"
    }


def test_check_diff_apply_and_again(cluster, tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(spec_text(cluster, split=["pve1", "pve2"], whole=["pve3"]))
    before = {n: fingerprint(cluster.member(n), cluster.container(n)) for n in cluster.nodes}

    rc, report = play(cluster, tmp_path, spec, "--check", "--diff")
    assert rc == 0
    got = module_results(report)
    assert {n: r["changed"] for n, r in got.items()} == {"pve1": True, "pve2": True, "pve3": True}
    assert (
        "create PCI mapping pro6000-vm: 4 device(s) 0000:81:00.0, 0000:91:00.0, 0000:e1:00.0, 0000:f1:00.0"
        in got["pve1"]["actions"]
    )
    diffs = {d["after_header"]: d for d in got["pve1"]["diff"]}
    assert diffs["etc/modprobe.d/gputopo-vfio.conf"]["before"] == ""
    assert "vfio-pci" in diffs["etc/modprobe.d/gputopo-vfio.conf"]["after"]
    assert (
        "pro6000-vm" in diffs["pve/mapping/pci.cfg"]["after"]
        and "pro6000-vm" not in diffs["pve/mapping/pci.cfg"]["before"]
    )
    after_check = {n: fingerprint(cluster.member(n), cluster.container(n)) for n in cluster.nodes}
    assert {n: fp_diff(before[n], after_check[n]) for n in cluster.nodes} == {n: [] for n in cluster.nodes}

    rc, report = play(cluster, tmp_path, spec)
    assert rc == 0
    got = module_results(report)
    assert {n: (r["changed"], r["status"]) for n, r in got.items()} == {
        "pve1": (True, "applied"),
        "pve2": (True, "applied"),
        "pve3": (True, "applied"),
    }
    assert report["stats"]["pve1"]["changed"] == 1 and report["stats"]["pve1"]["failures"] == 0

    rc, report = play(cluster, tmp_path, spec)
    assert rc == 0
    assert {n: s["changed"] for n, s in report["stats"].items()} == {"pve1": 0, "pve2": 0, "pve3": 0}
    assert {n: r["status"] for n, r in module_results(report).items()} == {
        n: "no-changes" for n in cluster.nodes
    }


def test_a_failing_node_stops_the_rollout_with_its_reason(cluster, tmp_path):
    spec = tmp_path / "spec.yaml"
    # pve2's container stops for the move and will not start again (restart: the container's stop
    # and start are in the plan)
    spec.write_text(spec_text(cluster, split=["pve1", "pve2", "pve3"], restart=True))
    pve2 = cluster.member("pve2")
    PveApiServer(pve2.paths.pve, pve2.paths.run, pve2.paths.root, "pve2").inject_fault(
        "vzstart", 102, "startup for container '102' failed"
    )
    rc, report = play(cluster, tmp_path, spec)
    assert rc == 2
    got = module_results(report)
    assert sorted(got) == ["pve1", "pve2"]  # pve3 never ran
    assert got["pve1"]["changed"] is True
    failed = got["pve2"]
    assert failed["status_"] == "failed" and failed["rc"] == 1
    assert "\n" not in failed["msg"] and failed["msg"].startswith("apply failed at step ")
    assert "rolled back" in failed["msg"]
    assert report["stats"]["pve2"]["failures"] == 1 and "pve3" not in report["stats"]


def test_the_module_documents_itself_for_ansible_doc():
    doc = Path(ansible_playbook()).parent / "ansible-doc"
    res = subprocess.run(
        [str(doc) if doc.exists() else "ansible-doc", "--json", "gputopo.proxmox.topology"],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(REPO)),
    )
    assert res.returncode == 0, res.stderr
    info = json.loads(res.stdout)["gputopo.proxmox.topology"]["doc"]
    assert set(info["options"]) == {
        "spec",
        "spec_content",
        "node",
        "verify",
        "sim",
        "api_url",
        "sysfs_timeout",
        "executable",
    }
