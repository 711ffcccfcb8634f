"""Capacity before the outage, on the simulated seed host: a split that leaves the served model too
few GPUs is refused before any step runs, and the split to four plans with the capacity line.

Real figures: the seed host's GPUs (8 x RTX PRO 6000, 97,887 MiB each: fixtures/real/
seed-query-gpu.csv) and Qwen3-235B-A22B's config.json (fixtures/real/models/Qwen3-235B-A22B,
SOURCES.md), 235 B parameters (its model card). Derived: the FP8 checkpoint's headers
(tests/helpers/modelgen.py, block-quantized as Qwen's -FP8 release is), written as sparse files
into the container's root where the service's --model-path points.
"""

from __future__ import annotations

import json
import shutil

import pytest

from gputopo import resources
from helpers import promtool
from helpers.applysim import copy_host, fingerprint, seed_spec_text, template  # noqa: F401 (fixtures)
from helpers.cli import run
from helpers.modelgen import write_model

pytestmark = pytest.mark.slow  # a simulated host per test (seconds each)

MODEL = "/models/Qwen3-235B-A22B-FP8"
TWO = "addresses: [0000:01:00.0, 0000:11:00.0]"


@pytest.fixture
def sim(template, tmp_path):
    h = copy_host(template, tmp_path / "sim")
    config = json.loads((resources.fixtures_dir() / "real/models/Qwen3-235B-A22B/config.json").read_text())
    write_model(h.paths.rootfs(101) / MODEL.lstrip("/"), config, shards=8, fp8=True)
    yield h
    h.stop()


def test_two_gpus_are_refused_before_anything_stops(capsys, sim):
    spec = sim.dir / "two.yaml"
    spec.write_text(seed_spec_text(sim).replace("numa: [0]", TWO, 1))
    before = fingerprint(sim)
    code, out, err = run(capsys, "apply", "--spec", str(spec), "--sim", str(sim.dir), "--yes")
    assert code == 2, err
    assert "refused: container 101: qwen3 does not fit 2 GPU(s): weights 110." in err
    assert "it needs at least 4 GPUs" in err
    assert fingerprint(sim) == before  # nothing stopped, nothing moved


def test_the_split_to_four_plans_with_the_capacity_line(capsys, sim):
    spec = sim.dir / "s.yaml"
    spec.write_text(seed_spec_text(sim))
    code, out, err = run(capsys, "plan", "--sim", str(sim.dir), "--spec", str(spec))
    assert code == 0, err
    line = next(s for s in out.splitlines() if "qwen3 at tp 4" in s)
    # 235 B parameters in FP8 (1 byte each, plus the block scales) over 4 GPUs: about 55 GiB each
    assert "weights 55.1 GiB per GPU of 95.6" in line and "tokens at bf16" in line
    code, out, _ = run(capsys, "plan", "--sim", str(sim.dir), "--spec", str(spec), "--json")
    cap = json.loads(out)["capacity"][0]
    assert cap["tp"] == 4 and cap["fits"] is True and cap["engine"] == "sglang"
    assert 235e9 / 4 / 2**30 < cap["weights_gib"] < 235e9 * 1.02 / 4 / 2**30


def test_without_the_model_directory_the_plan_says_why(capsys, template, tmp_path):
    h = copy_host(template, tmp_path / "bare")
    shutil.rmtree(h.paths.rootfs(101) / MODEL.lstrip("/"))  # the simulated container's model, gone
    try:
        spec = h.dir / "s.yaml"
        spec.write_text(seed_spec_text(h))
        code, out, err = run(capsys, "plan", "--sim", str(h.dir), "--spec", str(spec))
        assert code == 0, err
        assert (
            f"container 101: capacity not checked: the model's footprint could not be read "
            f"(no {MODEL}/config.json in the container)" in out
        )
    finally:
        h.stop()


def test_verify_after_apply_puts_the_estimate_beside_what_runs(capsys, sim):
    spec = sim.dir / "s.yaml"
    spec.write_text(seed_spec_text(sim))
    code, _, err = run(capsys, "apply", "--spec", str(spec), "--sim", str(sim.dir), "--yes", "--no-verify")
    assert code == 0, err
    code, out, err = run(capsys, "verify", "--spec", str(spec), "--sim", str(sim.dir), "--json")
    doc = json.loads(out)
    cap = next(c for c in doc["checks"] if c["name"] == "capacity")
    d = cap["details"]["101"]
    # predicted: the plan's estimate at tp 4; reported: nvidia-smi's used MiB and the service's KV pool
    assert d["tp"] == 4 and round(d["predicted_weights_gib"], 1) == 55.1
    assert d["reported_used_mib"] > 0 and d["used_diff_pct"] == round(
        (d["reported_used_mib"] - d["predicted_used_mib"]) / d["predicted_used_mib"] * 100, 1
    )
    assert d["reported_kv_tokens"] is not None and d["kv_diff_pct"] is not None
    assert "CT 101: qwen3 at tp 4, weights 55.1 GiB per GPU, used " in cap["summary"]
    code, text, _ = run(capsys, "verify", "--spec", str(spec), "--sim", str(sim.dir))
    assert "capacity" in text and "predicted" in text
    # the drift watch exports the same figures, in a form promtool accepts
    prom = sim.dir / "prom"
    prom.mkdir()
    code, _, err = run(
        capsys,
        "watch",
        "--spec",
        str(spec),
        "--sim",
        str(sim.dir),
        "--format",
        "prometheus",
        "--textfile-dir",
        str(prom),
    )
    assert code == 0, err
    metrics = (prom / "gputopo.prom").read_text()
    assert 'gputopo_check{check="capacity"} 1.0' in metrics
    assert 'gputopo_capacity_kv_tokens{model="qwen3",vmid="101"}' in metrics
    assert 'gputopo_capacity_memory_diff_ratio{model="qwen3",vmid="101"}' in metrics
    checked = promtool.check_metrics(metrics)
    assert checked.returncode == 0, checked.stdout + checked.stderr
