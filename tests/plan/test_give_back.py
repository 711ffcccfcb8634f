"""The give-back after a split, planned on a simulated host as an operator runs it (the cluster's
in tests/cluster/test_cluster_give_back.py): a spec giving every GPU back to the containers that says nothing of the VM mapping
would leave the mapping listing the containers' GPUs while a VM names it, which verify fails;
the plan refuses it (exit 2, one line per node naming mapping, GPUs and the way out) and nothing
changes. The way out it names applies and verifies."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from gputopo.plan.spec import load_spec
from gputopo.usecases.apply import apply
from gputopo.usecases.verify import verify
from helpers import applysim
from helpers.applysim import (
    fingerprint,
    seed_spec,
    template,  # noqa: F401 (fixtures)
)
from helpers.cli import run

pytestmark = pytest.mark.slow  # applies on simulated hosts (seconds each); the full run only

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
# the way out the refusal names: the mapping listed with the GPUs it keeps, here none
NO_VM_GPUS = """\
    vms:
      mappings:
        - name: pro6000-vm
          gpus: {addresses: []}
"""


def refusal(node: str, ct: int, vm: int) -> str:
    return (
        f"mapping pro6000-vm would still list GPU(s) of {node} that a container gets (0000:81:00.0, "
        f"0000:91:00.0, 0000:e1:00.0, 0000:f1:00.0 to container {ct}) while VM {vm} (hostpci0, stopped) uses "
        f"it: verify fails on it, as Proxmox could give the VM one of them at its start; list it under "
        f"vms.mappings of {node} with the GPUs it keeps (gpus: {{addresses: []}} for none), or remove the mapping"
    )


@pytest.fixture
def host(template):
    base = Path(tempfile.mkdtemp(prefix="gputopo-giveback-", dir=applysim.fast_tmp()))
    h = applysim.copy_host(template, base / "sim")
    yield h
    h.stop()
    applysim.cleanup(base)


def test_a_single_node_give_back_that_verify_would_fail_is_refused_and_changes_nothing(host, capsys):
    res = apply(seed_spec(host), host.ports(), root=str(host.paths.root), timeouts=applysim.FAST_TIMEOUTS)
    assert res.status == "applied"
    spec = host.dir / "back.yaml"
    spec.write_text(GIVE_BACK.format(nodes=NODE.format(name="pve1", ct=101)))
    before = fingerprint(host)
    for argv in (["plan"], ["apply", "--yes"]):
        code, out, err = run(capsys, *argv, "--sim", str(host.dir), "--spec", str(spec))
        assert code == 2, (argv, out, err)
        assert err.strip() == f"gputopo: error: refused: {refusal('pve1', 101, 201)}", argv
    assert applysim.diff(before, fingerprint(host)) == []
    # the way out: applied, and verify passes on what it leaves
    spec.write_text(GIVE_BACK.format(nodes=NODE.format(name="pve1", ct=101) + NO_VM_GPUS))
    code, out, err = run(capsys, "apply", "--yes", "--no-verify", "--sim", str(host.dir), "--spec", str(spec))
    assert code == 0, out + err
    report = verify(load_spec(str(spec)), host.ports(), root=str(host.paths.root), only=["converged", "vm"])
    assert report.ok and report.check("vm").status in ("PASS", "WARN"), report.to_text()
