"""A served model's footprint read from its files in a container: through the container's root
and through pct exec (real ``sh``, ``od``, ``tail`` and ``head`` run here on a model directory
written by tests/helpers/modelgen.py from a real config.json)."""

from __future__ import annotations

import json
import subprocess

from gputopo import resources
from gputopo.adapters.ctfiles import RootContainerFiles
from gputopo.facts.ctread import ExecContainerFiles
from gputopo.facts.footprint import read_footprint, read_footprints
from gputopo.model.state import ContainerState, CurrentState, ServiceState
from gputopo.ports import ExecResult
from helpers.modelgen import write_model

CMD = "python -m sglang.launch_server --model-path /models/q --tp 2 --kv-cache-dtype fp8_e5m2"


class HostShell:
    """An ExecPort that runs the argv here with the container's paths under ``root``; nvidia-smi
    answers the seed GPU's memory."""

    def __init__(self, root):
        self.root = str(root)
        self.calls: list[list[str]] = []

    def run(self, vmid, argv, timeout, input=None):
        self.calls.append(argv)
        if argv[0] == "nvidia-smi":
            return ExecResult(0, "97887\n97887\n")
        argv = [a.replace("/models/", self.root + "/models/") for a in argv]
        cp = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        return ExecResult(cp.returncode, cp.stdout, cp.stderr)


def _model(tmp_path):
    config = json.loads((resources.fixtures_dir() / "real/models/Qwen3-8B/config.json").read_text())
    return write_model(tmp_path / "models/q", config, shards=2)


def test_read_through_the_root_and_through_exec_agree(tmp_path):
    total = _model(tmp_path)
    shell = HostShell(tmp_path)
    by_root, why = read_footprint(RootContainerFiles(lambda v: str(tmp_path)), shell, 101, CMD)
    assert why is None and by_root.weights.total == total and by_root.weights.files == 2
    assert (by_root.gpu_memory_mib, by_root.kv_cache_dtype, by_root.name) == (97887, "fp8_e5m2", "q")
    by_exec, why = read_footprint(ExecContainerFiles(shell), shell, 101, CMD)
    assert why is None and by_exec == by_root
    assert any(c[:2] == ["sh", "-c"] and "od -An" in c[2] for c in shell.calls)


def test_what_cannot_be_read_is_one_line(tmp_path):
    shell = HostShell(tmp_path)
    files = ExecContainerFiles(shell)
    _, why = read_footprint(files, shell, 101, CMD)
    assert why == "no /models/q/config.json in the container"
    _, why = read_footprint(files, shell, 101, "vllm serve Qwen/Qwen3-8B")
    assert why == "Qwen/Qwen3-8B is a hub id, not a directory (its files are in the hub cache)"
    current = CurrentState(
        containers={
            101: ContainerState(status="running", service=None, service_error="no pct on this machine"),
            102: ContainerState(status="running", service=ServiceState(unit="s", exec_start=CMD)),
        }
    )
    read_footprints(current, None, shell)
    assert (
        current.containers[101].footprint_unread
        == "the container cannot be looked into here: no pct on this machine"
    )
    assert current.containers[102].footprint_unread == "no /models/q/config.json in the container"
