"""The number of steps is the same in ``plan``, ``apply`` (its ``[N/N]`` progress and its
document) and ``history`` (STEPS): on a cluster node whose VM is HA-managed the plan holds an
HA placement step, and ``--no-ha`` leaves it out of ``plan`` as it does of ``apply``."""

from __future__ import annotations

import json
import re

import pytest

from helpers.cli import run

pytestmark = pytest.mark.slow  # a simulated two-node cluster, planned and applied

SPLIT = """\
apiVersion: gputopo/v1
kind: GpuTopology
nodes:
  - name: pve1
    containers:
      - vmid: 101
        gpus: {numa: [0]}
        service: {unit: sglang.service, tp_flag: "--tp"}
    vms:
      mappings:
        - name: pro6000-vm
          gpus: {numa: [1]}
      consumers:
        - {vmid: 201, mapping: pro6000-vm, when_gpus_leave: remove}
"""


def _steps_planned(capsys, node, spec, *more: str) -> int:
    code, out, err = run(capsys, "plan", "--sim", node, "--spec", spec, "--json", *more)
    assert code == 0, err
    return len(json.loads(out)["actions"])


@pytest.mark.parametrize("no_ha", [False, True])
def test_plan_apply_and_history_count_the_same_steps(capsys, tmp_path, no_ha):
    more = ["--no-ha"] if no_ha else []
    code, out, err = run(capsys, "sim", "create", str(tmp_path / "c"), "--nodes", "2", "--ha", "vm:201")
    assert code == 0, out + err
    node = str(tmp_path / "c" / "nodes" / "pve1")
    spec = tmp_path / "split.yaml"
    spec.write_text(SPLIT)
    planned = _steps_planned(capsys, node, str(spec), *more)
    with_ha = _steps_planned(capsys, node, str(spec))
    assert planned == with_ha - (1 if no_ha else 0)  # the HA placement step
    code, out, err = run(
        capsys, "apply", "--sim", node, "--spec", str(spec), "--yes", "--no-verify", "--json", *more
    )
    assert code == 0, err
    progress = {m for m in re.findall(r"^\[ *\d+/(\d+)\]", err, re.M)}
    assert progress == {str(planned)}, err
    assert len(json.loads(out)["steps"]) == planned
    code, out, err = run(capsys, "history", "--sim", node, "--json")
    assert code == 0, err
    last = json.loads(out)["applies"][-1]
    assert (last["steps_done"], last["steps_total"]) == (planned, planned)
