"""An apply whose split leaves the served model too few GPUs: the simulated service fails to load
in the engine's words after the stop window, and apply rolls the host back to what ran before.

The seed container serves Qwen3-235B-A22B-FP8 (236 GB of FP8 weights, published: 235B parameters)
on every GPU; at tp 2 each 95.6 GiB RTX PRO 6000 would need 110 GiB of weights.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from gputopo.cli import cli
from gputopo.sim.container import SimExec
from helpers import applysim
from helpers.applysim import host, template  # noqa: F401 (fixtures)


@pytest.mark.slow
def test_a_split_too_small_for_the_model_fails_to_load_and_is_rolled_back(host):
    before = applysim.running_service(host.paths.root, 101, "sglang.service")
    assert before[0] is not None and before[0].endswith("--tp 8") and len(before[1]) == 10
    text = applysim.seed_spec_text(host)
    text = text.replace("numa: [0]", "addresses: [0000:01:00.0, 0000:11:00.0]", 1).replace(
        "numa: [1]", "rest", 1
    )
    spec = host.dir / "two-gpus.yaml"
    spec.write_text(text)
    # without its index gputopo cannot size the model (the plan says so and does not refuse);
    # the engine loads the shards it finds, as SGLang and vLLM glob *.safetensors
    index = host.paths.rootfs(101) / "models/Qwen3-235B-A22B-FP8/model.safetensors.index.json"
    index.unlink()
    res = CliRunner().invoke(
        cli, ["apply", "--spec", str(spec), "--sim", str(host.dir), "--yes", "--no-verify"]
    )
    assert res.exit_code == 1, res.output
    assert "capacity not checked: the model's footprint could not be read" in res.output, res.output
    assert "start sglang.service (after systemctl daemon-reload): FAILED" in res.output
    assert "rolling back" in res.output and "CT 101: started sglang.service" in res.output
    # what runs again: the old command line at tp 8 on the same GPU nodes
    assert applysim.running_service(host.paths.root, 101, "sglang.service") == before
    sx = SimExec(host.dir)
    used = sx.run(101, ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"], timeout=5)
    assert used.stdout.split() == ["79043", "78369", "78369", "78193"] * 2
    # the failed start at tp 2, in the engine's words, then the start at tp 8 that loaded
    journal = sx.run(101, ["journalctl", "-u", "sglang.service", "--no-pager"], timeout=5).stdout.splitlines()
    oom = [i for i, line in enumerate(journal) if "torch.OutOfMemoryError: CUDA out of memory." in line]
    assert (
        len(oom) == 1
        and "Tried to allocate 1.17 GiB. GPU 0 has a total capacity of 95.59 GiB" in journal[oom[0]]
    )
    assert journal[oom[0] + 2] == "sglang.service: Failed with result 'exit-code'."
    assert any("max_total_num_tokens=" in line for line in journal[oom[0] :])
