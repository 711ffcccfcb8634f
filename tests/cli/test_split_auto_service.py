"""Quick mode on a simulated host: ``--split auto`` keeps the service the container runs, as
``--split numa`` does. The service is found inside the container before the current state is
read, and the auto split, made again once that state is known, is made from the same source:
its stop is planned and the new tensor-parallel size is the container's 4 GPUs."""

from __future__ import annotations

import json

import pytest

from helpers.applysim import host, template  # noqa: F401 (fixtures)
from helpers.cli import run

pytestmark = pytest.mark.slow


def _plan(capsys, host, *args: str):
    code, out, err = run(capsys, "plan", "--sim", str(host.dir), "--container-mapping", "pro6000", *args)
    assert code == 0, err
    return out


def _service_steps(doc: dict) -> list[dict]:
    return [a for a in doc["actions"] if a.get("unit") == "sglang.service"]


def test_split_auto_keeps_the_containers_service_as_numa_does(host, capsys):
    docs = {}
    for split in ("numa", "auto"):
        docs[split] = json.loads(_plan(capsys, host, "--split", split, "--json"))
    numa, auto = docs["numa"], docs["auto"]
    steps = {s["kind"]: s for s in _service_steps(auto)}
    assert {"stop_service", "write_service_dropin", "start_service"} <= set(steps), auto["actions"]
    assert steps["write_service_dropin"]["tp"] == 4
    assert "--tp 4\n" in steps["write_service_dropin"]["content"]
    (ct,) = auto["containers"]
    assert len(ct["gpus"]) == 4
    assert auto["actions"] == numa["actions"]


def test_split_auto_commands_restart_the_service_with_tp_4(host, capsys):
    outs = {split: _plan(capsys, host, "--split", split, "--commands") for split in ("numa", "auto")}
    assert "sglang.service" in outs["auto"], outs["auto"]
    assert "--tp 4" in outs["auto"], outs["auto"]
    assert outs["auto"] == outs["numa"]
